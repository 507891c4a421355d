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
requirements:
  - systemd, when O(unit) is given
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
spec_acceptance:
  description: Acceptance measured over the probe, when O(min_spec_acceptance) is set.
  returned: when probed
  type: float
elapsed:
  description: Seconds spent in this call.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import poll_until
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative

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
)


def unit_state(module: AnsibleModule, unit: str) -> str:
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, _err = module.run_command([systemctl, "show", "-p", "ActiveState", "--value", "--", unit], environ_update={"LC_ALL": "C"})
    return out.strip() if rc == 0 else "unknown"


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        timeout = non_negative("timeout", params["timeout"])
        interval = non_negative("interval", params["interval"], minimum_exclusive=True)
    except InvalidInput as exc:
        module.fail_json(msg=exc.msg)
    engine = params["engine"]
    client = http.HttpClient(params["url"] or f"http://127.0.0.1:{http.DEFAULT_PORTS[engine]}", params["api_key"])
    started = time.monotonic()
    states = {}

    def probe() -> http.Readiness:
        if params["unit"]:
            states["unit"] = unit_state(module, params["unit"])
            if states["unit"] in ("failed", "inactive"):
                module.fail_json(msg=f"{params['unit']} is {states['unit']}: the engine exited while starting (journalctl -u {params['unit']})",
                                 ready=False, unit_state=states["unit"], elapsed=time.monotonic() - started)
        return http.check_ready(engine, client, params["model"], params["completion"])

    outcome = poll_until(probe, lambda readiness: readiness.ready, timeout, interval)
    result = dict(changed=False, ready=outcome.value.ready, checks=outcome.value.checks, waiting_for=outcome.value.waiting_for,
                  elapsed=time.monotonic() - started)
    if params["unit"]:
        result["unit_state"] = states.get("unit")
    if outcome.value.ready and params["min_spec_acceptance"] is not None:
        before = http.spec_counters(engine, client)
        for _request in range(max(1, params["probe_requests"])):
            client.request("POST", "/v1/completions", {"model": params["model"], "prompt": "Count to ten:", "max_tokens": 16})
        acceptance = http.spec_acceptance(engine, before, http.spec_counters(engine, client))
        result["spec_acceptance"] = acceptance
        if acceptance is None or acceptance < params["min_spec_acceptance"]:
            module.fail_json(msg=f"speculative decoding acceptance {acceptance if acceptance is not None else 'unavailable'} is below "
                                 f"min_spec_acceptance {params['min_spec_acceptance']}: the drafter slows this engine down", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
