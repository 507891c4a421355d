#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import PYNVML_IMPORT_ERROR, pynvml
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import requester_gone
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown import run as teardown_run
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.node import TeardownNode
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.options import TEARDOWN_OPTIONS

ARGUMENT_SPEC = dict(
    **TEARDOWN_OPTIONS,
    units=dict(type="list", elements="str", default=[]),
    kept_units=dict(type="list", elements="str", default=[]),
    keep_parked=dict(type="bool", default=False),
    parked_path=dict(type="str", default=paths.PARKED_RECORD),
    steps=dict(type="list", elements="str", default=list(teardown_run.STEPS)),
    measure_before=dict(type="bool", default=True),
    stop_timeout=dict(type="float", default=90),
    disable_units=dict(type="bool", default=False),
    stop_triggers=dict(type="bool", default=False),
    holders_kill_timeout=dict(type="float", default=30),
    lease=dict(type="bool", default=True),
    lease_name=dict(type="str", default=paths.LEASE_NAME),
    lease_wait=dict(type="float", default=0),
    break_owner=dict(type="str"),
    run_id=dict(type="str"),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    parent = os.getppid()
    module.params["run_id"] = module.params["run_id"] or journal.new_run_id("node_teardown")
    try:
        node = TeardownNode(module, module.params, ProcReader(), lambda: pynvml, caller="node_teardown")
        # a wait for the lease whose controller was interrupted must not take it later for a run that no longer exists
        result = teardown_run.run(module.params, node, module.check_mode, still_wanted=lambda: not requester_gone(parent=parent))
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    if result["result"] != "done":  # failed, or lease_held: another run holds the node (nothing was touched)
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
