#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import prewarm
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

ARGUMENT_SPEC = dict(
    paths=dict(type="list", elements="str", required=True),
    timeout=dict(type="float", default=300),
    margin_mib=dict(type="int", default=8192),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = prewarm.warm(params["paths"], params["timeout"], params["margin_mib"], dry_run=module.check_mode)
    except Error as exc:
        module.fail_json(msg=exc.msg)
    except OSError as exc:
        module.fail_json(msg=f"reading the weight files: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
