"""node_teardown - the gpu_teardown role's one module run - against real processes, real signals and the real /proc,
with NVML simulated: another run's lease means nothing is touched; another user's holder is refused before anything is
signalled; check mode plans; the real run kills, asserts every GPU free and gives the lease back."""

from __future__ import annotations

import uuid

from conftest import alive, run_module

MODULE = "node_teardown"


def teardown_args(devices, lease_name: str, **extra) -> dict:
    return {"units": [], "device_paths": devices.globs, "term_timeout": 5, "holders_kill_timeout": 5, "memory_timeout": 5,
            "lease_name": lease_name, "run_id": "cleanup-test", "journal_path": str(devices.root.parent / "journal" / "signals.jsonl"),
            **extra}


def lease(name: str, owner: str, state: str = "acquired") -> dict:
    return run_module("host_lease", {"name": name, "owner": owner, "state": state, "lease_seconds": 60}).result


def test_another_runs_lease_leaves_every_holder_as_it_was(devices, processes, nvml_env):
    name = f"test-{uuid.uuid4().hex[:8]}"
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), devices.ctl)
    lease(name, "switch-of-another-controller")
    try:
        result = run_module(MODULE, teardown_args(devices, name, outside_units="kill"), env=nvml_env)
    finally:
        lease(name, "switch-of-another-controller", "released")
    assert result.failed and result["result"] == "lease_held" and result["changed"] is False
    assert result["holder"]["owner"] == "switch-of-another-controller" and "switch-of-another-controller" in result["msg"]
    assert alive(pid), "nothing is signalled under another run's lease"
    assert "units" not in result["steps"] and "holders" not in result["steps"]


def test_another_users_holder_is_refused_at_the_decision_before_anything_is_signalled(devices, processes, nvml_env):
    """The default scope (fail): a holder outside the units, not of the engines' users, stops the run at the decision."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    _helper, (pid,) = processes.holder("--open", devices.gpu(1), devices.ctl)
    result = run_module(MODULE, teardown_args(devices, name), env=nvml_env)
    assert result.failed and result["result"] == "failed"
    assert result["steps"]["failed_step"].startswith("Decide")
    assert "outside the units being stopped" in result["msg"]
    assert alive(pid) and result["steps"]["holders"].get("signals", []) == []
    # the lease was given back: another owner takes it at once
    assert lease(name, "next-run")["holder"]["owner"] == "next-run"
    lease(name, "next-run", "released")


def test_check_mode_plans_then_the_run_kills_asserts_and_gives_the_lease_back(devices, processes, nvml_env):
    name = f"test-{uuid.uuid4().hex[:8]}"
    _helper, (pid,) = processes.holder("--open", devices.gpu(2), devices.ctl)
    plan = run_module(MODULE, teardown_args(devices, name, outside_units="kill"), check_mode=True, env=nvml_env)
    assert not plan.failed, plan.result
    assert plan["changed"] is False and [target["pid"] for target in plan["steps"]["holders"]["targets"]] == [pid]
    assert plan["steps"]["check_mode"] and alive(pid)

    result = run_module(MODULE, teardown_args(devices, name, outside_units="kill"), env=nvml_env)
    assert not result.failed, result.result
    assert result["result"] == "done" and result["changed"] is True
    steps = result["steps"]
    assert [p["pid"] for p in steps["holders"]["terminated"] + steps["holders"]["killed"]] == [pid] and not alive(pid)
    assert steps["after"]["passed"] and steps["lease"]["holder"]["owner"] == "cleanup-test" and steps["run_id"] == "cleanup-test"
    assert set(steps["seconds"]) == {"before", "decide", "holders", "after"}
    assert lease(name, "next-run")["holder"]["owner"] == "next-run", "the lease was given back"
    lease(name, "next-run", "released")

    again = run_module(MODULE, teardown_args(devices, name, outside_units="kill"), env=nvml_env)
    assert not again.failed and again["changed"] is False, "a second run changes nothing"


def test_the_nodes_metrics_count_what_was_signalled_and_refused_and_check_mode_writes_none(devices, processes, nvml_env, tmp_path):
    """Issue 47: the teardown writes the node's metrics with prometheus_client (read back with its parser); counters
    add up across runs; check mode writes nothing."""
    from prometheus_client.parser import text_string_to_metric_families

    name = f"test-{uuid.uuid4().hex[:8]}"
    where = {"metrics_dir": str(tmp_path / "textfile"), "metrics_state_path": str(tmp_path / "metrics.json")}
    prom = tmp_path / "textfile" / "gpufleet_serving.prom"

    def samples() -> dict:
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(prom.read_text()) for sample in family.samples}

    _helper, (pid,) = processes.holder("--open", devices.gpu(3), devices.ctl)
    plan = run_module(MODULE, teardown_args(devices, name, outside_units="kill", **where), check_mode=True, env=nvml_env)
    assert not plan.failed and not prom.exists(), "check mode writes no metrics"
    refused = run_module(MODULE, teardown_args(devices, name, **where), env=nvml_env)
    assert refused.failed and refused["metrics_warnings"] == [] and alive(pid)
    assert samples()[("gpufleet_refusals_total", (("reason", "foreign_holders"),))] == 1
    assert samples()[("gpufleet_last_run_info", (("playbook", "gpu_teardown"), ("result", "failed")))] == 1
    result = run_module(MODULE, teardown_args(devices, name, outside_units="kill", **where), env=nvml_env)
    assert not result.failed, result.result
    counted = samples()
    assert counted[("gpufleet_signals_total", (("signal", "SIGTERM"),))] >= 1
    assert counted[("gpufleet_foreign_holders_total", ())] == 2, "found by the refused run and by this one"
    assert counted[("gpufleet_refusals_total", (("reason", "foreign_holders"),))] == 1, "a counter keeps what it counted"
    assert counted[("gpufleet_last_run_info", (("playbook", "gpu_teardown"), ("result", "ok")))] == 1
    assert {labels for (metric, labels) in counted if metric == "gpufleet_gpu_memory_used_bytes"}, "each GPU's memory after"
