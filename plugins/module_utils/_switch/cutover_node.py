# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""engine_cutover's node side: the adapter (CutoverNode, the teardown's node extended) through which the cutover's steps act on this node - systemd, the GPU
holders, NVML, the engines' HTTP endpoints, files - its request built from the module's options, and the run under the
switch's lease and the node's work lock. The module only builds itself, calls these and returns."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers, park, prewarm, readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import EngineExited, Error, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock
from ansible_collections.gpufleet.serving.plugins.module_utils._models import stage_node
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease, metrics, parked
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover, preflight, preflight_node
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import cgroup as systemd_cgroup
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemd_systemctl
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import units as systemd_units
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.node import TeardownNode


class CutoverNode(TeardownNode, cutover.NodeOps):
    """The cutover's side effects on this node: the teardown's (TeardownNode) and the rest - the engines' HTTP
    endpoints, their files, the models, the park."""

    def __init__(self, host, params: dict, reader: ProcReader, nvml, caller: str = "engine_cutover"):
        super().__init__(host, params, reader, nvml, caller)

    def preflight(self, request: preflight.Request) -> dict:
        return preflight_node.outcome(*preflight_node.run_checks(request, preflight_node.NodeProbe(self.nvml, restart_policy=self.restart_policy)))

    def ask(self, engine: cutover.Engine, prompt: str, max_tokens: int, timeout: float) -> answers.Answer:
        body = http.greedy_completion(http.HttpClient(engine.url, engine.api_key, timeout=timeout), engine.model, prompt, max_tokens, engine.engine)
        return answers.Answer.from_completion(prompt, body)

    def engine_said(self, unit: str) -> str | None:
        return readiness.engine_said(self.systemctl.journal(unit))

    def unit_command(self, unit: str) -> str:
        properties = self.systemctl.show_units([unit], ("ExecStart",))[unit]
        return " ".join(systemd_units.exec_start_argv(properties.get("ExecStart")))

    def read_answers(self, path: str) -> dict | None:
        return files.read_json_object(path)

    def write_answers(self, path: str, record: dict) -> None:
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            partial = path + ".new"
            with open(partial, "w", encoding="utf-8") as handle:
                json.dump(record, handle, indent=1)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(path + ".new")  # a partial record is no record
            raise Error(f"{path}: {exc.strerror or exc}") from None

    def stage(self, params: dict) -> dict:
        try:
            return stage_node.stage(params, False, stage_node.Disk())
        except stage_node.MissingHubClient:
            raise Error(f"{params['source']}: huggingface_hub is not installed on this node") from None
        except (OSError, ValueError) as exc:
            raise Error(f"{params['source']}: {exc}") from None

    def write_files(self, wanted: list) -> dict:
        reload = self.systemctl.daemon_reload if any(item.reload for item in wanted) else None
        written = files.converge(wanted, 0o755, False, reload)  # raises Error naming the file
        written.pop("diff", None)
        return written

    def prewarm(self, paths: list[str], timeout: float) -> dict:
        try:
            return prewarm.warm(paths, timeout, self.params["prewarm_margin_mib"])
        except OSError as exc:
            raise Error(f"reading the weight files: {exc}") from None

    def drain(self, engine: cutover.Engine, timeout: float) -> dict:
        request = readiness.DrainRequest(engine=engine.engine, url=engine.url, timeout=timeout, interval=0.25, fail_on_timeout=False)
        return readiness.wait_drained(request, http.HttpClient(engine.url, timeout=5))

    def park(self, engine: cutover.Engine, timeout: float) -> dict:
        started = time.monotonic()
        self._park_call(engine, "park", timeout)
        seconds = round(time.monotonic() - started, 3)
        self._hold(engine.unit)
        state = self.systemctl.show(engine.unit)
        group = systemd_cgroup.Cgroup.locate(state.control_group, self.reader)
        pids = set(group.pids())
        with NvmlClient(self.nvml, 10) as nvml:
            inventory = nvml.inventory()
        leftover = {str(gpu["index"]): sum(process["used_mib"] or 0 for process in gpu["processes"] if process["pid"] in pids)
                    for gpu in inventory["gpus"]}
        return {"seconds": seconds, "at": round(time.time(), 3), "invocation_id": state.properties.get("InvocationID") or None,
                "boot_id": lease.boot_id(),
                "leftover_mib": {index: mib for index, mib in leftover.items() if mib},
                "gpus": [{"index": gpu["index"], "total_mib": gpu.get("total_mib")} for gpu in inventory["gpus"]],
                "host_memory_bytes": host_memory(state.properties.get("MemoryCurrent", ""), group, pids, self.reader)}

    def wake(self, engine: cutover.Engine, timeout: float) -> dict:
        started = time.monotonic()
        self._park_call(engine, "wake", timeout)
        return {"call_s": round(time.monotonic() - started, 3)}

    def _park_call(self, engine: cutover.Engine, action: str, timeout: float) -> None:
        method, path, body = park.CALLS[engine.engine][action]
        answer = http.HttpClient(engine.url, engine.api_key, timeout=timeout or 120).request(method, path, body)
        if answer.status != 200:
            raise Error(f"{engine.engine} {method} {path}: " + (f"HTTP {answer.status} {answer.body[:200]}" if answer.status else str(answer.error)))

    def _hold(self, unit: str) -> None:
        try:
            parked.hold(self.params.get("parked_path"), unit)
        except OSError as exc:  # parked all the same; only a restart after its death would not be held back
            self.host.warn(f"{parked.hold_dir(self.params.get('parked_path'))}: {exc.strerror or exc}: a parked {unit} that dies is restarted by systemd")

    def record_parked(self, record: dict | None, measured: dict | None = None) -> None:
        path = self.params.get("parked_path")
        try:
            if record is None:
                parked.remove_record(path)
                parked.release(path)
            elif path:
                parked.hold(path, record["unit"])  # at most one engine parked per node
                files.write_atomically(path, json.dumps(record) + "\n", 0o644)
                # what this park left, for the planner of the engine's next park on this node
                history = parked.HISTORY_PATH if path == parked.RECORD_PATH else os.path.join(os.path.dirname(path), "park_history.json")
                files.write_atomically(history, json.dumps(parked.remembered(parked.read_history(history), record["engine"], measured or {})) + "\n",
                                       0o644)
        except OSError as exc:
            raise Error(f"{path}: {exc.strerror or exc}") from None

    def restore(self, files: list[dict]) -> None:
        for item in files:
            if os.path.exists(item["src"]):
                shutil.copy2(item["src"], item["dest"])
        self.systemctl.daemon_reload()

    def start(self, unit: str) -> None:
        # a held unit's start would be skipped, and systemctl would still answer 0
        try:
            parked.release(self.params.get("parked_path"), [unit])
        except OSError as exc:
            raise Error(f"{parked.hold_dir(self.params.get('parked_path'))}/{unit}: {exc.strerror or exc}: systemd would skip its start") from None
        self.systemctl.start(unit)

    def set_boot(self, enable: str | None, units: list[str]) -> dict:
        return self.systemctl.set_boot(enable, units)

    def wait_ready(self, engine: cutover.Engine, timeout: float) -> dict:
        request = readiness.ReadyRequest(engine=engine.engine, url=engine.url, model=engine.model, api_key=engine.api_key, unit=engine.unit,
                                         timeout=timeout, interval=self.params["interval"], completion=True, min_spec_acceptance=None,
                                         probe_requests=1)
        started = time.monotonic()
        try:
            report = readiness.wait_ready(request, http.HttpClient(engine.url, engine.api_key, timeout=5), self.systemctl.unit_state,
                                          journal=self.systemctl.journal)
        except EngineExited as exc:
            raise cutover.NotServing(cutover.not_serving_message(engine, time.monotonic() - started, exc.context.get("unit_state"), exc.msg),
                                     **exc.context) from None
        if not report["ready"]:
            detail = f"still waiting for {report['waiting_for']}" if report.get("waiting_for") else "readiness"
            raise cutover.NotServing(cutover.not_serving_message(engine, report["elapsed"], report.get("unit_state"), detail), **report)
        return report

    def soak(self, engine: cutover.Engine, seconds: float) -> dict:
        request = readiness.ReadyRequest(engine=engine.engine, url=engine.url, model=engine.model, api_key=engine.api_key, unit=engine.unit,
                                         timeout=0, interval=self.params["soak_interval"], completion=True, min_spec_acceptance=None,
                                         probe_requests=1, soak=seconds)
        # the plain clock: like the rest of the cutover, the soak goes on to its end without its controller
        return readiness.soak(request, http.HttpClient(engine.url, engine.api_key, timeout=5), self.unit_properties)


def host_memory(memory_current: str, group: systemd_cgroup.Cgroup, pids: set[int], reader: ProcReader) -> int | None:
    """A parked engine's host memory: its unit's memory as systemd accounts it, else its group's memory.current, else
    the resident memory of its processes (a host without memory accounting)."""
    if memory_current.isdigit():
        return int(memory_current)
    if group.directory:
        try:
            with open(os.path.join(group.directory, "memory.current"), encoding="ascii") as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            pass
    total = 0
    for pid in pids:
        try:
            total += int(reader.status(pid).get("VmRSS", "0 kB").split()[0]) * 1024
        except (ProcessGone, OSError, ValueError, IndexError, KeyError):
            continue
    return total or None


def finish(result: dict, params: dict, store: lease.LeaseStore, request: cutover.CutoverRequest) -> None:
    """What the caller asked done once the cutover ended: its marks cleared when an engine serves, the node's record of
    it written (read by the next run, whatever became of this one's controller), the lease given back."""
    if result["result"] in results.SERVING:
        for path in params["clear_paths"]:
            if os.path.lexists(path):
                os.unlink(path)
    result["record"] = None
    if params["record_path"]:
        record = cutover.node_record(request, result, params["run_id"] or params["lease_owner"], time.time())
        try:
            files.write_atomically(params["record_path"], json.dumps(record) + "\n", 0o644)
            result["record"] = record
        except OSError as exc:  # the engine serves (or the rollback's does): the record is for the next run's report
            result["record_error"] = f"{params['record_path']}: {exc.strerror or exc}"
    result["lease_released"] = bool(params["release_lease"] and params["lease_owner"] and store.release(params["lease_owner"]))
    result["metrics_warnings"] = publish_metrics(params, request, result, store)


def engines_after(request: cutover.CutoverRequest, result: dict, versions: dict) -> list[dict]:
    """The engines a cutover left on the node, as the metrics label them: the one serving, the one parked, the others none."""
    serving = {"switched": request.target, "rolled_back": request.previous}.get(result["result"])
    parked = result.get("parked") or {}
    found = []
    for engine in [request.target] + ([request.previous] if request.previous and request.previous.engine != request.target.engine else []):
        state = "serving" if serving is engine else "parked" if parked.get("engine") == engine.engine else "none"
        found.append({"engine": engine.engine, "version": versions.get(engine.engine) or "", "model": engine.model, "state": state})
    return found


def publish_metrics(params: dict, request: cutover.CutoverRequest, result: dict, store: lease.LeaseStore) -> list[str]:
    """The node's metrics after this cutover (never in check mode; never a failure: warnings)."""
    if params.get("metrics_dir") is None:
        return []
    state = metrics.load_state(params["metrics_state_path"])
    metrics.record_switch(state, result, engines_after(request, result, params.get("metrics_versions") or {}), time.time())
    parked = result.get("parked")  # a parked engine the cutover did not touch: none (the switch wakes or evicts one)
    state["parked"] = ({"engine": parked["engine"], "host_memory_bytes": parked.get("host_memory_bytes"), "since": parked.get("parked_at")}
                       if parked else None)
    state["lease"] = metrics.lease_state(store.held())
    return metrics.publish(state, params["metrics_dir"], params["metrics_state_path"])


def validated(name: str, value: dict, options: dict) -> dict:
    """A dict option checked against another module's options (their types, defaults and choices); a null value is
    one not given, as for a module's own options."""
    checked = ArgumentSpecValidator(options).validate(_given(value))
    if checked.error_messages:
        raise InvalidInput(f"{name}: {'; '.join(checked.error_messages)}")
    return checked.validated_parameters


def _given(value: dict) -> dict:
    """The keys given a value, at every depth: a null is a key not given (``previous: {engine: null}`` is no previous
    engine's demand, not a bad engine name)."""
    given = {}
    for key, item in value.items():
        if isinstance(item, dict):
            item = _given(item)
        if item is not None and item != {}:
            given[key] = item
    return given


def preflight_request(value: dict | None) -> preflight.Request | None:
    return preflight.Request.from_params(validated("preflight", value, preflight_node.OPTIONS)) if value else None


def secret_contents(params: dict) -> list[str]:
    """The secret files' contents, never returned - even where another option's error ends the run before its entry is
    checked: every failure returns the module's arguments."""
    return [str(item["content"]) for item in params["files"]
            if isinstance(item, dict) and item.get("content") and boolean(item.get("secret", False), strict=False)]


def wanted_files(params: dict) -> list:
    return [files.WantedFile.from_params(validated(f"files[{index}]", item, files.FILE_OPTIONS)) for index, item in enumerate(params["files"])]


def request_from_params(params: dict) -> cutover.CutoverRequest:
    def engine(name: str) -> cutover.Engine | None:
        value = params[name]
        return cutover.Engine.from_params(name, value and dict(value, unit=systemd_units.normalize_unit_name(value["unit"])))
    return cutover.CutoverRequest(
        units=[systemd_units.normalize_unit_name(unit) for unit in params["units"]], target=engine("target"), previous=engine("previous"),
        drain_timeout=params["drain_timeout"], stop_grace=params["stop_grace"], stop_timeout=params["stop_timeout"], restore=params["restore"],
        boot=params["boot"], soak=params["soak"], prewarm_paths=params["prewarm_paths"], prewarm_timeout=params["prewarm_timeout"],
        preflight=preflight_request(params["preflight"]), files=wanted_files(params), park_previous=params["park_previous"],
        wake=params["wake"], evict=params["evict"], park_timeout=params["park_timeout"], target_memory_fraction=params["target_memory_fraction"],
        replace_model=stage_request("replace_model", params["replace_model"]), restage_previous=stage_request("restage_previous", params["restage_previous"]),
        answers=answers.CheckSettings.from_params(params["answer_check"]))


def stage_request(name: str, value: dict | None) -> dict | None:
    """A staging the cutover runs (model_stage's options), for real and replacing: the model it replaces goes first."""
    if not value:
        return None
    checked = validated(name, value, stage_node.OPTIONS)
    if checked["replace"] != "now" or not checked.get("replaceable"):
        raise InvalidInput(f"{name}: give replaceable, with replace: now (the cutover stages a model only in place of another)")
    return checked


def run(params: dict, request: cutover.CutoverRequest, node: CutoverNode) -> dict:
    """The cutover under the switch's lease (renewed once; another owner's means nothing is touched) and the node's work
    lock, then finish(). A controller interrupted or gone mid-cutover must not leave the node half switched: the
    cutover goes on to its end (the target serving, or the previous engine again), and the lock makes the next run
    wait for it."""
    store = lease.LeaseStore(lease.LeaseRequest.from_params(dict(
        name=params["lease_name"], owner=params["lease_owner"] or "-", state="acquired", lease_seconds=params["lease_seconds"],
        wait_timeout=0, break_owner=None)).name)
    if params["lease_owner"]:
        renewed = store.acquire(params["lease_owner"], params["lease_seconds"], 0)
        if renewed.holder["owner"] != params["lease_owner"]:
            return dict(changed=False, result="lease_lost", holder=renewed.holder, marks=[], lease_released=False, record=None,
                        reason=f"{params['lease_name']} is held by {renewed.holder['owner']}: nothing was touched")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with host_lock(store.work_path, 5):
        if params["rollback_reason"]:
            # the controller's rollback: whichever engine the node's park record names is woken, not started
            parked_unit = (parked.read_record(params["parked_path"]) or {}).get("unit")
            result = cutover.rollback_alone(request, node, Clock(), time.time(), params["rollback_reason"], parked_unit)
        else:
            result = cutover.cutover(request, node, Clock(), time.time())
    finish(result, params, store, request)
    for warning in unwritten_records(result):
        node.host.warn(warning)
    return result


def unwritten_records(result: dict) -> list[str]:
    """The node records this cutover could not write (a full disk): the engine serves either way, the operator hears
    of it - the next run reads no record of this one, and an engine without its answers' record gets a sanity check."""
    problems = [("the node's record of this cutover", result.get("record_error")),
                ("the answers' record", (result.get("answer_check") or {}).get("record_error"))]
    return [f"{what} was not written: {problem}" for what, problem in problems if problem]


def plan(request: cutover.CutoverRequest, systemctl: systemd_systemctl.Systemctl, rollback: bool = False) -> dict:
    """Check mode: which units would be stopped and which started (the previous engine's, for a rollback)."""
    if rollback:
        active = [unit for unit in request.units if systemctl.unit_state(unit) not in ("inactive", "failed", "unknown")]
        return dict(empty_plan(), result=results.WOULD_ROLL_BACK, units_to_stop=active, unit_to_start=request.previous.unit if request.previous else None)
    kept = request.previous.unit if request.park_previous else request.target.unit if request.wake else None
    active = [unit for unit in request.units if unit != kept and systemctl.unit_state(unit) not in ("inactive", "failed", "unknown")]
    standby = "would park " + request.previous.unit if request.park_previous else "would wake " + request.target.unit if request.wake else None
    return dict(empty_plan(), units_to_stop=active, unit_to_start=request.target.unit, standby=standby)


def empty_plan() -> dict:
    return dict(changed=True, result=results.WOULD_SWITCH, units_to_stop=[], unit_to_start=None, marks=[], standby=None,
                park=None, wake=None,
                engine_start_s=None, reason=None, rollback_error=None, drain=None, teardown=None, rollback_teardown=None, soak=None, prewarm=None,
                boot=None, boot_error=None, lease_released=False, preflight=None, files=None, record=None, replace=None, restage=None,
                answer_check=None, rollback_answer_check=None)
