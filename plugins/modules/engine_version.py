#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _versions as versions

ARGUMENT_SPEC = dict(
    engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
    executables=dict(type="list", elements="str", required=True),
    timeout=dict(type="float", default=30),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    relative = [path for path in params["executables"] if not os.path.isabs(path)]
    if relative:
        module.fail_json(msg=f"executables: give absolute paths, got {', '.join(relative)}")
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout: must be greater than 0, got {params['timeout']:g}")
    found, reasons = {}, {}
    for executable in dict.fromkeys(params["executables"]):
        found[executable], reason = versions.installed_version(params["engine"], executable, params["timeout"])
        if reason:
            reasons[executable] = reason
    module.exit_json(changed=False, versions=found, reasons=reasons)


if __name__ == "__main__":
    main()
