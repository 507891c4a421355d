#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import PYNVML_IMPORT_ERROR, pynvml
from ansible_collections.gpufleet.serving.plugins.module_utils._node import parked
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover, cutover_node
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.options import TEARDOWN_OPTIONS

ENGINE_OPTIONS = dict(engine=dict(type="str", required=True, choices=["vllm", "sglang"]), unit=dict(type="str", required=True),
                      url=dict(type="str", required=True), model=dict(type="str", required=True), api_key=dict(type="str", no_log=True),
                      ready_timeout=dict(type="float", default=600))
ARGUMENT_SPEC = dict(
    **TEARDOWN_OPTIONS,
    units=dict(type="list", elements="str", required=True),
    target=dict(type="dict", required=True, options=ENGINE_OPTIONS),
    previous=dict(type="dict", options=ENGINE_OPTIONS),
    boot=dict(type="bool", default=False),
    rollback_reason=dict(type="str"),
    restore=dict(type="list", elements="dict", default=[], options=dict(src=dict(type="path", required=True), dest=dict(type="path", required=True))),
    drain_timeout=dict(type="float", default=120),
    stop_grace=dict(type="float", default=15),
    stop_timeout=dict(type="float", default=90),
    interval=dict(type="float", default=0.25),
    soak=dict(type="float", default=0),
    soak_interval=dict(type="float", default=1),
    preflight=dict(type="dict"),
    files=dict(type="list", elements="dict", default=[]),
    prewarm_paths=dict(type="list", elements="path", default=[]),
    prewarm_timeout=dict(type="float", default=300),
    prewarm_margin_mib=dict(type="int", default=8192),
    clear_paths=dict(type="list", elements="path", default=[]),
    release_lease=dict(type="bool", default=False),
    lease_name=dict(type="str", default=paths.LEASE_NAME),
    lease_owner=dict(type="str"),
    lease_seconds=dict(type="float", default=3600),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
    record_path=dict(type="str", default=cutover.RECORD_PATH),
    park_previous=dict(type="bool", default=False),
    wake=dict(type="bool", default=False),
    evict=dict(type="bool", default=False),
    park_timeout=dict(type="float", default=120),
    target_memory_fraction=dict(type="float"),
    parked_path=dict(type="str", default=parked.RECORD_PATH),
    metrics_versions=dict(type="dict", default={}),
    replace_model=dict(type="dict"),
    restage_previous=dict(type="dict"),
    answer_check=dict(type="dict", options=dict(
        expectations=dict(type="list", elements="dict", default=[]),
        tolerance=dict(type="float", default=0.05),
        record_dir=dict(type="str", default=paths.ANSWERS_DIR),
        refresh=dict(type="bool", default=False),
        versions=dict(type="dict", default={}),
        degenerate_check=dict(type="bool", default=True),
        probe_timeout=dict(type="float", default=120),
    )),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.no_log_values.update(cutover_node.secret_contents(module.params))
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    try:
        request = cutover_node.request_from_params(module.params)
        node = cutover_node.CutoverNode(module, module.params, ProcReader(), lambda: pynvml)
        if module.check_mode:
            module.exit_json(longest_run=request.longest_run, **cutover_node.plan(request, node.systemctl, rollback=bool(module.params["rollback_reason"])))
        result = cutover_node.run(module.params, request, node)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(longest_run=request.longest_run, **result)


if __name__ == "__main__":
    main()
