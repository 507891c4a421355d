#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import stop as systemd_stop
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemd_systemctl

ARGUMENT_SPEC = dict(
    name=dict(type="str"),
    names=dict(type="list", elements="str"),
    stop_timeout=dict(type="float", default=90),
    kill_timeout=dict(type="float", default=30),
    settle=dict(type="float", default=0.5),
    must_exist=dict(type="bool", default=False),
    disable=dict(type="bool", default=False),
    allow_protected=dict(type="bool", default=False),
    stop_triggers=dict(type="bool", default=False),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True, mutually_exclusive=[("name", "names")],
                           required_one_of=[("name", "names")])
    started = time.monotonic()
    try:
        # every name is checked before systemctl is looked for, and before any unit is stopped
        names = [module.params["name"]] if module.params["names"] is None else list(dict.fromkeys(module.params["names"]))
        requests = [systemd_stop.stop_request(dict(module.params, name=name)) for name in names]
        systemctl = systemd_systemctl.Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))
        reader = ProcReader()
        signals_journal = journal.Journal(module.params["journal_path"] or None,
                                          module.params["run_id"] or journal.new_run_id("systemd_stop_hard"), "systemd_stop_hard", reader)
        if module.params["names"] is None:
            module.exit_json(**systemd_stop.stop_unit(requests[0], systemctl, reader, module.check_mode, module.warn, journal=signals_journal))
        results, failures = systemd_stop.stop_units(requests, systemctl, reader, module.check_mode, module.warn, journal=signals_journal)
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"elapsed": time.monotonic() - started}, **exc.context))
    result = dict(changed=any(unit.get("changed") for unit in results), units=results, elapsed=time.monotonic() - started)
    if failures:
        module.fail_json(msg="; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
