#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import readiness
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
