#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import PYNVML_IMPORT_ERROR, NvmlClient, pynvml
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl, restart_policy_reader, systemd_runs

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str"),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    sources=dict(type="list", elements="str", choices=["proc", "nvml"], default=["proc", "nvml"]),
    protected=dict(type="list", elements="str", default=[]),
    protected_pids=dict(type="list", elements="int", default=[]),
    term_timeout=dict(type="float", default=30),
    kill_timeout=dict(type="float", default=30),
    ambiguous=dict(type="str", choices=["report", "kill"], default="report"),
    max_targets=dict(type="int", default=64),
    nvml_timeout=dict(type="float", default=10),
    lock_timeout=dict(type="float", default=60),
    units=dict(type="list", elements="str", default=[]),
    kept_units=dict(type="list", elements="str", default=[]),
    outside_units=dict(type="str", choices=["kill", "report", "fail"], default="fail"),
    incomplete_scan=dict(type="str", choices=["fail", "warn"], default="fail"),
    owners=dict(type="list", elements="str", default=[]),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
)


def nvml_client(timeout: float) -> NvmlClient:
    return NvmlClient(lambda: pynvml, timeout)


def restart_policy(module: AnsibleModule):
    """A service's Restart= and main PID through systemctl; nothing where systemd is not the init system."""
    running = systemd_runs()
    return restart_policy_reader(Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if running else None)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    started = time.monotonic()
    reader = ProcReader()
    try:
        request = holders_kill.KillRequest.from_params(module.params, reader)
        if request.needs_nvml and pynvml is None:
            module.fail_json(msg=missing_required_lib("nvidia-ml-py", reason="to query NVML (or set sources: [proc] without gpus)"),
                             exception=PYNVML_IMPORT_ERROR)
        signals_journal = journal.Journal(module.params["journal_path"] or None, module.params["run_id"] or journal.new_run_id("gpu_holders_kill"),
                                          "gpu_holders_kill", reader)
        result = holders_kill.kill_holders(request, nvml_client, reader, restart_policy(module), module.check_mode,
                                           module.warn, module.log, journal=signals_journal)
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"elapsed": time.monotonic() - started}, **exc.context))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
