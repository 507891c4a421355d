#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._models import stage_node

ARGUMENT_SPEC = stage_node.OPTIONS


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        module.exit_json(**stage_node.stage(module.params, module.check_mode, stage_node.Disk()))
    except stage_node.MissingHubClient as exc:
        module.fail_json(msg=missing_required_lib("huggingface_hub", reason="to download a hub repository"), exception=str(exc))
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{module.params['source']}: {exc}")


if __name__ == "__main__":
    main()
