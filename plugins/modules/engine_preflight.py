#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import pynvml
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import preflight, preflight_node
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl, restart_policy_reader, systemd_runs

ARGUMENT_SPEC = preflight_node.OPTIONS


def load_nvml():
    if pynvml is None:
        raise Error("nvidia-ml-py is not installed")
    return pynvml


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        request = preflight.Request.from_params(module.params)
        # a holder the teardown would refuse to kill alone (a service systemd restarts) is named here, before any drain
        systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if systemd_runs() else None
        probe = preflight_node.NodeProbe(load_nvml, restart_policy=restart_policy_reader(systemctl))
        result = preflight_node.outcome(*preflight_node.run_checks(request, probe))
    except Error as exc:
        module.fail_json(msg=exc.msg, passed=False, checks=[], failures=[exc.msg], gpus=[], holders={}, **exc.context)
    if result["failures"]:
        module.fail_json(msg="preflight: " + "; ".join(result["failures"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
