#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed, Error
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import abandoning_clock
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl

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
    soak=dict(type="float", default=0),
)


def unit_state_reader(module: AnsibleModule):
    """The unit's state through the collection's one systemctl seam (Systemctl.unit_state)."""
    return Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)).unit_state


def unit_properties_reader(module: AnsibleModule):
    """The unit's properties (InvocationID, MainPID, NRestarts, ActiveState, SubState) through the same seam; {} when
    systemctl cannot say."""
    systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))

    def unit_properties(unit: str) -> dict:
        try:
            return systemctl.show(unit).properties
        except CommandFailed:
            return {}
    return unit_properties


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    clock = abandoning_clock(parent=os.getppid())  # the wait and the soak end with their controller
    try:
        request = readiness.ReadyRequest.from_params(module.params)
        client = http.HttpClient(request.url, request.api_key)
        systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if request.unit else None
        result = readiness.wait_ready(request, client, unit_state_reader(module) if request.unit else None,
                                      clock=clock, journal=systemctl.journal if systemctl else None)
        if result["ready"] and request.min_spec_acceptance is not None:
            result["spec_acceptance"] = readiness.check_acceptance(request, client, result)
        if result["ready"] and request.soak > 0:
            result["soak"] = readiness.soak(request, client, unit_properties_reader(module) if request.unit else None, clock)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
