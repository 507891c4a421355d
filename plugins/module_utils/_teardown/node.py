# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The teardown's seam on a node: its units stopped through systemd, the GPU holders found and killed, the memory read
through NVML, every signal in the node's journal. The cutover's node (_switch.cutover_node) extends it."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill, memory
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import stop as systemd_stop
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemd_systemctl
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import units as systemd_units
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import TeardownFailed, TeardownOps


class TeardownNode(TeardownOps):
    """The teardown's side effects on this node. ``host`` runs commands and says warnings (the module: run_command,
    get_bin_path, warn, log); ``nvml`` returns pynvml; ``params`` are the teardown options (plugins/doc_fragments/teardown)."""

    def __init__(self, host, params: dict, reader: ProcReader, nvml, caller: str):
        self.host = host
        self.params = params
        self.reader = reader
        self.nvml = nvml
        self.systemctl = systemd_systemctl.Systemctl(host.run_command, host.get_bin_path("systemctl", required=True))
        # one journal for the whole run (a switch's teardown and its rollback's): every signal under its run id
        self.journal = journal.Journal(self.params["journal_path"] or None,
                                       self.params["run_id"] or self.params.get("lease_owner") or journal.new_run_id(caller),
                                       caller, reader)

    def stop_units(self, units: list[str], stop_timeout: float, check_mode: bool = False) -> dict:
        requests = [systemd_stop.stop_request(dict(name=unit, stop_timeout=stop_timeout, kill_timeout=self.params["kill_timeout"], must_exist=False,
                                              disable=self.params.get("disable_units", False), allow_protected=False,
                                              stop_triggers=self.params.get("stop_triggers", False), settle=self.params["settle"]))
                    for unit in units]
        results, failures = systemd_stop.stop_units(requests, self.systemctl, self.reader, check_mode, self.host.warn, journal=self.journal)
        if failures:
            raise TeardownFailed("; ".join(failures), units={"results": results})
        return {"results": results}

    def decide(self, units: list[str], kept: tuple[str, ...] = ()) -> dict:
        return self._holders(units, check_mode=True, kept=kept)

    def kill_holders(self, units: list[str], kept: tuple[str, ...] = (), leave_foreign: bool = False) -> dict:
        return self._holders(units, check_mode=False, kept=kept, leave_foreign=leave_foreign)

    def _holders(self, units: list[str], check_mode: bool, kept: tuple[str, ...] = (), leave_foreign: bool = False) -> dict:
        outside_units = "report" if leave_foreign and self.params["outside_units"] == "fail" else self.params["outside_units"]
        params = dict(gpus=self.params["gpus"], device_paths=self.params["device_paths"], sources=None, protected=self.params["protected"],
                      protected_pids=[], term_timeout=self.params["term_timeout"],
                      kill_timeout=self.params.get("holders_kill_timeout") or self.params["kill_timeout"],
                      max_targets=self.params["max_targets"], ambiguous="report", nvml_timeout=10, lock_timeout=60,
                      units=[systemd_units.normalize_unit_name(unit) for unit in units], outside_units=outside_units,
                      owners=self.params["owners"], kept_units=list(kept), incomplete_scan=self.params.get("incomplete_scan"))
        request = holders_kill.KillRequest.from_params(params, self.reader)
        return holders_kill.kill_holders(request, lambda timeout: NvmlClient(self.nvml, timeout), self.reader, self.restart_policy,
                                         check_mode, self.host.warn, self.host.log, journal=self.journal)

    def restart_policy(self, unit: str) -> tuple[str, int]:
        return systemd_systemctl.restart_policy_reader(self.systemctl)(unit)

    def memory(self, wait: bool, left_pids: tuple[int, ...] = ()) -> dict:
        request = memory.MemoryRequest.from_params(dict(
            gpus=self.params["gpus"], expected_count=self.params["expected_gpu_count"], max_used_mib=self.params["max_used_mib"],
            max_processes=None, timeout=self.params["memory_timeout"] if wait else 0, interval=0.1, nvml_timeout=10, v1_reserve_mib=1024,
            device_paths=self.params["device_paths"], left_pids=list(left_pids)))
        if wait:
            return memory.assert_free(request, self.nvml)
        try:
            return memory.assert_free(request, self.nvml)
        except CheckFailed as exc:  # the reading before the teardown: busy GPUs are expected
            return dict(exc.context, msg=None)

    def reset_failed(self, units: list[str]) -> None:
        try:
            self.systemctl.reset_failed(units)
        except CommandFailed as exc:  # a unit that is not failed (any more) is no reason to stop
            self.host.warn(exc.msg)

    def unit_properties(self, unit: str) -> dict:
        try:
            return self.systemctl.show(unit).properties
        except CommandFailed:
            return {}
