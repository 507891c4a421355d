# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The teardown and switch reports: built once per host, gathered once per run, in the schema of docs/reports.md.

The JSON documents are a contract for users' tooling: a key changes meaning only with SCHEMA_VERSION.
"""

from __future__ import annotations

import datetime

from ansible_collections.gpufleet.serving.plugins.module_utils import _phases as phases
from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results
from ansible_collections.gpufleet.serving.plugins.module_utils._results import NOT_REACHED, PREFLIGHT_FAILED, ROLLED_BACK, SWITCHED

SCHEMA_VERSION = 1  # keys are only ever added within a version (0.2.0 added preflight, prewarm, plan, phases, downtime, fleet)
CMDLINE_WIDTH = 60

# switch_engine results, per host (module_utils/_results.py: the report's words)
SWITCH_RESULTS = results.SWITCH
SWITCH_SUCCESSES = results.SWITCH_SUCCESSES
# the phases of a switch, in order (module_utils/_phases.py); a host's durations are keyed by them
PHASES = phases.SWITCH
# the node serves no one from leaving rotation to the end of joining it again: its downtime, in these parts
DOWNTIME_PARTS = phases.DOWNTIME
# gpu_cleanup results, per host
TEARDOWN_RESULTS = results.TEARDOWN
# gpu_teardown's steps, in order, as its record names them
TEARDOWN_STEPS = ("before", "units", "holders", "after")
NOT_IN_LIMIT = "not in this run's --limit: left as it was, not contacted"


class ReportError(ValueError):
    pass


def _iso(timestamp) -> str | None:
    if timestamp is None:
        return None
    return datetime.datetime.fromtimestamp(float(timestamp), datetime.timezone.utc).isoformat(timespec="seconds")


# --- pieces shared by both reports ------------------------------------------------------------------------------------
def held_gpus(reading: dict | None) -> dict:
    """pid -> the GPUs NVML listed it on, from a memory reading taken before anything was stopped."""
    held: dict = {}
    for gpu in (reading or {}).get("gpus") or []:
        for process in gpu.get("processes") or []:
            held.setdefault(process.get("pid"), []).append(gpu.get("index"))
    return held


def process_summary(process: dict, held: dict | None = None) -> dict:
    """One process as the reports name it; its GPUs as observed - by the holder scan, else by the reading before the
    teardown (``held``: a process stopped with its unit was never scanned as a holder)."""
    cmdline = " ".join(process.get("cmdline") or []) or process.get("comm") or "?"
    gpus = process.get("gpus") or (held or {}).get(process.get("pid")) or []
    summary = {"pid": process.get("pid"), "comm": process.get("comm"), "cmdline": cmdline, "gpus": list(gpus),
               "unit": process.get("unit"), "user": process.get("user")}
    if process.get("reason"):
        summary["reason"] = process["reason"]
    if process.get("placement") and process.get("placement") != "listed_unit":
        summary["placement"] = process["placement"]
        # outside the units: another user's (foreign), or the engines' own users' (an escaped worker)
        if process.get("foreign") is not None:
            summary["foreign"] = bool(process["foreign"])
    return summary


def whose(process: dict) -> str:
    """Why a process is signalled, for a --check line: its engine unit, an engine's escaped worker, another user's."""
    where = process.get("unit") or "no unit"
    if not process.get("placement"):
        return f"in {where}"
    if process.get("foreign"):
        return f"ANOTHER USER'S: {process.get('user')}, {where}, {process['placement']}"
    if process.get("foreign") is False:
        return f"an engine's escaped worker: user {process.get('user')}, {where}"
    return f"{where}, {process['placement']}"


def unit_summary(result: dict, held: dict | None = None) -> dict:
    before = (result.get("state_before") or {}).get("ActiveState")
    after = (result.get("state_after") or {}).get("ActiveState")
    return {"unit": result.get("unit") or result.get("item"), "found": result.get("found"), "changed": bool(result.get("changed")),
            "before": before, "after": after, "escalated": bool(result.get("escalated")),
            "terminated": [process_summary(p, held) for p in result.get("terminated") or []],
            "killed": [process_summary(p, held) for p in result.get("killed") or []],
            "triggers_stopped": list(result.get("triggers_stopped") or []), "warnings": list(result.get("warnings") or []),
            "failed": bool(result.get("failed")), "msg": result.get("msg") if result.get("failed") else None}


def gpu_summary(gpu: dict) -> dict:
    # left_mib: memory of holders left running on purpose (outside_units=report), not counted against the engines
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "used_mib": gpu.get("used_mib"), "clean": gpu.get("clean"),
            "left_mib": gpu.get("left_mib")}


def failure_reason(result: dict | None) -> str:
    """The message of a failed task result, looped or not."""
    result = result or {}
    # a looped task's own msg is Ansible's "One or more items failed": the items' messages are the reason
    looped = [str(item.get("msg")) for item in result.get("results") or [] if isinstance(item, dict) and item.get("failed") and item.get("msg")]
    if looped:
        return "; ".join(looped)
    return str(result["msg"]) if result.get("msg") else "failed without a message"


# --- gpu_teardown: one host ---------------------------------------------------------------------------------------------
def teardown_host_report(steps: dict) -> dict:
    """The gpu_teardown record of one host from its steps' module results.

    ``steps``: check_mode, units (the looped systemd_stop_hard result), holders (gpu_holders_kill), before and after
    (gpu_memory_assert), and on failure failed_step and failure (the failed task's result).
    """
    held = held_gpus(steps.get("before"))
    units = [unit_summary(result, held) for result in (steps.get("units") or {}).get("results") or [] if result.get("unit") or result.get("failed")]
    holders = steps.get("holders") or {}
    failed_step, reason = steps.get("failed_step"), failure_reason(steps.get("failure")) if steps.get("failed_step") else None
    # a node lost during the teardown: Ansible does not fail an unreachable step, and what follows it did not run
    lost = next((name for name in TEARDOWN_STEPS if (steps.get(name) or {}).get("unreachable")), None)
    if lost and not failed_step:
        failed_step, reason = lost, f"became unreachable during the {lost} step: {(steps.get(lost) or {}).get('msg') or ''}".rstrip(": ")
    report = {
        "result": "not_reached" if steps.get("not_reached") else "failed" if failed_step else "ok",
        "check_mode": bool(steps.get("check_mode")),
        "failed_step": failed_step,
        "reason": steps.get("not_reached") or reason,
        "units": units,
        "terminated": [process_summary(p, held) for p in holders.get("terminated") or []],
        "killed": [process_summary(p, held) for p in holders.get("killed") or []],
        "planned": [process_summary(p) for p in holders.get("targets") or []] if steps.get("check_mode") else [],
        "protected": [process_summary(p) for p in holders.get("protected") or []],
        "outside": [process_summary(p) for p in (holders.get("outside") or []) + (holders.get("restarting") or [])],
        # other users' holders outside the units, apart from the engines' own, whatever was done with them
        "foreign": [process_summary(p) for p in holders.get("foreign") or []],
        # the node's Prometheus metrics not (all) written: a warning, never a failure
        "metrics_warnings": list(steps.get("metrics_warnings") or []),
        "stale_nvml_pids": list(holders.get("stale_nvml_pids") or []),
        # the node's parked engine, when its unit is among those torn down: kept, evicted, or found dead (not parked)
        "parked": _parked_fate(steps.get("parked")),
        "memory_before": [gpu_summary(g) for g in (steps.get("before") or {}).get("gpus") or []],
        "memory_after": [gpu_summary(g) for g in (steps.get("after") or {}).get("gpus") or []],
        # who ran it, under which lease, and every signal it sent as the node's journal recorded it
        "run_id": steps.get("run_id"),
        "lease": _lease_summary(steps.get("lease")),
        "signals": _units_signals(steps.get("units")) + list(holders.get("signals") or []),
    }
    return report


def _parked_fate(parked: dict | None) -> dict | None:
    if not parked:
        return None
    return {key: parked.get(key) for key in ("engine", "unit", "fate", "reason")}


# the gpu_teardown role's one step, as a failure before the module's own steps names it
TEARDOWN_TASK = "Tear down - lease, decide, stop units, kill holders, assert memory (one module run on the node)"


# SSH's words for a connection that was never made (the node was not reached: nothing ran on it)
NEVER_CONNECTED = ("ssh: connect to host", "Connection timed out during banner exchange", "Could not resolve hostname", "No route to host",
                   "Connection refused")


def teardown_run_steps(result: dict, check_mode: bool) -> dict:
    """gpufleet.serving.node_teardown's registered result (failed_when false) as teardown_host_report's steps: a node
    SSH never connected to was not reached (nothing ran on it); one lost during the run, or a module that failed before
    its steps (an option refused, a library missing), fails at it."""
    if result.get("unreachable"):
        message = str(result.get("msg") or "")
        if any(words in message for words in NEVER_CONNECTED):
            return {"check_mode": check_mode, "not_reached": f"unreachable: {message}"}
        return {"check_mode": check_mode, "failed_step": TEARDOWN_TASK, "failure": {"msg": f"became unreachable: {message}"}}
    if result.get("result") not in ("done", "failed", "lease_held"):
        return {"check_mode": check_mode, "failed_step": TEARDOWN_TASK, "failure": dict(result, failed=True)}
    return dict(result.get("steps") or {}, check_mode=check_mode)


def _units_signals(units: dict | None) -> list:
    """The signals systemd_stop_hard sent itself, unit after unit."""
    return [signal for unit in (units or {}).get("results") or [] for signal in unit.get("signals") or []]


def _lease_summary(lease: dict | None) -> dict | None:
    """The node's lease as the teardown took it: its owner, how long it waited, a dead run's lease it took over."""
    if not lease or lease.get("skipped") or not lease.get("holder"):
        return None
    return {"owner": lease["holder"].get("owner"), "waited": lease.get("waited"), "recovered": lease.get("recovered")}


def _teardown_processes(teardown: dict | None, kind: str) -> list[dict]:
    teardown = teardown or {}
    return list(teardown.get(kind) or []) + [p for unit in teardown.get("units") or [] for p in unit.get(kind) or []]


# --- switch_engine: one host --------------------------------------------------------------------------------------------
def _durations(marks: list) -> dict:
    """Seconds per phase from [[phase, start time], ..., ['end', time]]: each phase lasts until the next mark."""
    durations: dict = {}
    for (phase, start), (_next, end) in zip(marks, marks[1:]):
        durations[phase] = round(durations.get(phase, 0.0) + float(end) - float(start), 2)
    if len(marks) >= 2:
        durations["total"] = round(float(marks[-1][1]) - float(marks[0][1]), 2)
    return durations


def _phases(marks: list) -> list:
    """[{phase, start (unix seconds), seconds}] in the order they ran, from the marks."""
    return [{"phase": phase, "start": round(float(start), 3), "seconds": round(float(end) - float(start), 3)}
            for (phase, start), (_next, end) in zip(marks, marks[1:])]


def _out_of_rotation(marks: list, result: str, record: dict | None = None) -> list | None:
    """[left, back] (unix seconds) of the node's time out of rotation; back is None when it did not come back.

    With a balancer, from leaving its rotation to having joined it again. Without one (rotation none) clients reach
    the engine directly, so the node is out of service from the cutover's start on the node to an engine's first good
    readiness answer there, as long as the cutover's outcome is the switch's (a soak that failed afterwards is
    counted the balancer's way, from the marks)."""
    record = record or {}
    names = [mark[0] for mark in marks]
    node_phases = [mark for mark in marks if mark[0] in ("drain", "teardown")]
    if record.get("rotation") == "none" and record.get("cutover_result") == result:
        if not node_phases:
            return None  # the cutover's preflight or files stopped it: the previous engine served throughout
        if record.get("serving_since"):
            return [round(float(node_phases[0][1]), 3), round(float(record["serving_since"]), 3)]
    if "leave_rotation" not in names:
        return None
    left = float(marks[names.index("leave_rotation")][1])
    back = None
    if result in (SWITCHED, ROLLED_BACK) and "join_rotation" in names:
        joined = len(names) - 1 - names[::-1].index("join_rotation")
        if joined + 1 < len(marks):
            back = float(marks[joined + 1][1])
    return [round(left, 3), None if back is None else round(back, 3)]


def _parts_within(marks: list, out: list | None) -> dict:
    """Seconds of each downtime part inside the time out of service [left, back]."""
    if not out or out[1] is None:
        return {}
    parts: dict = {}
    for (phase, start), (_next, end) in zip(marks, marks[1:]):
        overlap = min(float(end), out[1]) - max(float(start), out[0])
        if phase in DOWNTIME_PARTS and overlap > 0:
            parts[phase] = round(parts.get(phase, 0.0) + overlap, 2)
    return {part: parts[part] for part in DOWNTIME_PARTS if part in parts}


def _preflight(checks) -> list:
    return [{"name": c.get("name"), "passed": bool(c.get("passed")), "skipped": bool(c.get("skipped")), "detail": c.get("detail")}
            for c in checks or []]


def _prewarm(result) -> dict | None:
    if not result or result.get("skipped") and "bytes" not in result:
        return None
    if "bytes" not in result:
        return {"bytes": 0, "total_bytes": None, "files": None, "seconds": 0.0, "finished": False,
                "skipped_reason": failure_reason(result) if result.get("failed") else None}
    return {key: result.get(key) for key in ("bytes", "total_bytes", "files", "seconds", "finished", "skipped_reason")}


def stage_record(result: dict, source: str) -> dict | None:
    """The target's model staging as the report keeps it (docs/reports.md: hosts.<host>.stage), from model_stage's
    result (or the async wait's); None where no model was staged."""
    if not result or result.get("skipped"):
        return None
    failed = bool(result.get("failed")) or (result.get("finished") == 0 and result.get("ansible_job_id") is not None)
    fetched = result.get("fetch") or []
    return {"source": source, "dest": result.get("dest"), "present": bool(result.get("present")), "files": len(fetched),
            "bytes": int(result.get("bytes") or 0), "resumed_bytes": int(result.get("resumed_bytes") or 0),
            "seconds": float(result.get("seconds") or 0.0), "rate_mib_s": result.get("rate_mib_s"),
            "room": dict(result.get("room") or {}), "removed": list(result.get("removed") or []), "problems": list(result.get("problems") or []),
            # one GGUF quant: the file it is served from, and its parts' merge
            "gguf": {key: (result.get("gguf") or {}).get(key) for key in ("file", "parts", "merge", "bytes", "seconds", "rate_mib_s")}
            if result.get("gguf") else None,
            # room only in place of the previous engine's model: fetched inside the downtime (switch_engine_replace_model)
            "deferred": bool(result.get("deferred")),
            "replace": dict(result["replace"]) if result.get("replace") else None,
            "error": failure_reason(result) if failed else None}


def _answer_check(checked) -> dict | None:
    """The engine's answers before rotation, as the report keeps them (not the answers themselves: the record has them)."""
    if not checked:
        return None
    woken = checked.get("after_wake")
    return {"kind": checked.get("kind"), "passed": bool(checked.get("passed")), "probes": checked.get("probes"),
            "seconds": checked.get("seconds"), "mismatch": checked.get("mismatch"), "drift": checked.get("drift"),
            "record": checked.get("record"), "recorded_at": _iso(checked["recorded_at"]) if checked.get("recorded_at") else None,
            "recorded": bool(checked.get("recorded")), "refresh": bool(checked.get("refresh")),
            # a woken engine that answered otherwise, then started cold and checked again
            "woken_mismatch": woken.get("mismatch") if woken else None,
            # a probe that failed once and was asked again (an engine's first request): what it answered the first time
            "retried": checked.get("retried")}


def _answer_seconds(checked) -> float | None:
    """Seconds the answer checks took inside the downtime (a woken engine's and its cold start's together)."""
    if not checked:
        return None
    woken = checked.get("after_wake") or {}
    return round(float(checked.get("seconds") or 0.0) + float(woken.get("seconds") or 0.0), 3)


def _replace_model(decision, stage, replaced, restaged) -> dict | None:
    """The target's model in place of the previous engine's (switch_engine_replace_model): where the stage found room
    only there, or where it was asked and could not be. Null otherwise."""
    decision, stage = decision or {}, stage or {}
    found = stage.get("replace")
    if not found and not (decision.get("asked") and decision.get("reason")):
        return None
    found, replaced = found or {}, replaced or {}
    return {"asked": bool(decision.get("asked")), "refused": decision.get("reason") if decision.get("asked") else None,
            "path": found.get("path"), "bytes": found.get("bytes"), "estimate_s": found.get("estimate_s"),
            # fetched inside the downtime: after the previous engine's stop, before the target's start
            "deferred": bool(stage.get("deferred")),
            "removed": bool((replaced.get("replace") or {}).get("removed")),
            "fetched_bytes": replaced.get("bytes"), "seconds": replaced.get("seconds"), "rate_mib_s": replaced.get("rate_mib_s"),
            "error": replaced.get("msg") if replaced.get("failed") else None,
            # the way back: the previous engine's model staged again before its start
            "rollback_restages": bool(stage.get("deferred")),
            "restaged": {key: restaged.get(key) for key in ("present", "bytes", "seconds", "rate_mib_s")} if restaged else None}


def _plan(plan, teardown) -> dict | None:
    if not plan:
        return None
    teardown = teardown or {}
    units = list(plan.get("units_to_stop") or [])
    holders = list(teardown.get("planned") or [])
    # the units' own processes go with their unit's stop; the holder kill signals only the others
    return {"running_requests": plan.get("running_requests"), "units_to_stop": units,
            "unit_processes": len([p for p in holders if p.get("unit") in units]),
            "processes_to_signal": [p for p in holders if p.get("unit") not in units],
            "target_files_change": dict(plan.get("target_files_change") or {}),
            "target_install": dict(plan["target_install"]) if plan.get("target_install") else None,
            "answer_check": dict(plan["answer_check"]) if plan.get("answer_check") else None,
            "gpus": list(teardown.get("memory_before") or [])}


def _identity(identity) -> dict | None:
    if not identity:
        return None
    return {key: identity.get(key) or None for key in ("engine", "version", "model")}


def engine_label(report: dict, side: str) -> str:
    """`vllm 0.33.0` (the version where known) for a report's from or to; `-` for none."""
    identity = report.get(f"{side}_engine") or {}
    name = identity.get("engine") or report.get(side)
    if not name or name == "none":
        return name or "-"
    return f"{name} {identity['version']}" if identity.get("version") else name


def _other_runs(last: dict | None, run_id: str | None) -> dict | None:
    if not last or (run_id and last.get("run_id") == run_id):
        return None
    return {key: last.get(key) for key in ("run_id", "target", "previous", "result", "reason")} | {"finished": _iso(last.get("finished"))}


def switch_failed(report: dict | None, check_mode: bool = False) -> bool:
    """Whether a node's switch failed - the verdict the role and the playbook fail it by: a result other than switched,
    unchanged or would_switch; in check mode a failed preflight is the node's plan, not a failure. No report: the node
    was not reached by the role (nothing to fail it for here)."""
    if not report:
        return False
    return report.get("result") not in SWITCH_SUCCESSES and not (check_mode and report.get("result") == PREFLIGHT_FAILED)


def switch_host_report(record: dict) -> dict:
    """The switch_engine record of one host, from what the switch_engine role noted while it ran.

    ``record``: target, found (engines active at discovery), previous, outcome (result, reason, rollback_error),
    marks ([[phase, unix time], ...] ending with ['end', time]), lease (host_lease result), teardown and
    rollback_teardown (gpu_teardown records).
    """
    outcome = record.get("outcome") or {}
    result = outcome.get("result")
    if result not in SWITCH_RESULTS:
        raise ReportError(f"switch result {result!r} is not one of {', '.join(SWITCH_RESULTS)}")
    marks = [list(mark) for mark in record.get("marks") or []]
    # the phase that failed: the last one begun before any rollback (or before putting back in rotation a node that
    # could not leave it)
    names = [mark[0] for mark in marks]
    phases = [name for name in names[: names.index("rollback") if "rollback" in names else None] if name != "end"]
    if phases[-2:] == ["leave_rotation", "join_rotation"]:
        phases = phases[:-1]
    teardowns = [record.get("teardown"), record.get("rollback_teardown")]
    lease = record.get("lease") or {}
    durations = _durations(marks)
    out = _out_of_rotation(marks, result, record)
    downtime = round(out[1] - out[0], 2) if out and out[1] is not None else None
    engine_start = record.get("engine_start_s")
    engine_start = None if engine_start in (None, "") else round(float(engine_start), 2)
    plan = _plan(record.get("plan"), record.get("teardown"))
    return {
        "result": result,
        # "none": read, and no engine ran; null: never read (unreachable, or refused before the engines' read)
        "from": record.get("previous") or None,
        "to": record.get("target"),
        # engine, version and model: what ran before (as its unit started it) and what the switch brought up
        "from_engine": _identity(record.get("from_engine")),
        "to_engine": _identity(record.get("to_engine")),
        "engines_found": list(record.get("found") or []),
        "engines_serving": None if record.get("serving") is None else list(record["serving"]),
        "reason": outcome.get("reason"),
        "failed_phase": (phases[-1] if phases else None) if result not in SWITCH_SUCCESSES else None,
        "rollback_error": outcome.get("rollback_error"),
        "recovered_lease": lease.get("recovered"),
        # the node's record of its last cutover when another run did it (one interrupted on its controller goes on to
        # its end on the node): what that run did, which its own report may never have said
        "last_cutover": _other_runs(record.get("last_cutover"), record.get("run_id")),
        "started": _iso(marks[0][1]) if marks else None,
        "finished": _iso(marks[-1][1]) if marks and marks[-1][0] == "end" else None,
        "durations_s": durations,
        "phases": _phases(marks),
        "out_of_rotation": out,
        "downtime_s": downtime,
        "downtime_parts_s": _parts_within(marks, out),
        # the downtime split: the target's unit start to its first good readiness answer, and everything else (ours)
        "engine_start_s": engine_start,
        "overhead_s": round(downtime - engine_start, 2) if downtime is not None and engine_start is not None and result == SWITCHED else None,
        "preflight": _preflight(record.get("preflight")),
        "gpu_holders": _gpu_holders(record.get("gpu_holders")),
        "prewarm": _prewarm(record.get("prewarm")),
        "stage": record.get("stage") or None,
        "stage_draft": record.get("stage_draft") or None,
        "stage_tokenizer": record.get("stage_tokenizer") or None,
        "replace_model": _replace_model(record.get("replace_decision"), record.get("stage"), record.get("replace"), record.get("restage")),
        "answer_check": _answer_check(record.get("answer_check")),
        "answer_check_s": _answer_seconds(record.get("answer_check")),
        "rollback_answer_check": _answer_check(record.get("rollback_answer_check")),
        "plan": plan,
        "terminated": [] if plan else [p for teardown in teardowns for p in _teardown_processes(teardown, "terminated")],
        "killed": [] if plan else [p for teardown in teardowns for p in _teardown_processes(teardown, "killed")],
        # the GPUs around the switch's teardown (before it, and after the last teardown - the rollback's when one ran)
        "memory_before": list((record.get("teardown") or {}).get("memory_before") or []),
        "memory_after": list((next((t for t in reversed(teardowns) if t), None) or {}).get("memory_after") or []),
        **_park(record, result),
        "metrics_warnings": list(record.get("metrics_warnings") or []),
        # the engines' workers found holding GPUs outside their units (a target already serving: swept, see `killed`)
        "escaped": list(record.get("escaped") or []),
    }


def _park(record: dict, result: str) -> dict:
    """A park's side of the report: what became of the previous engine (parked or stopped, and why), the path the
    target came up by (a wake or a cold start, and why cold), park_s and wake_s, and the engine left parked."""
    decided = record.get("park_decision") or {}
    park = record.get("park") or {}
    wake = record.get("wake") or {}
    parked = record.get("parked") or None
    if parked and not parked.get("alive", True):
        parked = None  # a record of an engine that died is no parked engine
    previous = decided.get("previous")
    if previous == "park" and not park.get("parked") and result not in ("would_switch", "preflight_failed", "unchanged"):
        previous = "stop"
    decision = ({"mode": decided.get("mode") or "off", "previous": previous, "reason": park.get("reason") or decided.get("reason"),
                 "path": decided.get("path"), "cold_reason": decided.get("cold_reason"), "evicted": bool(decided.get("evict"))} if decided else None)
    return {
        "park": decision,
        "standby": decision,  # the park's first name, kept for tooling written against it (changelog 55)
        "park_s": round(float(park["seconds"]), 2) if park.get("parked") and park.get("seconds") is not None else None,
        "wake_s": round(float(wake["wake_s"]), 2) if wake.get("wake_s") is not None else None,
        "parked": {key: parked.get(key) for key in ("engine", "unit", "model", "host_memory_bytes", "leftover_mib", "park_s", "parked_at")}
        if parked else None,
    }


def park_lines(report: dict, planned: bool) -> list[str]:
    """What a park did (or, in check mode, would do) on a node: the previous engine parked or why not, the parked
    engine woken, evicted or why it started cold, the engine left parked."""
    decision = report.get("park") or report.get("standby") or {}  # a report written before 55 has only standby
    if not decision or decision.get("mode") in (None, "off") and not report.get("parked"):
        return []
    lines = []
    previous = report.get("from")
    # refused or failed before the drain: nothing was parked, woken or evicted
    acted = planned or report.get("result") in results.ACTED
    if acted and decision.get("path") == "wake":
        took = f" ({report['wake_s']:g} s to serving)" if report.get("wake_s") is not None else ""
        lines.append(f"{'would wake' if planned else 'woke'} the parked {report.get('to')}{took}")
    elif acted and decision.get("previous") == "park" and (planned or report.get("park_s") is not None):
        lines.append(f"{'would park' if planned else 'parked'} {previous} (its weights to host memory, its process kept)"
                     + (f" in {report['park_s']:g} s" if report.get("park_s") is not None else ""))
    elif acted and decision.get("reason") and previous not in (None, "none", report.get("to")):
        lines.append(f"{'would stop' if planned else 'stopped'} {previous}, not parked: {decision['reason']}")
    if decision.get("evicted") and acted:
        lines.append(f"{'would evict' if planned else 'evicted'} the parked engine (torn down with the others)")
    if decision.get("cold_reason") and acted:
        lines.append(f"{report.get('to')} {'would start' if planned else 'started'} cold: {decision['cold_reason']}")
    parked = report.get("parked")
    if parked and not planned:
        left = parked.get("leftover_mib") or {}
        lines.append(f"parked: {parked.get('engine')} ({parked.get('model')}), {_gib(parked.get('host_memory_bytes') or 0)} of host memory, "
                     f"{max(left.values()) if left else 0} MiB kept on each of {len(left)} GPU(s)")
    return lines


def _gpu_holders(found) -> dict | None:
    """The GPU holders the preflight found outside the engine units: other users' (foreign) and the engines' own."""
    if not found:
        return None
    keys = ("pid", "user", "comm", "unit", "placement", "gpus")
    return {group: [{key: holder.get(key) for key in keys} for holder in found.get(group) or []] for group in ("foreign", "escaped")}


def stage_line(stage: dict, planned: bool) -> str:
    """One line of the table's details: what staging the target's model did (or, in check mode, would do)."""
    source = stage.get("source")
    removed = stage.get("removed") or []
    freed = (f"; {'would remove' if planned else 'removed'} {', '.join(item['path'] for item in removed)} "
             f"({_gib(sum(item['bytes'] for item in removed))}) to make room") if removed else ""
    if stage.get("error"):
        return f"stage of {source} failed: {stage['error']}"
    if stage.get("present"):
        return f"model {source} already staged in {stage.get('dest')}, complete: nothing fetched"
    gguf = stage.get("gguf") or {}
    if stage.get("deferred"):
        merge = f", merging its {gguf['parts']} parts" if gguf.get("merge") else ""
        return (f"{source} ({_gib(stage.get('bytes') or 0)}{merge}) fits only in place of the previous engine's model: "
                f"{'would be' if planned else 'was'} fetched inside the downtime")
    if planned:
        room = stage.get("room") or {}
        merge = (f", then merge its {gguf['parts']} parts into {gguf['file']} (room for both: {_gib(room.get('needed_bytes') or 0)})"
                 if gguf.get("merge") else "")
        return (f"would fetch {_gib(stage.get('bytes') or 0)} of {source} ({stage.get('files')} file(s)) into {stage.get('dest')}{merge}, "
                f"{_gib(room.get('free_bytes') or 0)} free{freed}")
    rate = f", {stage['rate_mib_s']} MiB/s" if stage.get("rate_mib_s") else ""
    resumed = f" (resumed: {_gib(stage['resumed_bytes'])} were there)" if stage.get("resumed_bytes") else ""
    merged = (f"; merged {gguf['parts']} parts into {gguf['file']} in {_seconds(gguf.get('seconds'))} s"
              + (f", {gguf['rate_mib_s']} MiB/s" if gguf.get("rate_mib_s") else "")) if gguf.get("merge") and gguf.get("bytes") else ""
    return (f"staged {source}: fetched {_gib(stage.get('bytes') or 0)} in {_seconds(stage.get('seconds'))} s{rate}{resumed}{merged} "
            f"before the drain{freed}")


def answer_lines(report: dict) -> list[str]:
    """What the answer checks before rotation found: the target's (a woken engine's first), the rollback's - or, in
    check mode, which check would run."""
    planned = (report.get("plan") or {}).get("answer_check")
    if planned:
        if not planned.get("kind"):
            return [f"would not check {report.get('to')}'s answers: {planned.get('reason')}"]
        against = (f"against its record of {_iso(planned['recorded_at'])}" if planned.get("kind") == "golden"
                   else f"(a sanity check: {planned.get('reason')})")
        return [f"would check {report.get('to')}'s answers before rotation {against}: {planned.get('probes')} probe(s)"]
    lines = []
    for label, checked in ((report.get("to"), report.get("answer_check")), (f"{report.get('from')} (rollback)", report.get("rollback_answer_check"))):
        if not checked:
            continue
        if checked.get("woken_mismatch"):
            lines.append(f"woken {label} answered differently: {checked['woken_mismatch']}; stopped and started cold")
        what = (f"{checked['kind']} check of {label}'s answers ({checked.get('probes')} probes, {_seconds(checked.get('seconds'))} s"
                + (f", largest logprob drift {checked['drift']:g}" if checked.get("drift") is not None else "") + ")")
        if checked.get("retried"):
            lines.append(f"a probe of {label} failed and was asked again: {checked['retried']}")
        if checked.get("passed"):
            lines.append(f"{what} passed" + ("; its answers are its record now" if checked.get("recorded") else ""))
        else:
            lines.append(f"{what} FAILED: {checked.get('mismatch')}")
    return lines


def replace_line(report: dict, planned: bool) -> str | None:
    """What replacing the previous engine's model did (or would do), where it applied or was refused."""
    replace = report.get("replace_model")
    if not replace:
        return None
    if replace.get("refused") and not replace.get("path"):
        return f"switch_engine_replace_model: {replace['refused']}"
    previous = report.get("from")
    estimate = (f"about {replace['estimate_s']:g} s at the last measured rate" if replace.get("estimate_s") is not None
                else "no download measured on this node yet to estimate it")
    if not replace.get("deferred"):
        return (f"the disk cannot hold both models: with switch_engine_replace_model, {replace.get('path')} ({_gib(replace.get('bytes') or 0)}) "
                f"would be removed after {previous}'s stop and the target fetched inside the downtime ({estimate})")
    if planned:
        return (f"the disk holds one model: would remove {previous}'s {replace.get('path')} ({_gib(replace.get('bytes') or 0)}) after its "
                f"stop, then fetch the target inside the downtime ({estimate}); a rollback would stage it again first")
    if replace.get("error"):
        line = f"the target's download inside the downtime failed: {replace['error']}"
    elif replace.get("removed"):
        line = (f"removed {previous}'s {replace.get('path')} ({_gib(replace.get('bytes') or 0)}) after its stop; fetched "
                f"{_gib(replace.get('fetched_bytes') or 0)} in {_seconds(replace.get('seconds'))} s inside the downtime (estimated: {estimate}); "
                "a rollback stages it again")
    else:
        line = f"{previous}'s model was not removed"
    restaged = replace.get("restaged")
    if restaged:
        line += ("; the rollback found it whole" if restaged.get("present")
                 else f"; the rollback staged it again: {_gib(restaged.get('bytes') or 0)} in {_seconds(restaged.get('seconds'))} s")
    return line


def not_reached_report(target: str | None, reason: str, serving: list | None = None) -> dict:
    """A host the run left as it was: behind a stopped rollout (``serving``: the engines it was seen serving, read
    without touching it), outside the limit, or never reached (``serving`` None: not known)."""
    return {"result": NOT_REACHED, "from": None, "to": target, "from_engine": None, "to_engine": None,
            "engines_found": [], "engines_serving": None if serving is None else list(serving),
            "reason": reason, "failed_phase": None,
            "rollback_error": None, "recovered_lease": None, "last_cutover": None, "started": None, "finished": None, "durations_s": {}, "phases": [],
            "out_of_rotation": None, "downtime_s": None, "downtime_parts_s": {}, "engine_start_s": None, "overhead_s": None,
            "preflight": [], "gpu_holders": None, "prewarm": None, "stage": None, "stage_draft": None, "stage_tokenizer": None,
            "replace_model": None, "answer_check": None, "answer_check_s": None, "rollback_answer_check": None, "plan": None,
            "terminated": [], "killed": [], "memory_before": [], "memory_after": [], "park": None, "standby": None,
            "park_s": None, "wake_s": None, "parked": None,
            "metrics_warnings": [], "escaped": []}


# --- the run documents --------------------------------------------------------------------------------------------------
def _summary(hosts: dict, results: tuple) -> dict:
    counts = {result: 0 for result in results}
    for report in hosts.values():
        counts[report["result"]] = counts.get(report["result"], 0) + 1
    return {"hosts": len(hosts), **counts}


def fleet_serving(hosts: dict, started=None) -> dict:
    """How many nodes served over the rollout, from each node's time out of rotation.

    A node serves when an engine answers its readiness, not when a unit is merely active (a crash loop is active):
    before its switch when an engine was seen serving at discovery, after it when it switched, rolled back, or was left
    serving (unchanged, failed before the drain). A node the run did not reach counts as it was seen serving (read
    without touching it) and is also counted apart (``untouched``); one this run did not read (outside --limit,
    unreachable) is neither serving nor down: it is counted in ``not_read`` and nowhere else. Reports without
    ``engines_serving`` (older runs) fall back to the engines found running. ``serving`` is a step series of
    [seconds since the run started, nodes serving], one point per change.
    """
    events, serving, untouched, not_read = [], 0, 0, 0
    for report in hosts.values():
        seen = report.get("engines_serving")
        was = bool(seen) if seen is not None else bool(report.get("engines_found"))
        if report["result"] == NOT_REACHED:
            untouched += 1
            not_read += seen is None
            serving += was if seen is not None else 0
            continue
        out = report.get("out_of_rotation")
        serving += was
        if out:
            if was:
                events.append((out[0], -1))
            if out[1] is not None:
                events.append((out[1], +1))
    origin = float(started) if started is not None else min([event[0] for event in events], default=0.0)
    series, count = [[0.0, serving]], serving
    lowest = serving
    for time, change in sorted(events):
        count += change
        lowest = min(lowest, count)
        series.append([round(time - origin, 2), count])
    return {"nodes": len(hosts), "untouched": untouched, "not_read": not_read, "serving_at_start": serving, "serving_at_end": count,
            "min_serving": lowest, "serving": series}


def switch_run_report(host_reports: dict, run: dict) -> dict:
    """The switch_engine JSON document: the run, a summary and every host of the run (``None``: not reached)."""
    target = run.get("target")
    outside_limit = set(run.get("not_in_limit") or [])
    hosts = {}
    for host in sorted(host_reports):
        report = host_reports[host]
        if not report:
            report = not_reached_report(target, NOT_IN_LIMIT if host in outside_limit else "unreachable before its switch began")
        hosts[host] = report
    return {
        "schema_version": SCHEMA_VERSION,
        "playbook": "switch_engine",
        "run_id": run.get("run_id"),
        "target": target,
        "check_mode": bool(run.get("check_mode")),
        "started": _iso(run.get("started")),
        "finished": _iso(run.get("finished")),
        "parameters": dict(run.get("parameters") or {}),
        "summary": _summary(hosts, SWITCH_RESULTS),
        "fleet": fleet_serving(hosts, run.get("started")),
        "hosts": hosts,
    }


def merge_run_reports(documents: list) -> dict:
    """One fleet report from the reports of the slices of one run (AWX/AAP job slicing, or runs with disjoint --limit):
    every host once, with the report of the slice that ran it (a host outside a slice's limit is taken from the slice
    that reached it); the summary, the fleet's serving count and the run's times over all of them, each slice's own in
    ``slices``. Refuses reports of different playbooks or targets, and a host two slices ran (overlapping slices)."""
    documents = [doc for doc in documents if doc]
    if not documents:
        raise ReportError("merge: no report to merge")
    kinds = sorted({(doc.get("playbook"), doc.get("target")) for doc in documents}, key=str)
    if len(kinds) != 1 or kinds[0][0] not in ("switch_engine", "gpu_cleanup"):
        runs = ", ".join(" ".join(str(part) for part in kind if part) for kind in kinds)
        raise ReportError(f"merge: the reports are of different runs: {runs}")
    playbook, target = kinds[0]
    hosts: dict = {}
    ran_by: dict = {}
    for index, doc in enumerate(documents):
        for host, report in (doc.get("hosts") or {}).items():
            outside = report.get("result") == NOT_REACHED and report.get("reason") == NOT_IN_LIMIT
            if host in ran_by and not outside:
                raise ReportError(f"merge: {host} was run by slices {ran_by[host] + 1} and {index + 1} (the slices overlap)")
            if not outside:
                ran_by[host] = index
                hosts[host] = report
            else:
                hosts.setdefault(host, report)
    hosts = dict(sorted(hosts.items()))
    started = min((_unix(doc.get("started")) for doc in documents if doc.get("started")), default=None)
    finished = max((_unix(doc.get("finished")) for doc in documents if doc.get("finished")), default=None)
    merged = {
        "schema_version": SCHEMA_VERSION,
        "playbook": playbook,
        "check_mode": any(doc.get("check_mode") for doc in documents),
        "started": _iso(started),
        "finished": _iso(finished),
        "parameters": dict(documents[0].get("parameters") or {}),
        "summary": _summary(hosts, SWITCH_RESULTS if playbook == "switch_engine" else TEARDOWN_RESULTS),
        "hosts": hosts,
        "slices": [{"run_id": doc.get("run_id"), "started": doc.get("started"), "finished": doc.get("finished"),
                    "hosts": sorted(host for host, index in ran_by.items() if index == position), "summary": doc.get("summary")}
                   for position, doc in enumerate(documents)],
    }
    if playbook == "switch_engine":
        merged.update(run_id=None, target=target, fleet=fleet_serving(hosts, started))
    return merged


def _unix(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def teardown_run_report(host_reports: dict, run: dict) -> dict:
    """The gpu_cleanup JSON document."""
    outside_limit = set(run.get("not_in_limit") or [])
    hosts = {}
    for host in sorted(host_reports):
        report = host_reports[host]
        if not report:
            report = dict(teardown_host_report({}), result="not_reached",
                          reason=NOT_IN_LIMIT if host in outside_limit else "unreachable before its teardown began")
        hosts[host] = report
    return {
        "schema_version": SCHEMA_VERSION,
        "playbook": "gpu_cleanup",
        "check_mode": bool(run.get("check_mode")),
        "started": _iso(run.get("started")),
        "finished": _iso(run.get("finished")),
        "parameters": dict(run.get("parameters") or {}),
        "summary": _summary(hosts, TEARDOWN_RESULTS),
        "hosts": hosts,
    }


# --- tables -------------------------------------------------------------------------------------------------------------
def _shorten(text: str, width: int = CMDLINE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(headers: list[str], rows: list[list]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)] if rows else [len(h) for h in headers]
    line = "  ".join(f"{{:<{width}}}" for width in widths)
    out = [line.format(*headers), line.format(*["-" * width for width in widths])]
    out += [line.format(*[str(cell) for cell in row]) for row in rows]
    return "\n".join(line.rstrip() for line in out)


def _memory(gpus: list[dict]) -> str:
    if not gpus:
        return "-"
    return " ".join(f"{gpu['index']}:{gpu['used_mib']}" for gpu in gpus)


def teardown_table(document: dict) -> str:
    """One row per host, then every process terminated or killed with its command line."""
    rows = []
    details = []
    for host, report in sorted((document.get("hosts") or {}).items()):
        units = report.get("units") or []
        stopped = [u["unit"] for u in units if u.get("changed")]
        # in check mode nothing was stopped: the reading after is the one before, so it is not shown as a result
        after = "not measured (--check)" if report.get("check_mode") else _memory(report.get("memory_after") or [])
        rows.append([host, report.get("result"), ",".join(stopped) or "-", len(_teardown_processes(report, "terminated")),
                     len(_teardown_processes(report, "killed")), len(report.get("protected") or []),
                     _memory(report.get("memory_before") or []), after])
        if report.get("result") == "failed":
            details.append(f"{host}: FAILED at '{report.get('failed_step')}': {report.get('reason')}")
        elif report.get("result") == "not_reached":
            details.append(f"{host}: {report.get('reason')}")
        for unit in units:
            if unit.get("triggers_stopped"):
                details.append(f"{host}: {unit['unit']}: triggers stopped first: {', '.join(unit['triggers_stopped'])}")
            for kind in ("terminated", "killed"):
                for process in unit.get(kind) or []:
                    details.append(f"{host}: {unit['unit']}: {kind} {process['pid']} {_shorten(process['cmdline'])}")
            for warning in unit.get("warnings") or []:
                details.append(f"{host}: {unit['unit']}: warning: {warning}")
        for kind in ("terminated", "killed"):
            for process in report.get(kind) or []:
                details.append(f"{host}: holder {kind} {process['pid']} {_shorten(process['cmdline'])}")
        parked = report.get("parked") or {}
        if parked.get("fate") == "evicted":
            details.append(f"{host}: {'would evict' if report.get('check_mode') else 'evicted'} the parked {parked['engine']} "
                           f"({parked['unit']}), the node's fast way back to it; gpu_teardown_keep_parked: true keeps it")
        elif parked.get("fate") == "kept":
            details.append(f"{host}: {'would keep' if report.get('check_mode') else 'kept'} the parked {parked['engine']} ({parked['unit']}) "
                           "running, its processes unsignalled (gpu_teardown_keep_parked)")
        elif parked.get("fate") == "not parked":
            details.append(f"{host}: no engine is parked any more: {parked.get('reason')}")
        for process in report.get("planned") or []:
            mine = " - the parked engine" if parked.get("fate") == "evicted" and process.get("unit") == parked.get("unit") else ""
            details.append(f"{host}: would signal {process['pid']} ({whose(process)}{mine}) {_shorten(process['cmdline'])}")
        for process in report.get("protected") or []:
            details.append(f"{host}: protected {process['pid']} {process.get('comm')} ({process.get('reason')})")
        for process in report.get("outside") or []:
            details.append(f"{host}: outside the units {process['pid']} {process.get('comm')} in {process.get('unit') or 'no unit'}"
                           f" ({process.get('placement')}): not signalled")
        fates = {p["pid"]: fate for fate, key in (("would be signalled", "planned"), ("terminated", "terminated"), ("killed", "killed"))
                 for p in report.get(key) or []}
        for process in report.get("foreign") or []:
            details.append(f"{host}: ANOTHER USER'S GPU process {process['pid']} {process.get('comm')} (user {process.get('user')}, "
                           f"{process.get('unit') or 'no unit'}, {process.get('placement')}): {fates.get(process['pid'], 'not signalled')}")
    headers = ["host", "result", "units stopped", "terminated", "killed", "protected", "MiB before (gpu:used)", "MiB after"]
    return _table(headers, rows) + ("\n\n" + "\n".join(details) if details else "")


def _seconds(value) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def switch_table(document: dict) -> str:
    """One row per host: from, to, result, downtime and its main parts; then reasons, plans and processes killed."""
    rows = []
    details = []
    for host, report in sorted((document.get("hosts") or {}).items()):
        durations = report.get("durations_s") or {}
        rows.append([host, engine_label(report, "from"), engine_label(report, "to"), report.get("result"), _seconds(report.get("downtime_s")),
                     _seconds(report.get("engine_start_s")),
                     _seconds(durations.get("drain")), _seconds(durations.get("teardown")), _seconds(durations.get("bring_up")),
                     _seconds(durations.get("verify")), _seconds(durations.get("total")), len(report.get("killed") or [])])
        if len(report.get("engines_found") or []) > 1:
            details.append(f"{host}: engines found running: {', '.join(report['engines_found'])}")
        if report.get("reason"):
            phase = f" at {report['failed_phase']}" if report.get("failed_phase") else ""
            details.append(f"{host}: {report['result']}{phase}: {report['reason']}")
        if report.get("rollback_error"):
            details.append(f"{host}: ROLLBACK FAILED, NO ENGINE IS SERVING: {report['rollback_error']}")
        last = report.get("last_cutover")
        if last and report.get("result") != SWITCHED:
            details.append(f"{host}: its last cutover was another run's ({last.get('run_id')}, {last.get('finished')}): "
                           f"{last.get('result')} from {last.get('previous') or 'none'} to {last.get('target')}")
        recovered = report.get("recovered_lease")
        if recovered and recovered.get("unreadable"):
            details.append(f"{host}: took over a switch lease that could not be read - {recovered['unreadable']}")
        elif recovered:
            how = "broken (its run is gone)" if recovered.get("broken") else "expired"
            details.append(f"{host}: took over the {how} switch lease of {recovered.get('owner')}")
        plan = report.get("plan")
        if plan:
            running = plan.get("running_requests")
            if report.get("from") in (None, "none"):
                draining = "would drain nothing (no engine running)"
            elif running is None:
                draining = f"would drain {report['from']} (its running requests could not be read)"
            else:
                draining = f"would drain {running:g} running request(s)"
            details.append(f"{host}: {draining}, stop "
                           f"{', '.join(plan.get('units_to_stop') or []) or 'no unit'} ({plan.get('unit_processes', 0)} GPU process(es) in "
                           f"them), signal {len(plan.get('processes_to_signal') or [])} other GPU process(es); "
                           f"GPU MiB used (gpu:MiB) {_memory(plan.get('gpus') or [])}")
            install = plan.get("target_install")
            if install:
                details.append(f"{host}: would install {report.get('to')} {install.get('version')} "
                               f"(now {install.get('installed') or 'not installed'}) before the drain")
            changes = [name for name, changed in (plan.get("target_files_change") or {}).items() if changed]
            if changes:
                details.append(f"{host}: would write {report.get('to')}'s {' and '.join(changes)} (--diff shows the unit)")
            for process in plan.get("processes_to_signal") or []:
                details.append(f"{host}: would signal {process.get('pid')} ({whose(process)}) {_shorten(process.get('cmdline') or '')}")
        for stage in (report.get("stage"), report.get("stage_draft"), report.get("stage_tokenizer")):
            if stage:
                details.append(f"{host}: {stage_line(stage, bool(plan))}")
        replaced = replace_line(report, bool(plan))
        if replaced:
            details.append(f"{host}: {replaced}")
        details += [f"{host}: {line}" for line in answer_lines(report)]
        prewarm = report.get("prewarm")
        if prewarm and prewarm.get("bytes"):
            details.append(f"{host}: prewarm read {_gib(prewarm['bytes'])} of weights in {_seconds(prewarm.get('seconds'))} s"
                           + ("" if prewarm.get("finished") else " (stopped at its time limit)"))
        elif prewarm and prewarm.get("skipped_reason") and not plan:
            details.append(f"{host}: prewarm skipped: {prewarm['skipped_reason']}")
        details += [f"{host}: {line}" for line in park_lines(report, bool(plan))]
        for process in report.get("killed") or []:
            details.append(f"{host}: killed {process.get('pid')} {_shorten(process.get('cmdline') or '')}")
    headers = ["host", "from", "to", "result", "downtime s", "engine start s", "drain s", "teardown s", "bring-up s", "verify s", "total s", "killed"]
    fleet = document.get("fleet")
    summary = []
    if fleet and fleet.get("nodes"):
        not_read = fleet.get("not_read") or 0
        seen = fleet["untouched"] - not_read if fleet.get("untouched") else 0
        summary = [f"serving: {fleet['serving_at_start']} of {fleet['nodes'] - not_read} node(s) at the start, {fleet['serving_at_end']} at the end, "
                   f"never fewer than {fleet['min_serving']} (a node serves when its engine answers readiness)"
                   + (f"; {seen} node(s) not reached, counted as they were seen serving" if seen else "")
                   + (f"; {not_read} node(s) not read in this run (outside --limit, or unreachable before its switch): "
                      "not counted, neither serving nor down" if not_read else "")]
    return _table(headers, rows) + ("\n\n" + "\n".join(summary + details) if summary or details else "")
