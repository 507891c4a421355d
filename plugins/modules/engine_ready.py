#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_ready
short_description: Wait until a vLLM or SGLang server really serves, and optionally probe speculative decoding
version_added: 0.1.0
description:
  - Polls the engine on the node until it is ready or O(timeout) passes - vLLM C(/health), SGLang C(/health_generate),
    then the model listed by C(/v1/models), then a one-token C(/v1/completions).
  - Connection refused and 503 mean "still loading". A unit that is C(failed) or C(inactive) while waiting fails the
    task at once, so a crashed engine is not waited for until the deadline.
  - Not ready within O(timeout) returns RV(ready=false) without failing, so that a role can call it in an C(until) loop
    and show progress; the loop's retries bound the total wait.
  - With O(min_spec_acceptance), sends O(probe_requests) completions once ready and compares the speculative-decoding
    acceptance measured from the engine's own metrics with the floor (a drafter that is rarely accepted slows serving).
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; it only sends requests to the engine.
options:
  engine:
    description: Which engine answers at O(url).
    type: str
    required: true
    choices: [vllm, sglang]
  url:
    description: Base URL of the engine on the node. Default is V(http://127.0.0.1:8000) for vLLM and V(http://127.0.0.1:30000) for SGLang.
    type: str
  model:
    description: The served model name that C(/v1/models) must list.
    type: str
    required: true
  api_key:
    description: Bearer key for the guarded routes.
    type: str
  unit:
    description: The engine's systemd unit; when it is failed or inactive the task fails at once.
    type: str
  timeout:
    description: Seconds to wait in this call.
    type: float
    default: 30
  interval:
    description: Seconds between two attempts.
    type: float
    default: 2
  completion:
    description: Require a one-token completion to succeed.
    type: bool
    default: true
  min_spec_acceptance:
    description: Fail when the speculative-decoding acceptance over the probe is below this share (0-1). Not checked when unset.
    type: float
  probe_requests:
    description: Completions sent for the acceptance probe.
    type: int
    default: 8
  soak:
    description:
      - Once ready, keep watching the engine for this many seconds before the task succeeds, as Kubernetes'
        C(minReadySeconds) - an engine that crashes on its first real batches (a KV-cache or CUDA-graph OOM) fails here.
      - Every O(interval) readiness and a one-token completion must pass (two failing probes in a row fail the task);
        with O(unit), its C(InvocationID), C(MainPID) and C(NRestarts) must not move - a restart by systemd is a crash.
      - V(0) (the default) does not soak.
    type: float
    default: 0
requirements:
  - systemd, when O(unit) is given
notes:
  - The wait and the soak end (failed) at their next probe once the controller is gone (interrupted, or its SSH
    connection dropped) - nothing keeps polling a node for no one.
seealso:
  - module: gpufleet.serving.engine_drain
"""

EXAMPLES = r"""
---
- name: Wait up to 40 minutes for vLLM, 30 s per attempt so the play shows progress
  gpufleet.serving.engine_ready:
    engine: vllm
    model: llama70b
    unit: vllm.service
    timeout: 30
  register: ready
  until: ready.ready
  retries: 80
  delay: 0

- name: Check that the EAGLE-3 drafter is accepted often enough to pay off
  gpufleet.serving.engine_ready:
    engine: sglang
    model: llama70b
    min_spec_acceptance: 0.5
"""

RETURN = r"""
ready:
  description: Whether every check passed.
  returned: always
  type: bool
checks:
  description: The last answer of each check (health status, models listed, completion).
  returned: always
  type: dict
waiting_for:
  description: The first check that did not pass yet.
  returned: always
  type: str
unit_state:
  description: ActiveState of O(unit) at the last attempt.
  returned: when O(unit) is given
  type: str
soak:
  description: The soak's record - C(seconds) watched, C(probes) sent, C(passed).
  returned: when O(soak) is above 0 and the engine was ready
  type: dict
spec_acceptance:
  description: Acceptance measured over the probe, when O(min_spec_acceptance) is set.
  returned: when probed
  type: float
elapsed:
  description: Seconds spent in this call.
  returned: always
  type: float
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils import _readiness as readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed, Error
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import abandoning_clock
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import Systemctl

ARGUMENT_SPEC = dict(
    engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
    url=dict(type="str"),
    model=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    unit=dict(type="str"),
    timeout=dict(type="float", default=30),
    interval=dict(type="float", default=2),
    completion=dict(type="bool", default=True),
    min_spec_acceptance=dict(type="float"),
    probe_requests=dict(type="int", default=8),
    soak=dict(type="float", default=0),
)


def unit_state_reader(module: AnsibleModule):
    """The unit's state through the collection's one systemctl seam (Systemctl.unit_state)."""
    return Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)).unit_state


def unit_properties_reader(module: AnsibleModule):
    """The unit's properties (InvocationID, MainPID, NRestarts, ActiveState, SubState) through the same seam; {} when
    systemctl cannot say."""
    systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))

    def unit_properties(unit: str) -> dict:
        try:
            return systemctl.show(unit).properties
        except CommandFailed:
            return {}
    return unit_properties


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    clock = abandoning_clock(parent=os.getppid())  # the wait and the soak end with their controller
    try:
        request = readiness.ReadyRequest.from_params(module.params)
        client = http.HttpClient(request.url, request.api_key)
        systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if request.unit else None
        result = readiness.wait_ready(request, client, unit_state_reader(module) if request.unit else None,
                                      clock=clock, journal=systemctl.journal if systemctl else None)
        if result["ready"] and request.min_spec_acceptance is not None:
            result["spec_acceptance"] = readiness.check_acceptance(request, client, result)
        if result["ready"] and request.soak > 0:
            result["soak"] = readiness.soak(request, client, unit_properties_reader(module) if request.unit else None, clock)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
