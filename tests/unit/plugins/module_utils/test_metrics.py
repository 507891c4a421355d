"""The node's Prometheus metrics: what a cutover and a teardown fold into the node's state, written with
prometheus_client's exposition code and read back with its parser; counters kept across runs; a directory that cannot
be written is a warning; docs/metrics.md is the list the code writes."""

from __future__ import annotations

import re

from conftest import REPO
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.serving.plugins.module_utils._node import metrics

MARKS = [["drain", 100.0], ["park", 100.5], ["teardown", 100.8], ["bring_up", 101.2], ["soak", 103.0], ["end", 106.0]]
TEARDOWN = {"holders": {"signals": [{"pid": 1, "signal": "SIGTERM", "result": "sent"}, {"pid": 1, "signal": "SIGKILL", "result": "sent"},
                                    {"pid": 2, "signal": "SIGTERM", "result": "gone"}],
                        "foreign": [{"pid": 9}]},
            "after": {"gpus": [{"index": 0, "uuid": "GPU-a", "used_mib": 600}, {"index": 1, "uuid": "GPU-b", "used_mib": 0}]}}
SWITCHED = {"result": "switched", "marks": MARKS, "teardown": TEARDOWN, "engine_start_s": 1.8, "park": {"parked": True, "seconds": 0.3},
            "wake": None}
ENGINES = [{"engine": "sglang", "version": "0.5.23", "model": "llama70b", "state": "serving"},
           {"engine": "vllm", "version": "0.33.0", "model": "llama70b", "state": "parked"}]


def read(directory) -> dict:
    text = (directory / metrics.FILE_NAME).read_text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_switch_is_published_with_its_engines_times_and_counters(tmp_path):
    state = metrics.load_state(str(tmp_path / "state.json"))
    metrics.record_switch(state, SWITCHED, ENGINES, now=1_800_000_000.0)
    state["parked"] = {"engine": "vllm", "host_memory_bytes": 70 * 2**30, "since": 1_799_999_000.0}
    state["lease"] = metrics.lease_state({"owner": "run-1", "expires_in": 60.0}, now=1_800_000_000.0)
    assert metrics.publish(state, str(tmp_path / "textfile"), str(tmp_path / "state.json")) == []
    samples = read(tmp_path / "textfile")
    assert samples[("gpufleet_engine_info", (("engine", "vllm"), ("model", "llama70b"), ("state", "parked"), ("version", "0.33.0")))] == 1
    assert samples[("gpufleet_last_switch_downtime_seconds", ())] == 3.0, "drain to the soak's start, on the node's clock"
    assert samples[("gpufleet_last_switch_park_seconds", ())] == 0.3 and samples[("gpufleet_last_switch_wake_seconds", ())] == 0
    assert samples[("gpufleet_last_switch_phase_seconds", (("phase", "park"),))] == 0.3
    assert samples[("gpufleet_switches_total", (("result", "switched"),))] == 1
    assert samples[("gpufleet_switches_total", (("result", "rolled_back"),))] == 0, "every result present from the start"
    assert samples[("gpufleet_signals_total", (("signal", "SIGTERM"),))] == 1, "a signal that reached nothing is not counted"
    assert samples[("gpufleet_foreign_holders_total", ())] == 1
    assert samples[("gpufleet_gpu_memory_used_bytes", (("UUID", "GPU-a"), ("gpu", "0")))] == 600 * 2**20, "labelled as DCGM exporter's"
    assert samples[("gpufleet_parked_engine_host_memory_bytes", (("engine", "vllm"),))] == 70 * 2**30
    assert samples[("gpufleet_lease_info", (("owner", "run-1"),))] == 1
    assert samples[("gpufleet_lease_expiry_timestamp_seconds", ())] == 1_800_000_060.0
    assert samples[("gpufleet_last_run_info", (("playbook", "switch_engine"), ("result", "switched")))] == 1


def test_counters_never_go_backwards_across_runs_and_carry_no_unbounded_label(tmp_path):
    path = str(tmp_path / "state.json")
    for result in ("switched", "rolled_back", "switched"):
        state = metrics.load_state(path)
        metrics.record_switch(state, dict(SWITCHED, result=result), ENGINES, now=1.0)
        metrics.publish(state, str(tmp_path), path)
    samples = read(tmp_path)
    assert samples[("gpufleet_switches_total", (("result", "switched"),))] == 2
    assert samples[("gpufleet_switches_total", (("result", "rolled_back"),))] == 1
    assert samples[("gpufleet_signals_total", (("signal", "SIGKILL"),))] == 3
    counters = {name for name, kind, _labels, _text in metrics.METRICS if kind == "counter"}
    labels = {label for name, kind, names, _text in metrics.METRICS if kind == "counter" for label in names}
    assert labels <= {"result", "signal", "reason", "kind"}, "no pid, run id or timestamp in a counter's labels"
    assert all(name.endswith("_total") for name in counters)


def test_a_refusal_is_counted_by_its_reason_and_a_teardown_by_its_playbook(tmp_path):
    state = metrics.load_state(str(tmp_path / "none.json"))
    refused = {"result": "failed", "steps": {"failed_step": "Decide | ...", "holders": {"failed": True, "outside": [{"pid": 5}], "foreign": [{"pid": 5}]}}}
    metrics.record_teardown(state, refused, now=5.0)
    assert state["counters"]["refusals"] == {"foreign_holders": 1} and state["counters"]["foreign_holders"] == 1
    assert state["last_run"]["gpu_teardown"] == {"result": "failed", "timestamp": 5.0}
    metrics.record_switch(state, {"result": "preflight_failed", "marks": []}, ENGINES, now=6.0)
    assert state["counters"]["refusals"] == {"foreign_holders": 1, "preflight": 1} and state["last_switch"] is None


def test_metrics_never_fail_a_run(tmp_path):
    state = metrics.load_state(str(tmp_path / "state.json"))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    warnings = metrics.publish(state, str(blocked / "textfile"), str(tmp_path / "state.json"))
    assert len(warnings) == 1 and warnings[0].startswith(f"metrics not written to {blocked / 'textfile'}")
    (tmp_path / "state.json").write_text("{broken")
    assert metrics.load_state(str(tmp_path / "state.json")) == metrics.empty_state(), "an unreadable state starts again"


def test_docs_metrics_table_is_what_the_code_writes():
    text = (REPO / "docs" / "metrics.md").read_text()
    documented = {(name, kind, tuple(label.strip("` ") for label in labels.split(",") if label.strip("` -")))
                  for name, kind, labels in re.findall(r"^\| `gpufleet_(\w+)` \| (gauge|counter) \| ([^|]*) \|", text, re.M)}
    written = {(name, kind, labels) for name, kind, labels, _text in metrics.METRICS}
    assert documented == written


def test_wrong_answers_are_counted_by_kind_from_zero(tmp_path):
    """gpufleet_answer_check_failures_total: written at 0 for every kind from the first run; a woken engine that answered
    otherwise (then passed cold) counts as woken, a rollback's previous engine as rollback."""
    state = metrics.load_state(str(tmp_path / "state.json"))
    metrics.record_switch(state, SWITCHED, ENGINES, now=1_800_000_000.0)
    metrics.publish(state, str(tmp_path / "textfile"), str(tmp_path / "state.json"))
    assert {labels: value for (name, labels), value in read(tmp_path / "textfile").items() if name == "gpufleet_answer_check_failures_total"} == {
        (("kind", kind),): 0.0 for kind in ("golden", "sanity", "woken", "rollback")}
    woken = dict(SWITCHED, answer_check={"kind": "golden", "passed": True, "after_wake": {"kind": "golden", "passed": False}})
    failed = dict(SWITCHED, result="rollback_failed", answer_check={"kind": "sanity", "passed": False},
                  rollback_answer_check={"kind": "golden", "passed": False})
    for result in (woken, failed):
        metrics.record_switch(state, result, ENGINES, now=1_800_000_100.0)
    metrics.publish(state, str(tmp_path / "textfile"), str(tmp_path / "state.json"))
    samples = read(tmp_path / "textfile")
    assert [samples[("gpufleet_answer_check_failures_total", (("kind", kind),))] for kind in ("golden", "sanity", "woken", "rollback")] == [0, 1, 1, 1]
