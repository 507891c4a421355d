"""node_teardown's run (_teardown/run.py) on a scripted node: the check-mode plan, the lease, the parked engine's fate
and the steps asked for - the cases its mutants showed untested (the module on a real node: molecule/teardown_units)."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import LeaseStore
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown import run as teardown_run


class ScriptedNode:
    """The node operations a teardown calls, recorded; the parked engine's unit answers as ``parked_unit`` says."""

    def __init__(self, refuse: Error | None = None, parked_unit: dict | None = None):
        self.calls: list[tuple] = []
        self.refuse = refuse
        self.parked_unit = parked_unit or {"ActiveState": "active", "InvocationID": "inv-1"}

    def memory(self, wait, left_pids=()):
        self.calls.append(("memory", wait))
        return {"gpus": [{"index": 0, "used_mib": 900 if not wait else 0}]}

    def stop_units(self, units, stop_timeout, check_mode=False):
        self.calls.append(("stop_units", tuple(units), check_mode))
        return {"results": [{"unit": unit, "changed": not check_mode, "state_after": {}} for unit in units]}

    def decide(self, units, *kept):
        self.calls.append(("decide", tuple(units), *kept))
        if self.refuse:
            raise self.refuse
        return {"targets": []}

    def kill_holders(self, units, *kept, **options):
        self.calls.append(("kill_holders", tuple(units), *kept))
        return {"changed": False}

    def reset_failed(self, units):
        self.calls.append(("reset_failed", tuple(units)))

    def unit_properties(self, unit):
        return dict(self.parked_unit)


def params(tmp_path, **overrides) -> dict:
    return {"units": ["vllm", "sglang.service"], "steps": ["units", "holders", "memory"], "stop_timeout": 7.0, "kill_timeout": 4.0,
            "term_timeout": 5.0, "memory_timeout": 11.0, "holders_kill_timeout": None, "run_id": "run-1", "lease": False,
            "lease_name": None, "lease_wait": 0, "break_owner": "", "measure_before": True, "keep_parked": False, "kept_units": [],
            "parked_path": str(tmp_path / "parked.json"), "metrics_dir": None} | overrides


def park(tmp_path, unit="sglang.service", engine="sglang", invocation="inv-1") -> None:
    record = {"engine": engine, "unit": unit, "invocation_id": invocation, "boot_id": lease.boot_id()}
    (tmp_path / "parked.json").write_text(json.dumps(record))


def test_the_lease_lasts_for_every_bound_of_the_teardown_and_two_minutes_more(tmp_path):
    assert teardown_run.lease_seconds(params(tmp_path)) == 2 * (7 + 4 + 1) + 5 + 4 + 11 + 120


def test_an_unknown_step_is_refused_naming_it_before_anything_runs(tmp_path):
    node = ScriptedNode()
    with pytest.raises(Error, match=r"steps: unknown bogus \(known: units, holders, memory\)"):
        teardown_run.run(params(tmp_path, steps=["units", "bogus"]), node, check_mode=False)
    assert node.calls == []


def test_check_mode_plans_each_step_asked_for_and_changes_nothing(tmp_path):
    node = ScriptedNode()
    result = teardown_run.run(params(tmp_path), node, check_mode=True)
    assert result["changed"] is False and result["result"] == "done" and result["msg"] is None
    steps = result["steps"]
    assert steps["check_mode"] is True and steps["run_id"] == "run-1" and steps["lease"] == {}
    assert ("stop_units", ("vllm.service", "sglang.service"), True) in node.calls, "planned in check mode, never run"
    assert steps["after"] == steps["before"] == {"gpus": [{"index": 0, "used_mib": 900}]}
    assert [call[0] for call in node.calls] == ["memory", "stop_units", "decide"] and steps["parked"] is None
    only_memory = ScriptedNode()
    teardown_run.run(params(tmp_path, steps=["memory"]), only_memory, check_mode=True)
    assert [call[0] for call in only_memory.calls] == ["memory"]


def test_check_mode_names_a_refused_plan_as_the_run_would_fail(tmp_path):
    refusal = Refused("alice's job pid 42 holds GPU 3", holders=[{"pid": 42}])
    result = teardown_run.run(params(tmp_path), ScriptedNode(refuse=refusal), check_mode=True)
    assert result["result"] == "failed" and result["msg"] == refusal.msg
    steps = result["steps"]
    assert steps["holders"] == {"holders": [{"pid": 42}], "failed": True, "msg": refusal.msg}
    assert steps["failure"] == {"holders": [{"pid": 42}], "failed": True, "msg": refusal.msg}
    assert steps["failed_step"] == teardown_run.FAILED_STEP_NAMES["decide"]


def test_a_lease_held_by_another_run_touches_nothing_and_says_whose(tmp_path):
    store = LeaseStore("switch_engine", str(tmp_path))
    store.acquire("other-run", 600, 0)
    node = ScriptedNode()
    result = teardown_run.run(params(tmp_path), node, check_mode=False, store=store)
    assert result["result"] == "lease_held" and result["changed"] is False and result["holder"]["owner"] == "other-run"
    assert result["steps"]["check_mode"] is False and result["steps"]["failure"]["failed"] is True
    assert result["steps"]["failed_step"] == teardown_run.FAILED_STEP_NAMES["lease"] and node.calls == []
    taken = teardown_run.run(params(tmp_path, break_owner="other-run"), ScriptedNode(), check_mode=False, store=store)
    assert taken["result"] == "done" and taken["steps"]["lease"]["recovered"] == {"owner": "other-run", "broken": True}
    assert store.held()["owner"] is None, "given back at the end"


def test_a_parked_engine_among_the_units_is_evicted_or_kept_and_its_fate_reported(tmp_path):
    park(tmp_path)
    node = ScriptedNode()
    result = teardown_run.run(params(tmp_path), node, check_mode=False)
    assert result["steps"]["parked"] == {"engine": "sglang", "unit": "sglang.service", "fate": "evicted", "reason": None, "check_mode": False}
    assert not (tmp_path / "parked.json").exists(), "an engine stopped is parked no more: its record goes"

    park(tmp_path)
    kept = teardown_run.run(params(tmp_path, keep_parked=True), ScriptedNode(), check_mode=False)
    assert kept["steps"]["parked"]["fate"] == "kept" and (tmp_path / "parked.json").exists()

    park(tmp_path, invocation="inv-0")  # restarted since it parked: not the parked engine any more
    planned = teardown_run.run(params(tmp_path, keep_parked=True), ScriptedNode(), check_mode=True)
    assert planned["steps"]["parked"]["fate"] == "not parked" and planned["steps"]["parked"]["check_mode"] is True
    assert "was restarted since it parked" in planned["steps"]["parked"]["reason"]

    park(tmp_path)
    untouched = teardown_run.run(params(tmp_path, steps=["memory"]), ScriptedNode(), check_mode=False)
    assert untouched["steps"]["parked"] is None and (tmp_path / "parked.json").exists(), "no units step: nothing parked is touched"


@pytest.mark.parametrize("check_mode", [False, True])
def test_units_given_to_keep_are_neither_stopped_nor_their_holders_signalled(tmp_path, check_mode):
    node = ScriptedNode()
    teardown_run.run(params(tmp_path, kept_units=["sglang"]), node, check_mode=check_mode)
    assert ("stop_units", ("vllm.service",), check_mode) in node.calls
    assert ("decide", ("vllm.service",), ("sglang.service",)) in node.calls


def metrics_after(tmp_path, node=None, store=None, parked_engine="sglang", **overrides) -> dict:
    """The node's metrics state after a teardown, seeded with one engine serving, ``parked_engine`` parked and a stale lease."""
    state_path = tmp_path / "metrics.json"
    engines = [{"engine": engine, "state": "parked" if engine == parked_engine else "serving"} for engine in ("vllm", "sglang")]
    state_path.write_text(json.dumps({"engines": engines, "parked": {"engine": parked_engine}, "lease": {"owner": "stale-run", "expires": 1.0}}))
    (tmp_path / "textfiles").mkdir(exist_ok=True)
    chosen = params(tmp_path, metrics_dir=str(tmp_path / "textfiles"), metrics_state_path=str(state_path)) | overrides
    result = teardown_run.run(chosen, node or ScriptedNode(), check_mode=False, store=store)
    assert result["metrics_warnings"] == []
    return json.loads(state_path.read_text())


def test_the_metrics_say_what_the_teardown_left_running(tmp_path):
    torn_down = metrics_after(tmp_path)
    assert [(engine["engine"], engine["state"]) for engine in torn_down["engines"]] == [("vllm", "none"), ("sglang", "none")]
    assert torn_down["parked"] is None and torn_down["last_run"]["gpu_teardown"]["result"] == "ok"

    park(tmp_path)
    kept = metrics_after(tmp_path, keep_parked=True)
    assert [(engine["engine"], engine["state"]) for engine in kept["engines"]] == [("vllm", "none"), ("sglang", "parked")]
    assert kept["parked"] == {"engine": "sglang"}
    park(tmp_path, unit="vllm.service", engine="vllm")
    vllm_kept = metrics_after(tmp_path, keep_parked=True, parked_engine="vllm")
    assert [(engine["engine"], engine["state"]) for engine in vllm_kept["engines"]] == [("vllm", "parked"), ("sglang", "none")]

    for unchanged in (metrics_after(tmp_path, steps=["memory"]),
                      metrics_after(tmp_path, node=ScriptedNode(refuse=Refused("alice's job holds GPU 3")))):
        assert [(engine["engine"], engine["state"]) for engine in unchanged["engines"]] == [("vllm", "serving"), ("sglang", "parked")]


def test_the_metrics_lease_is_the_nodes_after_the_run(tmp_path):
    assert metrics_after(tmp_path, store=LeaseStore("switch_engine", str(tmp_path)))["lease"] is None, "taken and given back"
    assert metrics_after(tmp_path)["lease"] == {"owner": "stale-run", "expires": 1.0}, "no lease taken: left as it was"
