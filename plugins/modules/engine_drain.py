#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_drain
short_description: Wait until a vLLM or SGLang server has no running or queued request
version_added: 0.1.0
description:
  - Reads the engine's Prometheus metrics (vLLM C(vllm:num_requests_running) + C(vllm:num_requests_waiting), SGLang
    C(sglang:num_running_reqs) + C(sglang:num_queue_reqs)) until they add up to 0 or O(timeout) passes.
  - Stopping new work from reaching the engine (a load balancer, a router) is the caller's step before this one; this
    module waits for the work already accepted.
  - Passes when the engine does not answer at all (nothing can be running) and reports it; with O(fail_on_timeout=false)
    (the default) a deadline reached with requests still running is reported, not failed, since the teardown that follows
    is bounded anyway.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only.
options:
  engine:
    description: Which engine answers at O(url).
    type: str
    required: true
    choices: [vllm, sglang]
  url:
    description: Base URL of the engine on the node (default port 8000 for vLLM, 30000 for SGLang, on 127.0.0.1).
    type: str
  timeout:
    description: Seconds to wait for the running requests to reach 0.
    type: float
    default: 120
  interval:
    description: Seconds between two readings.
    type: float
    default: 1
  fail_on_timeout:
    description: Fail when requests still run at the deadline.
    type: bool
    default: false
seealso:
  - module: gpufleet.serving.engine_ready
  - module: gpufleet.serving.systemd_stop_hard
"""

EXAMPLES = r"""
---
- name: Let the running requests finish, for up to 2 minutes
  gpufleet.serving.engine_drain:
    engine: vllm
    timeout: 120
"""

RETURN = r"""
drained:
  description: Whether the running and queued requests reached 0 (or the engine does not answer).
  returned: always
  type: bool
running:
  description: Running plus queued requests at the last reading; null when the engine did not answer.
  returned: always
  type: float
answering:
  description: Whether the engine answered its metrics endpoint.
  returned: always
  type: bool
elapsed:
  description: Seconds waited.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils import _readiness as readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

ARGUMENT_SPEC = dict(
    engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
    url=dict(type="str"),
    timeout=dict(type="float", default=120),
    interval=dict(type="float", default=1),
    fail_on_timeout=dict(type="bool", default=False),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        request = readiness.DrainRequest.from_params(module.params)
        result = readiness.wait_drained(request, http.HttpClient(request.url, timeout=5))
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
