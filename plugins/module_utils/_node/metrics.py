# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Each node's own state for Prometheus, through node_exporter's textfile collector.

The node keeps what the metrics say in a state file (counters included, so that they never go backwards across runs
or reboots); the node-local step of a run (engine_cutover, node_teardown) folds its outcome into it and writes the
whole exposition again, with prometheus_client's own code, into ``<directory>/gpufleet_serving.prom`` (a temporary
file in the same directory, then a rename). Metrics never fail a run: every failure here is returned as a warning.

METRICS is the one list of what is written (docs/metrics.md is held against it). Labels never carry a pid, a run id
or a timestamp on a counter: their values come from small fixed sets (results, signals, refusal reasons, phases).
"""

from __future__ import annotations

import json
import os
import time

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results

# the directory Debian's and Ubuntu's prometheus-node-exporter package reads (--collector.textfile.directory)
DEFAULT_DIRECTORY = paths.METRICS_DIR
FILE_NAME = "gpufleet_serving.prom"
STATE_PATH = paths.METRICS_STATE
PREFIX = "gpufleet_"

# (name without the prefix, type, labels, meaning): every metric the node publishes
METRICS = (
    ("engine_info", "gauge", ("engine", "version", "model", "state"),
     "The engines the last run left on the node: state serving, parked or none (1 per engine)"),
    ("last_run_timestamp_seconds", "gauge", ("playbook",), "When the last run of each playbook ended on this node"),
    ("last_run_info", "gauge", ("playbook", "result"), "The last run's result per playbook (1)"),
    ("last_switch_downtime_seconds", "gauge", (), "The last switch's time out of service, as the node measured it (drain to serving)"),
    ("last_switch_engine_start_seconds", "gauge", (), "The last switch's engine start (its unit start, or its wake, to serving)"),
    ("last_switch_wake_seconds", "gauge", (), "The last switch's wake of a parked engine (0 when it started cold)"),
    ("last_switch_park_seconds", "gauge", (), "The last switch's park of the previous engine (0 when it stopped it)"),
    ("last_switch_phase_seconds", "gauge", ("phase",), "Each phase of the last switch on the node"),
    ("switches_total", "counter", ("result",), "Switches by result: switched, rolled_back, rollback_failed, preflight_failed, failed"),
    ("signals_total", "counter", ("signal",), "Signals sent to GPU holders and engine units' processes"),
    ("refusals_total", "counter", ("reason",),
     "Runs refused before anything was stopped: foreign_holders, restarting_service, too_many_targets, preflight"),
    ("foreign_holders_total", "counter", (), "Other users' GPU processes found by a teardown or a switch"),
    ("answer_check_failures_total", "counter", ("kind",),
     "Engines that served but answered wrongly before rotation: golden (otherwise than their record), sanity (garbage, or "
     "not the operator's expectation), woken (a woken engine, then started cold), rollback (the previous engine after a rollback)"),
    ("gpu_memory_used_bytes", "gauge", ("gpu", "UUID"), "Each GPU's used memory after the last teardown (labels as DCGM exporter's)"),
    ("parked_engine_host_memory_bytes", "gauge", ("engine",), "The parked engine's host memory (its weights' copy included)"),
    ("parked_since_timestamp_seconds", "gauge", ("engine",), "When the parked engine parked"),
    ("lease_info", "gauge", ("owner",), "The run holding the node's switch lease (1), absent when none holds it"),
    ("lease_expiry_timestamp_seconds", "gauge", (), "When the node's switch lease expires (0 when none holds it)"),
)
SWITCH_RESULTS = results.CUTOVER
# each counter's labels, written from the first run on (at 0), so that increase() sees the first of each
BASELINE = {"signals": ("SIGTERM", "SIGCONT", "SIGKILL"),
            "refusals": ("foreign_holders", "restarting_service", "too_many_targets", "preflight", "lease_held"),
            "answer_check_failures": ("golden", "sanity", "woken", "rollback")}


def empty_state() -> dict:
    return {"engines": [], "last_run": {}, "last_switch": None,
            "counters": {"switches": {}, "signals": {}, "refusals": {}, "foreign_holders": 0, "answer_check_failures": {}},
            "gpus": [], "parked": None, "lease": None}


def load_state(path: str) -> dict:
    """The node's metrics state, or an empty one (none yet, or unreadable: counters start again rather than fail a run)."""
    state = empty_state()
    stored = files.read_json_object(path)
    if stored:
        state.update({key: value for key, value in stored.items() if key in state})
        state["counters"] = {**empty_state()["counters"], **(stored.get("counters") or {})}
    return state


def count(state: dict, counter: str, label: str | None = None, by: int = 1) -> None:
    counters = state["counters"]
    if label is None:
        counters[counter] = int(counters.get(counter) or 0) + by
    else:
        counters[counter][label] = int(counters[counter].get(label) or 0) + by


def count_teardown(state: dict, steps: dict | None) -> None:
    """Signals sent, foreign holders found, a refusal, and each GPU's memory after, from a teardown's steps."""
    if not steps:
        return
    holders = steps.get("holders") or {}
    for sent in holders.get("signals") or []:
        if sent.get("result") == "sent":
            count(state, "signals", str(sent.get("signal") or "unknown"))
    for unit in (steps.get("units") or {}).get("results") or []:
        for sent in unit.get("signals") or []:
            if sent.get("result") == "sent":
                count(state, "signals", str(sent.get("signal") or "unknown"))
    count(state, "foreign_holders", by=len(holders.get("foreign") or []))
    # a refused plan: the holders step failed naming what it would not signal (nothing was)
    if holders.get("failed") and not holders.get("signals") and (holders.get("outside") or holders.get("restarting") or holders.get("targets")):
        count(state, "refusals", refusal_reason(holders))
    after = (steps.get("after") or {}).get("gpus")
    if after:
        state["gpus"] = [{"gpu": str(gpu.get("index")), "uuid": gpu.get("uuid") or "", "used_bytes": int(gpu.get("used_mib") or 0) << 20}
                         for gpu in after if gpu.get("used_mib") is not None]


def refusal_reason(holders: dict) -> str:
    if holders.get("restarting"):
        return "restarting_service"
    if holders.get("outside"):
        return "foreign_holders"
    return "too_many_targets"


def record_switch(state: dict, result: dict, engines: list[dict], now: float) -> None:
    """A cutover's outcome: the counters, the last switch's times (the node's own marks), the engines it left."""
    outcome = result.get("result")
    if outcome in SWITCH_RESULTS:
        count(state, "switches", outcome)
    if outcome == "preflight_failed":
        count(state, "refusals", "preflight")
    for teardown in (result.get("teardown"), result.get("rollback_teardown")):
        count_teardown(state, teardown)
    count_answer_failures(state, result)
    marks = result.get("marks") or []
    if outcome in results.ACTED:
        state["last_switch"] = {"downtime_seconds": out_of_service(marks), "engine_start_seconds": result.get("engine_start_s"),
                                "wake_seconds": (result.get("wake") or {}).get("wake_s") or 0.0,
                                "park_seconds": (result.get("park") or {}).get("seconds") if (result.get("park") or {}).get("parked") else 0.0,
                                "phases": phase_seconds(marks)}
    state["engines"] = engines
    state["last_run"]["switch_engine"] = {"result": outcome, "timestamp": round(now, 3)}


def count_answer_failures(state: dict, result: dict) -> None:
    """Each answer check that failed: the target's by its kind, a woken engine's before its cold start, the rollback's."""
    checked = result.get("answer_check") or {}
    if (checked.get("after_wake") or {}).get("passed") is False:
        count(state, "answer_check_failures", "woken")
    if checked and not checked.get("passed"):
        count(state, "answer_check_failures", checked.get("kind") or "sanity")
    rollback = result.get("rollback_answer_check") or {}
    if (rollback.get("after_wake") or {}).get("passed") is False:
        count(state, "answer_check_failures", "woken")
    if rollback.get("passed") is False:
        count(state, "answer_check_failures", "rollback")


def out_of_service(marks: list) -> float | None:
    """From the drain (or the teardown, when nothing served) to the soak or the end: the node's downtime."""
    names = [mark[0] for mark in marks]
    start = next((float(when) for phase, when in marks if phase in ("drain", "park", "teardown")), None)
    end = next((float(when) for phase, when in marks if phase in ("soak", "end")), None) if "end" in names or "soak" in names else None
    return round(end - start, 3) if start is not None and end is not None else None


def phase_seconds(marks: list) -> dict:
    return {phase: round(float(marks[index + 1][1]) - float(when), 3) for index, (phase, when) in enumerate(marks[:-1])}


def record_teardown(state: dict, result: dict, now: float, engines: list[dict] | None = None) -> None:
    """A teardown's outcome (node_teardown: the cleanup, the teardown role)."""
    steps = result.get("steps") or {}
    count_teardown(state, steps)
    if result.get("result") == "lease_held":
        count(state, "refusals", "lease_held")
    if engines is not None:
        state["engines"] = engines
    state["last_run"]["gpu_teardown"] = {"result": "ok" if result.get("result") == "done" else result.get("result"), "timestamp": round(now, 3)}


def collect(state: dict) -> list:
    """The metric families of ``state``, by prometheus_client's own types."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415 - only where metrics are written

    meaning = {name: (kind, labels, text) for name, kind, labels, text in METRICS}
    families = {}

    def family(name: str):
        if name not in families:
            kind, labels, text = meaning[name]
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            # a counter family's name is given without _total (prometheus_client adds it)
            families[name] = cls(PREFIX + (name[: -len("_total")] if kind == "counter" else name), text, labels=list(labels))
        return families[name]

    for engine in state.get("engines") or []:
        family("engine_info").add_metric([str(engine.get(key) or "") for key in ("engine", "version", "model", "state")], 1)
    for playbook, run in sorted((state.get("last_run") or {}).items()):
        family("last_run_timestamp_seconds").add_metric([playbook], float(run.get("timestamp") or 0))
        family("last_run_info").add_metric([playbook, str(run.get("result") or "")], 1)
    switch = state.get("last_switch") or {}
    for key in ("downtime_seconds", "engine_start_seconds", "wake_seconds", "park_seconds"):
        if switch.get(key) is not None:
            family(f"last_switch_{key}").add_metric([], float(switch[key]))
    for phase, seconds in sorted((switch.get("phases") or {}).items()):
        family("last_switch_phase_seconds").add_metric([phase], float(seconds))
    counters = state.get("counters") or {}
    for result in SWITCH_RESULTS:
        family("switches_total").add_metric([result], float((counters.get("switches") or {}).get(result) or 0))
    for counter, known in BASELINE.items():
        values = {**dict.fromkeys(known, 0), **(counters.get(counter) or {})}
        for label, value in sorted(values.items()):
            family(f"{counter}_total").add_metric([label], float(value))
    family("foreign_holders_total").add_metric([], float(counters.get("foreign_holders") or 0))
    for gpu in state.get("gpus") or []:
        family("gpu_memory_used_bytes").add_metric([gpu["gpu"], gpu["uuid"]], float(gpu["used_bytes"]))
    parked = state.get("parked")
    if parked:
        family("parked_engine_host_memory_bytes").add_metric([parked["engine"]], float(parked.get("host_memory_bytes") or 0))
        family("parked_since_timestamp_seconds").add_metric([parked["engine"]], float(parked.get("since") or 0))
    lease = state.get("lease")
    if lease:
        family("lease_info").add_metric([str(lease["owner"])], 1)
    family("lease_expiry_timestamp_seconds").add_metric([], float((lease or {}).get("expires") or 0))
    return list(families.values())


def publish(state: dict, directory: str, state_path: str = STATE_PATH) -> list[str]:
    """Keep ``state`` and write the exposition into ``directory``; the warnings (none when both were written)."""
    warnings = []
    try:
        files.write_atomically(state_path, json.dumps(state, sort_keys=True) + "\n", 0o644)
    except OSError as exc:
        warnings.append(f"metrics state {state_path}: {exc.strerror or exc} (counters not kept)")
    if not directory:
        return warnings
    try:  # imported here: a run that writes no metrics does not pay for it
        from prometheus_client import CollectorRegistry, write_to_textfile  # noqa: PLC0415
    except ImportError:  # a node without it: a warning, never a failure
        return warnings + ["metrics not written: the node has no prometheus-client (pip install prometheus-client)"]

    class Collector:
        def collect(self):
            return collect(state)

    registry = CollectorRegistry()
    registry.register(Collector())
    try:
        os.makedirs(directory, exist_ok=True)
        write_to_textfile(os.path.join(directory, FILE_NAME), registry)  # a temporary file beside it, then renamed
    except OSError as exc:
        warnings.append(f"metrics not written to {directory}: {exc.strerror or exc}")
    return warnings


def lease_state(view: dict, now: float | None = None) -> dict | None:
    """The lease as the metrics keep it: its owner and its expiry in unix seconds (the lease counts in boot seconds)."""
    if not view or not view.get("owner") or view.get("expires_in") is None:
        return None
    return {"owner": view["owner"], "expires": round((now or time.time()) + float(view["expires_in"]), 3)}
