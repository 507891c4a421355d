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
