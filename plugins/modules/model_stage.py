#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _stage_node as stage_node
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

ARGUMENT_SPEC = dict(
    source=dict(type="str", required=True),
    revision=dict(type="str", default="main"),
    dest=dict(type="path"),
    owner=dict(type="str", default=""),
    endpoint=dict(type="str", default=""),
    token_file=dict(type="path", no_log=False),
    margin_mib=dict(type="int", default=10240),
    models_root=dict(type="path"),
    keep=dict(type="list", elements="path", default=[]),
    prune=dict(type="bool", default=False),
    timeout=dict(type="float", default=14400),
    merge_gguf=dict(type="bool", default=False),
    quant=dict(type="str"),
    files=dict(type="list", elements="str"),
    files_optional=dict(type="bool", default=False),
    keep_parts=dict(type="bool", default=False),
    replaceable=dict(type="path"),
    replace=dict(type="str", default="never", choices=["never", "after_stop", "now"]),
)


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
