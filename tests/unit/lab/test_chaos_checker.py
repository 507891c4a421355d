"""The fault campaign's parts that decide (tests/chaos): the seeded schedule, the checker's invariants on node states,
and the signal witness on real processes and real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "chaos"))
sys.path.insert(0, str(REPO / "tests" / "sim"))

import invariants  # noqa: E402
import node_state  # noqa: E402
import schedule  # noqa: E402
import signal_witness  # noqa: E402


def node(serving=("vllm",), parked_engine=None, **extra) -> dict:
    """A node state as node_state.py prints it: the engines in ``serving`` answer, ``parked_engine`` sleeps."""
    units, answers = {}, {}
    for pid, engine in enumerate(("vllm", "sglang"), start=100):
        active = engine in serving or engine == parked_engine
        units[engine] = {"active": "active" if active else "inactive", "main_pid": pid if active else 0, "argv": [f"/models/{engine}"]}
        if active:
            answers[engine] = {"completion": 200 if engine in serving else 503, "sleeping": engine == parked_engine}
    return {"units": units, "answers": answers, "processes": [], "gpu_memory": [], "leases": [], "holds": [], "foreign": [],
            "witness": [], "journal": [], **extra}


def test_a_seed_stands_for_one_run_and_a_replay_draws_it_again():
    assert schedule.plan(1234) == schedule.plan(1234)
    assert len({schedule.plan(seed) for seed in range(1000, 1040)}) == 40
    runs = schedule.campaign(1000, 200)
    for run in runs:
        assert run.operation in schedule.OPERATIONS
        # two faults of their own on each node, of two kinds, in the node's world; at most one on the controller, the run's
        on_nodes = len(schedule.NODES) * schedule.FAULTS_PER_NODE
        assert [fault.where for fault in run.faults][:on_nodes] == [node for node in schedule.NODES for _draw in range(schedule.FAULTS_PER_NODE)]
        for node in schedule.NODES:
            kinds = {fault.kind for fault in run.faults if fault.where == node}
            assert len(kinds) == schedule.FAULTS_PER_NODE and kinds <= set(schedule.NODE_FAULTS)
            assert not any(pair <= kinds for pair in schedule.EXCLUSIVE)
        assert all(fault.kind in schedule.CONTROLLER_FAULTS for fault in run.faults[on_nodes:]) and len(run.faults) - on_nodes <= 1
        for fault in run.faults:
            assert fault.phase is None or fault.phase in schedule.phases_of(run.operation)
            assert not (run.operation == "check" and fault.phase in ("cutover", "finish")), "a --check has no cutover"
    with_controller = sum(len(run.faults) > len(schedule.NODES) * schedule.FAULTS_PER_NODE for run in runs)
    assert 0.2 * len(runs) < with_controller < 0.4 * len(runs)


def test_the_covering_seeds_reach_every_fault_and_every_operation():
    seeds = schedule.covering(1000)
    runs = [schedule.plan(seed) for seed in seeds]
    assert {fault.kind for run in runs for fault in run.faults} == set(schedule.FAULTS)
    assert {run.operation for run in runs} == set(schedule.OPERATIONS)
    # a handful: every operation needs a run of its own
    assert len(schedule.OPERATIONS) <= len(seeds) <= len(schedule.OPERATIONS) + 2


def test_one_engine_serving_is_the_promise_after_a_switch():
    assert invariants.one_engine("node1", node(("sglang",), parked_engine="vllm"), ("sglang",)) == []
    assert "2 engines serve" in invariants.one_engine("node1", node(("vllm", "sglang")), ("sglang",))[0]
    assert "0 engines serve (none)" in invariants.one_engine("node1", node(()), ("sglang", "vllm"))[0]
    assert "vllm serves; sglang should" in invariants.one_engine("node1", node(("vllm",)), ("sglang",))[0]
    # a node that served nothing before (a cleanup ran) may serve nothing after the fault; never two
    assert invariants.one_engine("node1", node(()), ("vllm",), none_before=True) == []
    assert invariants.one_engine("node1", node(("vllm", "sglang")), ("vllm",), none_before=True)
    # seed 7401: a cleanup stops engines without disabling them; the node restarted then starts the one enabled at boot
    enabled = node(("sglang",))
    enabled["units"]["sglang"]["enabled"] = "enabled"
    assert invariants.enabled_at_boot(enabled) == ["sglang"] and invariants.enabled_at_boot(node()) == []


def test_a_check_changes_nothing_unless_the_fault_itself_hit_the_engine():
    before = node(("vllm",))
    restarted = node(("vllm",))
    restarted["units"]["vllm"]["main_pid"] = 999
    assert "main process changed (100 -> 999)" in invariants.untouched("node1", before, restarted, fault_hit_engine=False)[0]
    assert invariants.untouched("node1", before, restarted, fault_hit_engine=True) == []
    assert "served before" in invariants.untouched("node1", before, node(("sglang",)), fault_hit_engine=True)[0]


def test_another_users_job_must_be_alive_and_unsignalled():
    alive = {"pid": 42, "alive": True, "signals": []}
    assert invariants.foreign_untouched("node1", node(foreign=[alive])) == []
    assert "pid 42 is gone" in invariants.foreign_untouched("node1", node(foreign=[dict(alive, alive=False)]))[0]
    assert "received SIGTERM" in invariants.foreign_untouched("node1", node(foreign=[dict(alive, signals=["SIGTERM"])]))[0]


def test_every_signal_a_process_saw_is_journalled_before_it_came_or_is_not_ours():
    seen = {"pid": 300, "start_time": 77, "signal": "SIGTERM", "at": 1000.5, "role": "vllm worker", "sender": 4000, "sender_uid": 0,
            "sender_comm": "python3"}
    intent = {"phase": "intent", "pid": 300, "start_time": 77, "signal": "SIGTERM", "time": 1000.4}
    assert "no line in the signal journal" in invariants.signals_journalled("node1", node(witness=[seen]), [])[0]
    assert invariants.signals_journalled("node1", node(witness=[seen], journal=[intent]), []) == []
    assert "written after it arrived" in invariants.signals_journalled("node1", node(witness=[seen], journal=[dict(intent, time=1001.0)]), [])[0]
    # another process of the same start time's pid is another process
    assert invariants.signals_journalled("node1", node(witness=[seen], journal=[dict(intent, start_time=78)]), [])
    assert invariants.signals_journalled("node1", node(witness=[dict(seen, sender=1, sender_comm="systemd")]), []) == []
    assert invariants.signals_journalled("node1", node(witness=[dict(seen, sender_uid=997)]), []) == [], "its own server"
    assert invariants.signals_journalled("node1", node(witness=[seen]), [{"pid": 300, "signal": "SIGTERM"}]) == [], "the campaign's fault"


def test_nothing_is_left_behind_after_the_recovery():
    assert invariants.leftovers("node1", node()) == []
    held = node(leases=[{"name": "gpufleet-serving.switch_engine.lease", "owner": "run-1", "expires_in": 30, "same_boot": True}])
    assert "still held by run-1" in invariants.leftovers("node1", held)[0]
    expired = node(leases=[{"name": "x.lease", "owner": "run-1", "expires_in": -5, "same_boot": True}])
    assert invariants.leftovers("node1", expired) == []
    assert "no parked engine" in invariants.leftovers("node1", node(("vllm",), holds=["sglang.service"]))[0]
    assert invariants.leftovers("node1", node(("vllm",), parked_engine="sglang", holds=["sglang.service"])) == []
    # a --check writes nothing: a hold it found, of a parked engine that died of a fault during it, is the next real run's
    assert invariants.leftovers("node1", node(("vllm",), holds=["sglang.service"]), holds_not_ours=("sglang.service",)) == []
    assert "no parked engine" in invariants.leftovers("node1", node(("vllm",), holds=["sglang.service"]), holds_not_ours=("vllm.service",))[0]
    partial = node(("vllm",))
    partial["units"]["vllm"]["argv"] = ["vllm", "serve", "/models/x.partial"]
    assert "partial model" in invariants.leftovers("node1", partial)[0]


def test_gpu_memory_is_held_only_by_the_serving_or_parked_engine_or_another_users_job():
    processes = [{"pid": 11, "cgroup": "/system.slice/vllm.service", "worker": True},
                 {"pid": 12, "cgroup": "/system.slice/sglang.service", "worker": True},
                 {"pid": 13, "cgroup": "/user.slice/session-1.scope", "worker": True}]
    memory = [{"gpu": 0, "mib": 100, "holders": ["11:5"], "leak": False}, {"gpu": 1, "mib": 100, "holders": ["12:5"], "leak": False}]
    assert invariants.gpu_memory("node1", node(("vllm",), parked_engine="sglang", processes=processes, gpu_memory=memory)) == []
    stray = invariants.gpu_memory("node1", node(("vllm",), processes=processes, gpu_memory=memory))
    assert len(stray) == 1 and "held by pid 12 (/system.slice/sglang.service)" in stray[0]
    foreign = node(("vllm",), processes=processes, gpu_memory=[{"gpu": 7, "mib": 2048, "holders": ["13:9"], "leak": False}],
                   foreign=[{"pid": 13, "alive": True, "signals": []}])
    assert invariants.gpu_memory("node1", foreign) == []
    assert "held by no process" in invariants.gpu_memory("node1", node(gpu_memory=[{"gpu": 2, "mib": 5, "holders": [], "leak": True}]))[0]
    # an escaped worker (and what its parent started again) may be left only by a run that tears nothing down: a --check
    escaped = node(("vllm",), gpu_memory=[{"gpu": 6, "mib": 1024, "holders": ["21:3"], "leak": False},
                                          {"gpu": 6, "mib": 1024, "holders": ["23:4"], "leak": False}],
                   escaped=[{"pid": 21, "start_time": 3, "alive": True, "signals": []}], respawned=[22, 23])
    assert invariants.gpu_memory("node1", escaped, escaped_left=True) == []
    assert [line.split(" held by ")[1].split()[1] for line in invariants.gpu_memory("node1", escaped)] == ["21", "23"]


def test_the_report_must_match_the_node_and_a_second_rerun_must_find_nothing_to_do():
    report = {"hosts": {"node1": {"result": "switched", "from": "vllm", "to": "sglang", "engines_serving": ["vllm"]}}}
    assert invariants.report_matches("node1", node(("sglang",)), report) == []
    assert "the report's 'switched' means ['sglang'] serve(s); the node serves ['vllm']" in invariants.report_matches("node1", node(("vllm",)), report)[0]
    rolled_back = {"hosts": {"node1": {"result": "rolled_back", "from": "vllm", "to": "sglang"}}}
    assert invariants.report_matches("node1", node(("vllm",)), rolled_back) == []
    refused = {"hosts": {"node1": {"result": "preflight_failed", "from": "vllm", "to": "sglang", "engines_serving": ["vllm"]}}}
    assert invariants.report_matches("node1", node(("vllm",)), refused) == []
    assert invariants.report_matches("node1", node(("sglang",)), {"hosts": {"node1": {"result": "rollback_failed"}}})
    assert "not 'unchanged'" in invariants.converged("node1", "switch", report)[0]
    assert invariants.converged("node1", "switch", {"hosts": {"node1": {"result": "unchanged"}}}) == []
    assert "signalled 1" in invariants.converged("node1", "cleanup", {"hosts": {"node1": {"result": "ok", "signals": [{}]}}})[0]


WITNESSED_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[2])
    import signal_witness
    stopped = []
    signal_witness.install(sys.argv[1], "test worker", stopped.append)
    print("ready", flush=True)
    deadline = time.monotonic() + 20
    while 15 not in stopped and time.monotonic() < deadline:  # SIGTERM
        time.sleep(0.02)
""")


def test_the_witness_names_each_signal_and_its_sender(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", WITNESSED_CHILD, str(tmp_path), str(REPO / "tests" / "sim")],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGCONT)
    deadline = time.monotonic() + 5
    while len(signal_witness.read(str(tmp_path))) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(10) == 0
    seen = signal_witness.read(str(tmp_path))
    assert [line["signal"] for line in seen] == ["SIGCONT", "SIGTERM"]
    assert {line["sender"] for line in seen} == {os.getpid()} and {line["sender_uid"] for line in seen} == {os.getuid()}
    assert {line["pid"] for line in seen} == {child.pid}
    assert seen[0]["start_time"] is not None and seen[0]["start_time"] == seen[1]["start_time"]


def test_an_escaped_worker_is_killed_by_a_teardown_with_every_signal_journalled_and_left_alone_otherwise():
    job = {"pid": 77, "start_time": 5, "alive": False, "signals": ["SIGTERM"]}
    intent = {"phase": "intent", "pid": 77, "start_time": 5, "signal": "SIGTERM", "time": 1.0}
    assert invariants.escaped_worker("node1", node(escaped=[job], journal=[intent]), torn_down=True) == []
    assert "received SIGTERM with no line" in invariants.escaped_worker("node1", node(escaped=[job]), torn_down=True)[0]
    assert "still runs after the teardown" in invariants.escaped_worker("node1", node(escaped=[dict(job, alive=True, signals=[])]), torn_down=True)[0]
    assert "touched by a run that tears nothing down" in invariants.escaped_worker(
        "node1", node(escaped=[job], journal=[intent]), torn_down=False)[0]
    assert invariants.escaped_worker("node1", node(escaped=[dict(job, alive=True, signals=[])]), torn_down=False) == []


def test_a_holders_witness_file_is_read_as_the_signals_it_took(tmp_path, processes):
    """The campaign's escaped workers and foreign jobs are gpu_holder.py --witness processes: their file says
    "SIGTERM <sender>" a line (the respawner's the name alone). The checker reads signal names, never a sender pid as
    a signal - a teardown whose every signal was journalled is no violation."""
    witness = tmp_path / "escaped.witness"
    proc, (pid,) = processes.holder("--witness", str(witness))
    start_time = signal_witness.start_time(pid)
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGTERM)
    assert proc.wait(10) == 0
    with witness.open("a", encoding="ascii") as respawner_line:
        respawner_line.write("SIGHUP\n")
    record = tmp_path / "escaped.json"
    record.write_text(json.dumps([{"pid": pid, "start_time": start_time, "witness": str(witness)}]))
    (job,) = node_state.campaign_jobs(record)
    assert job["signals"] == ["SIGUSR1", "SIGTERM", "SIGHUP"] and job["alive"] is False
    journal = [{"phase": "intent", "pid": pid, "start_time": start_time, "signal": name, "time": 1.0} for name in job["signals"]]
    assert invariants.escaped_worker("node1", node(escaped=[job], journal=journal), torn_down=True) == []


def test_a_restart_is_told_by_the_boot_id_or_by_a_container_nodes_pid_1_started_again():
    before = {"boot_id": "b1", "init_start": "100"}
    assert not invariants.restarted(before, dict(before))
    assert invariants.restarted(before, {"boot_id": "b1", "init_start": "250"}), "a lab node's container restart keeps the host's boot id"
    assert invariants.restarted(before, {"boot_id": "b2", "init_start": "100"})
