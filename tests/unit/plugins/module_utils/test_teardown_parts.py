"""The teardown's parts that every caller shares: its option set (_teardown/options.py) is what its doc fragment
promises, both ways; its longest run (_teardown/steps.py) is the one formula for the leases."""

from __future__ import annotations

import pytest
import yaml

from ansible_collections.gpufleet.serving.plugins.doc_fragments.teardown import ModuleDocFragment
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.options import TEARDOWN_OPTIONS


def test_each_option_is_documented_with_its_type_choices_and_default():
    documented = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    assert sorted(documented) == sorted(TEARDOWN_OPTIONS)
    for name, spec in TEARDOWN_OPTIONS.items():
        doc = documented[name]
        assert (doc["type"], doc.get("elements"), doc.get("choices")) == (spec["type"], spec.get("elements"), spec.get("choices")), name
        assert doc.get("default") == spec.get("default"), f"{name}: documented default {doc.get('default')!r}, spec {spec.get('default')!r}"


def test_a_teardowns_longest_run_counts_each_units_stop_then_the_holders_and_the_memory():
    """The cleanup's lease and the switch's are sized by it: per unit its stop, its group's SIGKILL and 1 s of settle;
    then the holders' SIGTERM grace and SIGKILL wait (the module's own, else kill_timeout); then the memory poll."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import longest_run

    assert longest_run(3, stop_timeout=7, kill_timeout=4, term_timeout=5, memory_timeout=11) == 3 * (7 + 4 + 1) + 5 + 4 + 11
    assert longest_run(3, 7, 4, 5, 11, holders_kill_timeout=13) == 3 * (7 + 4 + 1) + 5 + 13 + 11
    assert longest_run(1, 7, 4, 5, 11, holders_kill_timeout=0) == 7 + 4 + 1 + 5 + 0 + 11, "0 is a timeout, not 'none given'"


class ScriptedOps:
    """A teardown's node operations, recorded; ``failing`` names the step that raises and what."""

    def __init__(self, failing: dict | None = None, units_after: list | None = None):
        self.calls: list[tuple] = []
        self.failing = failing or {}
        self.units_after = units_after or []
        self.reset: list[list[str]] = []
        readings = iter([0.1, 0.22345, 0.3, 0.8, 1.0, 2.0, 2.1, 2.35, 2.5, 3.25])  # no difference is a remainder
        self.clock = Clock()
        self.clock.monotonic = lambda: next(readings)

    def _step(self, name, *args, **kwargs):
        self.calls.append((name, *args, *sorted(kwargs.items())))
        if name in self.failing:
            raise self.failing[name]
        return {"step": name}

    def memory(self, wait, left_pids=()):
        return self._step("memory", wait, left_pids)

    def decide(self, units, *kept):
        return self._step("decide", units, *kept)

    def stop_units(self, units, stop_timeout):
        self._step("stop_units", units, stop_timeout)
        return {"results": self.units_after}

    def kill_holders(self, units, *kept, **options):
        return {**self._step("kill_holders", units, *kept, **options), "outside": [{"pid": 7}], "kept": [{"pid": 3}]}

    def reset_failed(self, units):
        self.reset.append(units)


def run_teardown(ops, **options):
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown import steps as teardown_steps

    return teardown_steps.teardown(["vllm.service", "sglang.service"], ops, 9.0, **options)


def test_a_teardown_runs_its_steps_in_order_timing_each_and_leaves_the_holders_it_reported_out_of_the_memory():
    ops = ScriptedOps()
    steps = run_teardown(ops, decide=True)
    assert [call[0] for call in ops.calls] == ["memory", "decide", "stop_units", "kill_holders", "memory"]
    assert ops.calls[1] == ("decide", ["vllm.service", "sglang.service"]), "no parked engine: decided without a kept set"
    assert ops.calls[-1] == ("memory", True, (3, 7)), "the holders reported or kept are not counted"
    assert steps["check_mode"] is False
    assert steps["seconds"] == {"before": 0.123, "decide": 0.5, "units": 1.0, "holders": 0.25, "after": 0.75}


def test_a_parked_engine_is_kept_out_of_the_stop_and_passed_to_the_decision_and_the_kill():
    ops = ScriptedOps()
    run_teardown(ops, decide=True, kept=("sglang.service",))
    assert ("decide", ["vllm.service"], ("sglang.service",)) in ops.calls
    assert ("stop_units", ["vllm.service"], 9.0) in ops.calls
    assert ("kill_holders", ["vllm.service"], ("sglang.service",)) in ops.calls
    ops = ScriptedOps()
    run_teardown(ops, leave_foreign=True)
    assert ("kill_holders", ["vllm.service", "sglang.service"], (), ("leave_foreign", True)) in ops.calls
    assert [call[0] for call in ops.calls] == ["memory", "stop_units", "kill_holders", "memory"], "no decision unless asked"


def test_only_the_steps_asked_for_run():
    ops = ScriptedOps()
    run_teardown(ops, only=("units", "after"))
    assert [call[0] for call in ops.calls] == ["stop_units", "memory"]


def test_each_steps_failure_is_recorded_where_the_report_looks_for_it():
    import json

    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, Refused
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import TeardownFailed

    cases = {
        "decide": (Refused("alice's job holds GPU 3", holders=[{"pid": 9}]), "holders"),
        "kill_holders": (Error("a holder survived", survivors=[{"pid": 8}]), "holders"),
        "memory": (Error("GPU 2 still holds 900 MiB", gpus=[2]), "before"),
    }
    for failing, (error, recorded_as) in cases.items():
        with pytest.raises(TeardownFailed) as raised:
            run_teardown(ScriptedOps({failing: error}), decide=True)
        steps = raised.value.context["steps"]
        assert steps[recorded_as]["failed"] is True and steps[recorded_as]["msg"] == error.msg, failing
        assert steps["failure"] == dict(error.context, failed=True, msg=error.msg) and raised.value.msg.endswith(error.msg)
    units_failed = TeardownFailed("vllm.service is deactivating", units={"results": [{"unit": "vllm.service"}]})
    with pytest.raises(TeardownFailed) as raised:
        run_teardown(ScriptedOps({"stop_units": units_failed}))
    steps = raised.value.context["steps"]
    assert steps["units"] == {"results": [{"unit": "vllm.service"}]} and steps["failed_step"] == "units"
    with pytest.raises(TeardownFailed) as raised:
        run_teardown(ScriptedOps({"stop_units": Error("systemctl is gone")}))
    steps = raised.value.context["steps"]
    assert "units" not in steps and "holders" not in steps and steps["failed_step"] == "units"
    assert steps["failure"]["msg"] == "systemctl is gone"
    holders_failed = TeardownFailed("a holder survived", units={"results": ["not the units step's"]}, survivors=[{"pid": 8}])
    with pytest.raises(TeardownFailed) as raised:
        run_teardown(ScriptedOps({"kill_holders": holders_failed}))
    steps = raised.value.context["steps"]
    assert steps["holders"]["msg"] == "a holder survived" and steps["units"] == {"results": []}, "only the units step's own failure replaces it"
    state = json.loads('{"ActiveState": "failed"}')  # as read from systemctl: not an interned literal
    ops = ScriptedOps(units_after=[{"unit": "vllm.service", "state_after": state}, {"unit": "sglang.service", "state_after": {}}])
    run_teardown(ops)
    assert ops.reset == [["vllm.service"]], "a unit left failed by the kill is reset: a switch is not an engine failure"
