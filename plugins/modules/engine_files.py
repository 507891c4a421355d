#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl

ARGUMENT_SPEC = dict(
    files=dict(type="list", elements="dict", required=True, options=files.FILE_OPTIONS),
    directory_mode=dict(type="str", default="0755"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    for item in module.params["files"]:
        if item["secret"]:
            module.no_log_values.add(item["content"])
    try:
        wanted = [files.WantedFile.from_params(item) for item in module.params["files"]]
        directory_mode = files.parse_mode("directory_mode", module.params["directory_mode"])
        reload = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)).daemon_reload if any(w.reload for w in wanted) else None
        result = files.converge(wanted, directory_mode, module.check_mode, reload)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
