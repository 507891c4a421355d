"""gpu_holders_kill against real processes, real signals and the real /proc, with NVML simulated.

Catalogue cases are named in each test's docstring (G* of the reliability catalogue).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import COLLECTIONS, HELPER, REPO, alive, is_stopped, remove_cgroup, run_module, start_module, stop, wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import PROTECTED_DAEMONS
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemctl_reader

MODULE = "gpu_holders_kill"


def kill_args(devices, **extra) -> dict:
    """The dedicated node's request (outside_units=kill: every holder is in scope), its journal in the test's directory;
    the default scope (fail) has tests of its own."""
    return {"device_paths": devices.globs, "term_timeout": 5, "kill_timeout": 5, "outside_units": "kill",
            "journal_path": journal_of(devices), **extra}


def journal_of(devices) -> str:
    return str(devices.root.parent / "journal" / "signals.jsonl")


def pids_of(entries: list[dict]) -> set[int]:
    return {entry["pid"] for entry in entries}


def sent_via(result) -> set[str]:
    """How the signals of a run were sent (pidfd, kill), by their journal entries."""
    return {entry["via"] for entry in result["signals"]}


def wait_for_zombie_leader(pid: int) -> None:
    """The helper's leader thread exits just after it reports ready; wait until only its worker thread runs."""
    wait_for(lambda: ProcReader().stat(pid).state == "Z", "leader never became a zombie")


@pytest.mark.covers('G1')
def test_no_holders_is_unchanged_in_check_and_real_mode(devices, nvml_env):
    """G1."""
    for check_mode in (True, False):
        result = run_module(MODULE, kill_args(devices), check_mode=check_mode, env=nvml_env)
        assert not result.failed, result.result
        assert result["changed"] is False
        assert result["holders"] == [] and result["signals"] == []


@pytest.mark.covers('G2', 'G28')
def test_fd_holder_is_planned_in_check_mode_then_terminated(devices, processes, nvml_env, unit_groups):
    """G2, G28: check mode plans and signals nothing, naming the holder's pid, start time, exe, cgroup (its own, in
    another group than the module's) and GPUs (by index and UUID); the real run terminates; the second run changes nothing."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), devices.ctl)
    unit_groups.put(pid, "vllm.service")

    plan = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env)
    assert plan["changed"] is True
    assert pids_of(plan["targets"]) == {pid}
    assert plan["signals"] == []
    assert alive(pid)
    target = plan["targets"][0]
    assert target["via"] == ["fd"]
    assert target["devices"] == sorted([devices.gpu(0), devices.ctl])
    assert target["start_time"] > 0 and target["exe"] == os.path.realpath(sys.executable)
    assert target["cgroup"] == ProcReader().cgroup(pid) and target["cgroup"].endswith(".slice/vllm.service")
    assert target["cgroup"] != ProcReader().cgroup(os.getpid()) and target["unit"] == "vllm.service"
    # its GPUs by UUID as well as by index, as NVML names them
    inventory = run_module("gpu_memory_assert", {"device_paths": devices.globs, "timeout": 0}, env=nvml_env)["gpus"]
    assert len(target["gpus"]) == 1 and target["gpu_uuids"] == [gpu["uuid"] for gpu in inventory if gpu["index"] == target["gpus"][0]]
    assert target["gpu_uuids"][0].startswith("GPU-")

    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert result["changed"] is True
    assert pids_of(result["terminated"]) == {pid} and result["killed"] == []
    assert [s["signal"] for s in result["signals"]] == ["SIGTERM", "SIGCONT"]
    # each signal sent as the journal recorded it: whom (pid, start time, exe, cgroup, uid), how, and what came of it
    assert all((s["pid"], s["start_time"], s["exe"], s["cgroup"], s["uid"], s["result"]) == (pid, target["start_time"], target["exe"],
               target["cgroup"], os.getuid(), "sent") for s in result["signals"])
    assert not alive(pid)

    again = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert again["changed"] is False and again["holders"] == []


@pytest.mark.covers('G21')
def test_mmap_only_holder_is_found(devices, processes, nvml_env):
    """G21: the fd is closed, only a mapping of the device remains (fuser's `m`)."""
    _helper, (pid,) = processes.holder("--mmap", devices.gpu(1))
    fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    assert devices.gpu(1) not in fds

    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert pids_of(result["terminated"]) == {pid}
    assert result["holders"][0]["via"] == ["mmap"]


@pytest.mark.covers('G15')
def test_sigterm_ignorer_is_killed_after_term_timeout(devices, processes, nvml_env, signal_path):
    """G15, on both signal paths."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(2), "--ignore-term")
    result = run_module(MODULE, kill_args(devices, term_timeout=0.5), env={**nvml_env, **signal_path.env})
    assert sent_via(result) == {signal_path.name}
    assert result["changed"] is True
    assert pids_of(result["killed"]) == {pid} and result["terminated"] == []
    assert [s["signal"] for s in result["signals"]] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    assert not alive(pid)


@pytest.mark.covers('G16')
def test_stopped_holder_gets_sigcont_and_exits_on_sigterm(devices, processes, nvml_env, signal_path):
    """G16: a SIGSTOPped process acts on SIGTERM only once continued; on both signal paths."""
    proc, (pid,) = processes.holder("--open", devices.gpu(0))
    stop(proc)
    result = run_module(MODULE, kill_args(devices), env={**nvml_env, **signal_path.env})
    assert sent_via(result) == {signal_path.name}
    assert pids_of(result["terminated"]) == {pid}
    assert result["killed"] == []


@pytest.mark.covers('G13')
def test_draining_holder_exits_within_term_timeout(devices, processes, nvml_env, signal_path):
    """G13: the target exits on its own during the grace period - the wait sees it go - and gets no SIGKILL; on both
    signal paths."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), "--drain", "0.5")
    result = run_module(MODULE, kill_args(devices, term_timeout=10), env={**nvml_env, **signal_path.env})
    assert sent_via(result) == {signal_path.name}
    assert pids_of(result["terminated"]) == {pid}
    assert "SIGKILL" not in [s["signal"] for s in result["signals"]]


@pytest.mark.covers('G17')
def test_zombie_leader_with_live_thread_is_not_gone_until_sigkill(devices, processes, nvml_env):
    """G17: the leader is a zombie but its worker thread still holds the device."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(3), "--zombie-leader", "--ignore-term")
    wait_for_zombie_leader(pid)
    assert len(os.listdir(f"/proc/{pid}/task")) == 2

    result = run_module(MODULE, kill_args(devices, term_timeout=0.5), env=nvml_env)
    assert pids_of(result["holders"]) == {pid}
    assert pids_of(result["killed"]) == {pid}, "a zombie leader with a live thread must not count as terminated"
    assert not os.path.exists(f"/proc/{pid}/task") or len(os.listdir(f"/proc/{pid}/task")) <= 1


@pytest.mark.covers('G17')
def test_zombie_leader_with_live_thread_is_killed_whether_waited_on_by_pidfd_or_thread_list(devices, processes, nvml_env, signal_path):
    """G17 on both ways of waiting: with pidfds the kernel says when the whole thread group is gone; without them (old
    kernels, seccomp) the thread list does. Either way a zombie leader whose thread ignores SIGTERM is not gone after
    the TERM grace: it is SIGKILLed and reported killed, not terminated."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(3), "--zombie-leader", "--ignore-term")
    wait_for_zombie_leader(pid)
    reader = ProcReader()
    request = holders_kill.KillRequest.from_params(dict(kill_args(devices, term_timeout=0.5, kill_timeout=5), gpus=None, sources=["proc"],
                                                        protected=[], protected_pids=[], ambiguous="report", max_targets=8,
                                                        nvml_timeout=5, lock_timeout=5), reader)
    plan = holders_kill.observe(request, None, reader, self_pid=processes.decoy("module").pid)
    result = holders_kill.apply(plan, request, Signaller(reader, use_pidfd=signal_path.use_pidfd))
    assert pids_of(result["killed"]) == {pid} and result["terminated"] == [], result
    assert sent_via(result) == {signal_path.name}
    assert [s["signal"] for s in result["signals"]] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    wait_for(lambda: not reader.thread_group_alive(pid, plan.targets[0]["start_time"]), "the zombie leader's thread to die")


@pytest.mark.covers('G7', 'E9')
def test_decoys_naming_engines_are_untouched(devices, processes, nvml_env):
    """G7, E9 (the `pkill -f sglang` / `grep python3 | xargs kill` regression): only real holders die."""
    decoys = [processes.decoy("sglang", "--model", "x"), processes.decoy("python3", "vllm", "serve")]
    _helper, (pid,) = processes.holder("sglang.launch_server", "--open", devices.gpu(0))
    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert pids_of(result["terminated"]) == {pid}
    assert all(decoy.poll() is None for decoy in decoys)
    assert not {decoy.pid for decoy in decoys} & {s["pid"] for s in result["signals"]}


def witnessed(path) -> list[str]:
    """The signals a --witness holder took, in the order the kernel queued them."""
    return [name for name, _sender in witnessed_from(path)]


def witnessed_from(path) -> list[tuple[str, int]]:
    """(signal, sender pid) of each signal a --witness holder took."""
    try:
        return [(name, int(sender)) for name, sender in (line.split() for line in path.read_text().splitlines())]
    except FileNotFoundError:
        return []


@pytest.mark.covers('E9', 'G7')
def test_the_signals_processes_received_are_the_journal_and_the_plan(devices, processes, nvml_env, tmp_path, signal_path):
    """E9 with an independent witness: every process here writes down each catchable signal it receives (SIGKILL and
    SIGSTOP cannot be caught: their witnesses are death and the stopped state, checked too). Check mode: nothing received
    by anyone. The real run: the holders received exactly the catchable part of what the journal says was sent to them,
    in that order, and only the check-mode plan's targets received anything; the decoys naming the engines received
    nothing and were not stopped."""
    record = {name: tmp_path / f"{name}.signals" for name in ("quick", "stubborn", "decoy_sglang", "decoy_vllm")}
    _helper, (quick,) = processes.holder("--witness", str(record["quick"]), "--open", devices.gpu(0))
    _helper, (stubborn,) = processes.holder("--witness", str(record["stubborn"]), "--ignore-term", "--open", devices.gpu(1))
    _helper, (decoy_sglang,) = processes.holder("--witness", str(record["decoy_sglang"]), "sglang", "serve", "model-x")
    _helper, (decoy_vllm,) = processes.holder("--witness", str(record["decoy_vllm"]), "python3", "vllm", "serve")
    decoys = {decoy_sglang: record["decoy_sglang"], decoy_vllm: record["decoy_vllm"]}

    plan = run_module(MODULE, kill_args(devices, term_timeout=1, kill_timeout=5), check_mode=True, env=nvml_env)
    assert pids_of(plan["targets"]) == {quick, stubborn}
    assert all(witnessed(path) == [] for path in record.values()), "check mode: no process received anything"

    result = run_module(MODULE, kill_args(devices, term_timeout=1, kill_timeout=5), env={**nvml_env, **signal_path.env})
    assert not result.failed, result["msg"]
    assert sent_via(result) == {signal_path.name}
    journal = journal_lines(devices)
    sent = {}
    for line in journal:
        if line["phase"] == "outcome" and line["result"] == "sent":
            sent.setdefault(line["pid"], []).append(line["signal"])
    assert set(sent) == pids_of(plan["targets"]), "only the plan's targets were signalled, by the journal"
    catchable = {pid: [name for name in names if name not in ("SIGKILL", "SIGSTOP")] for pid, names in sent.items()}
    assert witnessed(record["stubborn"]) == catchable[stubborn] == ["SIGTERM", "SIGCONT"]
    # one sender, the module's own process: never this test's, never another process group's signal
    senders = {sender for _name, sender in witnessed_from(record["stubborn"]) + witnessed_from(record["quick"])}
    assert len(senders) == 1 and os.getpid() not in senders and 0 not in senders, senders
    assert sent[stubborn][-1] == "SIGKILL" and not alive(stubborn)
    # the quick holder exits on its SIGTERM: the SIGCONT sent right after may find it gone before it is delivered
    assert witnessed(record["quick"]) in (catchable[quick], catchable[quick][:1]) and witnessed(record["quick"])[:1] == ["SIGTERM"]
    for pid, path in decoys.items():
        assert witnessed(path) == [] and alive(pid) and ProcReader().stat(pid).state != "T", f"decoy {pid}: {witnessed(path)}"
    assert pids_of(result["signals"]) == set(sent)


@pytest.mark.covers('G5')
def test_protected_names_and_pids_are_never_signalled(devices, processes, nvml_env):
    """G5: comm is cut at 15 characters by the kernel; protected_pids adds single processes."""
    _helper, (daemon,) = processes.holder("--open", devices.gpu(0), "--comm", "nvidia-persistenced")
    _helper, (custom,) = processes.holder("--open", devices.gpu(1), "--comm", "my-profiler")
    _helper, (listed,) = processes.holder("--open", devices.gpu(2))
    _helper, (victim,) = processes.holder("--open", devices.gpu(3))
    result = run_module(MODULE, kill_args(devices, protected=["my-profiler"], protected_pids=[listed]), env=nvml_env)
    reasons = {entry["pid"]: entry["reason"] for entry in result["protected"]}
    assert reasons[daemon].startswith("protected name nvidia-persistenced (")
    assert reasons[custom] == "protected name my-profiler"
    assert reasons[listed] == "listed in protected_pids"
    assert pids_of(result["terminated"]) == {victim}
    assert alive(daemon) and alive(custom) and alive(listed)


@pytest.mark.covers('G4')
def test_ancestor_holding_a_device_is_protected(devices, nvml_env):
    """G4: the module's direct parent (a sacrificial shell, as Ansible's command wrapper is) and its grandparent (this
    test) hold device files: both are ancestors, protected and never signalled - a regression fails here by
    assertion, not by signalling the test runner."""
    parent = ("bash", "-c", 'exec 9<"$0"; echo "parent $$" >&2; "$@"; exit 0', devices.gpu(0))
    with open(devices.gpu(1), "rb"):
        result = run_module(MODULE, kill_args(devices), env=nvml_env, prefix=parent)
    (shell,) = [int(line.split()[1]) for line in result.stderr.splitlines() if line.startswith("parent ")]
    reasons = {entry["pid"]: entry["reason"] for entry in result["protected"]}
    assert reasons.get(shell, "").startswith("ancestor of this module"), result.result
    assert reasons.get(os.getpid(), "").startswith("ancestor of this module"), result.result
    assert result["changed"] is False and result["signals"] == [] and result["targets"] == []


@pytest.mark.covers('G27')
def test_max_targets_exceeded_signals_nothing(devices, processes, nvml_env):
    """G27."""
    pids = [processes.holder("--open", devices.gpu(i))[1][0] for i in range(3)]
    result = run_module(MODULE, kill_args(devices, max_targets=2), env=nvml_env)
    assert result.failed and "max_targets=2" in result["msg"]
    assert pids_of(result["targets"]) == set(pids)
    assert result["signals"] == []
    assert all(alive(pid) for pid in pids)


@pytest.mark.host_pid_namespace
@pytest.mark.covers('G9', 'G18')
@pytest.mark.parametrize(("reaped", "reason"), [(True, "no such process"), (False, "exited (a zombie its parent has not reaped)")])
def test_stale_nvml_pid_after_fork_is_reported_and_the_real_holder_killed(devices, processes, sim, nvml_env, reaped, reason):
    """G9, G18 / F8: the parent allocated and forked; it died; NVML still lists it while the child holds the memory."""
    proc, (parent, child) = processes.holder("--open", devices.gpu(2), devices.ctl, "--fork-child",
                                             "--sim-root", str(sim.root), "--alloc", "0:20480")
    proc.kill()
    if reaped:
        proc.wait()
    else:
        wait_for(lambda: ProcReader().stat(parent).state == "Z", "the killed parent never became a zombie")
    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert [(s["pid"], s["gpu"], s["reason"]) for s in result["stale_nvml_pids"]] == [(parent, 0, reason)]
    assert pids_of(result["terminated"]) == {child}
    assert parent not in {s["pid"] for s in result["signals"]}
    # minor 2 is NVML index 0 in this simulation
    assert result["terminated"][0]["gpus"] == [0]


@pytest.mark.host_pid_namespace
@pytest.mark.covers('G10')
def test_nvml_pid_reused_by_an_unrelated_process_is_not_signalled(devices, processes, sim, nvml_env):
    """G10 / F9: NVML lists a PID that now belongs to a process holding no GPU file."""
    decoy = processes.decoy("python3")
    _helper, (holder,) = processes.holder("--open", devices.gpu(0))
    sim.allocate(1, 4096, holders=[holder], reported_pid=decoy.pid)
    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    stale = {s["pid"]: s["reason"] for s in result["stale_nvml_pids"]}
    assert "reused" in stale[decoy.pid]
    assert decoy.poll() is None
    assert pids_of(result["terminated"]) == {holder}


@pytest.mark.host_pid_namespace
@pytest.mark.covers('G11')
@pytest.mark.parametrize("garbage_pid", [0, 1, 2**32 - 1])
def test_garbage_from_nvml_is_reported_and_never_signalled(devices, processes, sim, nvml_env, garbage_pid):
    """G11 / F11: NVML lists an impossible PID (0 would signal our process group, 1 is init) with memory it cannot
    measure (2**64 - 1). It is reported as implausible with a warning; only the real holder is signalled."""
    _helper, (holder,) = processes.holder("--open", devices.gpu(0))
    sim.allocate(1, 2048, holders=[], reported_pid=garbage_pid, leak=True, unknown_used=True)
    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert not result.failed, result["msg"]
    assert result["stale_nvml_pids"] == [{"pid": garbage_pid, "gpu": 1, "used_mib": None, "reason": "implausible PID"}]
    assert any(f"implausible PIDs {garbage_pid}" in warning for warning in result.warnings)
    assert {s["pid"] for s in result["signals"]} == {holder}
    assert pids_of(result["terminated"]) == {holder}


@pytest.mark.host_pid_namespace
def test_nvml_only_holder_confirmed_by_proc_is_attributed_to_its_gpu(devices, processes, sim, nvml_env):
    """sources=[nvml]: discovery from NVML's list, each PID confirmed in /proc before it can be a target."""
    _helper, (pid,) = processes.holder("--open", devices.ctl, "--sim-root", str(sim.root), "--alloc", "3:1000")
    _helper, (unlisted,) = processes.holder("--open", devices.gpu(0))
    result = run_module(MODULE, kill_args(devices, sources=["nvml"]), env=nvml_env)
    assert pids_of(result["terminated"]) == {pid}
    assert result["terminated"][0]["via"] == ["fd", "nvml"] and result["terminated"][0]["gpus"] == [3]
    assert alive(unlisted)


@pytest.mark.covers('G23')
def test_selection_maps_indexes_and_uuids_through_permuted_minors(devices, processes, sim, nvml_env):
    """G23: minors [2, 0, 3, 1] against indexes 0-3; /dev/nvidia3 is GPU index 2."""
    _helper, (on_index2,) = processes.holder("--open", devices.gpu(3))
    _helper, (on_index0,) = processes.holder("--open", devices.gpu(2))
    plan = run_module(MODULE, kill_args(devices, gpus=["2"]), check_mode=True, env=nvml_env)
    assert pids_of(plan["targets"]) == {on_index2}
    assert plan["targets"][0]["gpus"] == [2]
    by_uuid = run_module(MODULE, kill_args(devices, gpus=[sim.gpus[0].uuid]), env=nvml_env)
    assert pids_of(by_uuid["terminated"]) == {on_index0}
    assert alive(on_index2)


@pytest.mark.covers('G24')
def test_shared_nodes_alone_do_not_make_a_holder_of_a_selected_gpu(devices, processes, nvml_env):
    """G24: only nvidiactl + nvidia-uvm held; GPU 1 selected."""
    _helper, (pid,) = processes.holder("--open", devices.ctl, devices.uvm)
    result = run_module(MODULE, kill_args(devices, gpus=["1"]), env=nvml_env)
    assert result["holders"] == [] and result["changed"] is False
    assert alive(pid)
    everything = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env)
    assert pids_of(everything["targets"]) == {pid}


@pytest.mark.parametrize(("args", "message"), [
    ({"gpus": ["9"]}, "GPU index 9 does not exist: NVML sees 4 GPU(s)"),
    ({"gpus": ["GPU-00000000-dead"]}, "no GPU has UUID 'GPU-00000000-dead'"),
    ({"gpus": ["first"]}, "'first' is neither a GPU index"),
    ({"gpus": ["-1"]}, "'-1' is neither a GPU index"),
    ({"term_timeout": -1}, "term_timeout: must be at least 0"),
    ({"kill_timeout": "soon"}, "kill_timeout"),
    ({"max_targets": 0}, "max_targets: must be a whole number of at least 1"),
    ({"nvml_timeout": 0}, "nvml_timeout: must be greater than 0"),
    ({"protected_pids": [1]}, "protected_pids: 1 is not a valid process id"),
    ({"protected": ["bin/sh"]}, "protected: 'bin/sh' is not a process name"),
    ({"device_paths": ["dev/nvidia*"]}, "device_paths: 'dev/nvidia*' is not an absolute path"),
    ({"sources": ["ps"]}, "sources"),
])
def test_bad_input_fails_clearly_and_signals_nothing(devices, processes, nvml_env, args, message):
    _helper, (pid,) = processes.holder("--open", devices.gpu(0))
    result = run_module(MODULE, {**kill_args(devices), **args}, env=nvml_env)
    assert result.failed
    assert message in result["msg"]
    assert alive(pid)


@pytest.mark.covers("G34")
@pytest.mark.parametrize(("pids", "message"), [
    ([0], "protected_pids: 0 is not a valid process id"), ([1], "protected_pids: 1 is not a valid process id"),
    ([-5], "protected_pids: -5 is not a valid process id"), (["twelve"], "protected_pids"),
])
def test_invalid_protected_pids_are_rejected_before_any_signal(devices, processes, pids, message, nvml_env):
    """G34: PIDs at or below 1, negative ones and strings are refused naming the option; the holder is not signalled."""
    _helper, (holder,) = processes.holder("--open", devices.gpu(0))
    result = run_module(MODULE, kill_args(devices, protected_pids=pids), env=nvml_env)
    assert result.failed and message in result["msg"] and alive(holder)


@pytest.mark.covers("G34")
def test_huge_and_duplicate_protected_pids_protect_nothing_else_and_are_harmless(devices, processes, nvml_env):
    """G34: a PID beyond pid_max and a PID given twice: the live one is protected once, nothing else changes."""
    _helper, (holder,) = processes.holder("--open", devices.gpu(0))
    _other, (target,) = processes.holder("--open", devices.gpu(1))
    result = run_module(MODULE, kill_args(devices, protected_pids=[holder, holder, 2**31 - 1]), env=nvml_env)
    assert not result.failed and pids_of(result["terminated"] + result["killed"]) == {target}
    assert [p["pid"] for p in result["protected"]] == [holder] and alive(holder)


@pytest.mark.host_pid_namespace
@pytest.mark.covers('G14')
def test_a_thread_id_nvml_lists_is_never_taken_for_a_process(devices, processes, sim, nvml_env, signal_path):
    """G14: NVML names a thread of a two-threaded holder that protected_pids protects. /proc/<tid> can be read, but its
    Tgid is not its id: it is a stale NVML PID ("a thread id"), never a target - kill(tid) would end the protected
    process, on the path without pidfds (kernels before 5.3) as on the one with them."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), "--thread")
    tid = next(int(task) for task in os.listdir(f"/proc/{pid}/task") if int(task) != pid)
    sim.allocate(1, 4096, holders=[pid], reported_pid=tid)
    result = run_module(MODULE, kill_args(devices, protected_pids=[pid]), env={**nvml_env, **signal_path.env})
    assert not result.failed, result["msg"]
    assert {entry["pid"]: entry["reason"] for entry in result["stale_nvml_pids"]} == {tid: "a thread id, not a process"}
    assert pids_of(result["protected"]) == {pid} and result["targets"] == [] and result["signals"] == []
    assert alive(pid) and len(os.listdir(f"/proc/{pid}/task")) == 2


@pytest.mark.covers('G14', 'G34')
def test_thread_id_in_protected_pids_is_rejected(devices, processes, nvml_env):
    """G14/G34: a thread id has a readable /proc entry and kill(tid) would hit the whole process."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), "--zombie-leader")
    wait_for_zombie_leader(pid)
    tid = next(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    result = run_module(MODULE, kill_args(devices, protected_pids=[tid]), env=nvml_env)
    assert result.failed and f"protected_pids: {tid} is a thread id" in result["msg"] and result.result.get("signals", []) == []
    assert len(os.listdir(f"/proc/{pid}/task")) > 1, "its worker thread still runs: nothing was signalled"


def test_missing_nvidia_ml_py_gives_the_missing_library_message(devices, tmp_path, nvml_env):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text("raise ImportError('No module named pynvml')\n")
    env = dict(nvml_env, PYTHONPATH=f"{shadow}:{os.environ.get('PYTHONPATH', '')}")
    from conftest import COLLECTIONS
    env["PYTHONPATH"] = f"{shadow}:{COLLECTIONS}"
    result = run_module(MODULE, kill_args(devices), env=env)
    assert result.failed and "Failed to import the required Python library (nvidia-ml-py)" in result["msg"]
    proc_only = run_module(MODULE, kill_args(devices, sources=["proc"]), env=env)
    assert not proc_only.failed, "a /proc-only scan must work without NVML"


@pytest.mark.covers('M9')
def test_missing_nvml_library_and_unloaded_driver_fail_cleanly(devices, sim, nvml_env, tmp_path):
    """M9-style: no traceback, a message naming the cause."""
    no_library = run_module(MODULE, kill_args(devices), env=dict(nvml_env, LD_LIBRARY_PATH=str(tmp_path)))
    assert no_library.failed and "libnvidia-ml.so.1 was not found" in no_library["msg"]
    sim.fault("nvmlInitWithFlags", 9)
    no_driver = run_module(MODULE, kill_args(devices), env=nvml_env)
    assert no_driver.failed and "the NVIDIA kernel driver is not loaded" in no_driver["msg"]
    assert "Traceback" not in no_driver["msg"]


@pytest.mark.covers('M6')
def test_hung_nvml_fails_within_nvml_timeout(devices, processes, sim, nvml_env):
    """M6 for the killer: a hung NVML call ends the task, nothing is signalled."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0))
    sim.fault("nvmlDeviceGetCount_v2", "hang")
    started = time.monotonic()
    result = run_module(MODULE, kill_args(devices, nvml_timeout=1), env=nvml_env)
    assert time.monotonic() - started < 20
    assert result.failed and "did not return within nvml_timeout=1s" in result["msg"]
    assert alive(pid)


@pytest.mark.covers('G29')
def test_a_second_run_waits_for_the_host_lock_then_fails_naming_the_holder(devices, nvml_env):
    """G29: two runs never scan and signal at once."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._locking import lock_path

    with open(lock_path("gpu_holders_kill"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        result = run_module(MODULE, kill_args(devices, lock_timeout=0.3), env=nvml_env)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert result.failed and f"(pid {os.getpid()})" in result["msg"]


@pytest.mark.covers('G29')
def test_two_runs_at_once_on_the_same_holders_both_succeed_and_report_only_what_each_did(devices, processes, nvml_env):
    """G29 for real: two module processes started together on the same holders (two of which ignore SIGTERM, so the
    first run holds the lock for its whole TERM grace). The lock makes the second wait; it then finds nothing left.
    No PID gets a signal from both, and each run's report is exactly the signals it sent."""
    holders = [processes.holder("--open", devices.gpu(gpu))[1][0] for gpu in range(2)]
    holders += [processes.holder("--open", devices.gpu(gpu), "--ignore-term")[1][0] for gpu in range(2, 4)]
    args = kill_args(devices, term_timeout=1, lock_timeout=30)
    runs = [start_module(MODULE, args, env=nvml_env) for _run in range(2)]
    results = [json.loads(run.communicate(timeout=60)[0]) for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    first, second = sorted(results, key=lambda result: -len(result["signals"]))
    assert pids_of(first["terminated"]) | pids_of(first["killed"]) == set(holders)
    assert pids_of(first["killed"]) == set(holders[2:])  # the SIGTERM-ignorers needed SIGKILL
    assert second["targets"] == [] and second["signals"] == [] and second["changed"] is False
    sent = [(entry["pid"], entry["signal"]) for entry in first["signals"] if entry["result"] == "sent"]
    assert len(sent) == len(set(sent))  # no signal twice to one process
    assert not any(alive(pid) for pid in holders)


@pytest.mark.covers('E7', 'E8', 'G4')
def test_local_connection_ancestors_and_async_wrapper_are_protected(devices, processes, tmp_path, nvml_env):
    """E7/E8 and G4: ansible-playbook on a local connection holds a device (inherited fd) in its whole chain."""
    decoy = processes.decoy("python3", "ansible")
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"""
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Free the GPUs (synchronous)
      gpufleet.serving.gpu_holders_kill:
        device_paths: {devices.globs}
      register: sync_run
    - name: Free the GPUs (async)
      gpufleet.serving.gpu_holders_kill:
        device_paths: {devices.globs}
      async: 60
      poll: 1
      register: async_run
    - name: Nothing was signalled and the chain was protected
      ansible.builtin.assert:
        that:
          - sync_run.signals == [] and async_run.signals == []
          - sync_run.protected | length > 0
          - async_run.protected | map(attribute='reason') | select('search', 'ansible-playbook') | list | length > 0
""")
    # the async job files in the test's own directory: async_status would look under the passwd home, not $HOME
    env = {**os.environ, **nvml_env, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "ANSIBLE_ASYNC_DIR": str(tmp_path / "async")}
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    run = subprocess.run(["sh", "-c", f'exec 3<"{devices.gpu(0)}"; exec "{ansible_playbook}" -i localhost, "{playbook}"'],
                         capture_output=True, text=True, env=env, timeout=180, cwd=REPO, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert decoy.poll() is None


def test_helper_is_executable_python():
    """The helper is what the lab installs on nodes; it must stay importable."""
    assert subprocess.run([sys.executable, str(HELPER), "--help"], capture_output=True, check=False).returncode == 0


@pytest.mark.covers('G5')
@pytest.mark.parametrize("daemon", sorted(set(PROTECTED_DAEMONS) - {"systemd", "sshd"}))
def test_every_builtin_daemon_name_is_protected_with_its_reason(devices, processes, nvml_env, daemon):
    """G5: the daemons a GPU node runs besides the engines (NVIDIA, DCGM, MPS, Kubernetes device plugin, GPU Operator)."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0), "--comm", daemon)
    result = run_module(MODULE, kill_args(devices), env=nvml_env)
    # the helper sets comm only, and comm keeps 15 characters: names sharing those are told apart by the executable
    expected = {f"protected name {name} ({why})" for name, why in PROTECTED_DAEMONS.items() if name[:15] == daemon[:15]}
    assert pids_of(result["protected"]) == {pid} and result["protected"][0]["reason"] in expected
    assert result["signals"] == [] and alive(pid)


class SystemdGroups:
    """Processes moved into cgroups named like systemd units, in the hierarchy systemd's unit names are read from."""

    def __init__(self):
        self.root = next((root for root in ("/sys/fs/cgroup/systemd", "/sys/fs/cgroup") if os.path.isfile(f"{root}/cgroup.procs")), None)
        self.made: list[str] = []

    def put(self, pid: int, unit: str) -> None:
        if self.root is None:
            pytest.skip("no writable cgroup hierarchy for systemd's unit names on this machine")
        group = f"{self.root}/gpufleet-test-{os.getpid()}.slice/{unit}"
        try:
            os.makedirs(group, exist_ok=True)
            with open(f"{group}/cgroup.procs", "w") as procs:
                procs.write(str(pid))
        except OSError as exc:
            pytest.skip(f"cannot create or join a cgroup here: {exc}")
        self.made.append(group)

    def remove(self) -> None:
        for group in reversed(self.made):
            remove_cgroup(group)
        if self.made:
            remove_cgroup(os.path.dirname(self.made[0]))


@pytest.fixture
def unit_groups(processes):
    groups = SystemdGroups()
    yield groups
    processes.cleanup()  # the groups can go only once their processes have
    groups.remove()


def holders_in_units(devices, processes, unit_groups) -> dict[str, int]:
    placed = {}
    for gpu, unit in enumerate(["vllm.service", "other-app.service", "session-42.scope", f"libpod-{'a' * 64}.scope", "run-r1f2.scope"]):
        _helper, (pid,) = processes.holder("--open", devices.gpu(gpu % 4))
        unit_groups.put(pid, unit)
        placed[unit] = pid
    return placed


@pytest.mark.covers('G25')
def test_each_holder_is_placed_by_the_unit_it_runs_in(devices, processes, nvml_env, unit_groups):
    """G25: in a unit being stopped, in another service (named, with its Restart=), in a login session, in a container,
    elsewhere; with outside_units=kill (the dedicated node) every one is a target."""
    placed = holders_in_units(devices, processes, unit_groups)
    _helper, (loose,) = processes.holder("--open", devices.gpu(3))  # this test's own cgroup: no unit
    plan = run_module(MODULE, kill_args(devices, units=["vllm.service"]), check_mode=True, env=nvml_env)
    result = run_module(MODULE, kill_args(devices, units=["vllm.service"]), env=nvml_env)
    assert plan["targets"] == result["targets"] and plan["signals"] == []
    placement = {target["pid"]: (target["unit"], target["placement"]) for target in result["terminated"] + result["killed"]}
    assert placement == {placed["vllm.service"]: ("vllm.service", "listed_unit"),
                         placed["other-app.service"]: ("other-app.service", "other_service"),
                         placed["session-42.scope"]: ("session-42.scope", "session"),
                         placed[f"libpod-{'a' * 64}.scope"]: (f"libpod-{'a' * 64}.scope", "container"),
                         placed["run-r1f2.scope"]: ("run-r1f2.scope", "elsewhere"),
                         loose: (ProcReader().unit(loose), "elsewhere")}
    assert [t["restart"] for t in result["targets"] if t["placement"] == "other_service"] == ["no"]  # no systemd here: nothing restarts
    assert any("other-app.service, which is not among the units being stopped" in warning for warning in result.warnings)
    assert not any(alive(pid) for pid in placement)


def run_command(argv, environ_update=None):
    """AnsibleModule.run_command's contract, for a Systemctl driven outside a module."""
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(environ_update or {})}, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.covers('G25')
def test_a_holder_that_is_the_main_process_of_a_restarting_service_is_refused_by_what_systemctl_says(
        devices, processes, nvml_env, unit_groups, tmp_path):
    """G25 through the collection's own systemctl reader (systemd itself: molecule/teardown_faults): a holder in
    sidecar.service, whose `systemctl show` says Restart=always and names it MainPID, is never killed alone - the plan
    is refused naming the unit, while the same holder in a service that does not restart is a target."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(2))
    unit_groups.put(pid, "sidecar.service")
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\n"
                         f'case "$*" in *sidecar.service*) printf "Id=sidecar.service\\nRestart=%s\\nMainPID={pid}\\n" "$(cat {tmp_path}/restart)";; esac\n')
    systemctl.chmod(0o755)
    reader = ProcReader()
    request = holders_kill.KillRequest.from_params(dict(kill_args(devices), gpus=None, sources=["proc"], protected=[], protected_pids=[],
                                                        ambiguous="report", max_targets=8, nvml_timeout=5, lock_timeout=5), reader)
    policy = systemctl_reader.restart_policy_reader(systemctl_reader.Systemctl(run_command, str(systemctl)))
    (tmp_path / "restart").write_text("always")
    plan = holders_kill.observe(request, None, reader, self_pid=processes.decoy("module").pid, restart_policy=policy)
    assert pids_of(plan.restarting) == {pid} and plan.restarting[0]["restart"] == "always"
    assert "sidecar.service (Restart=always), which systemd would start again: nothing was signalled" in holders_kill.refusal(plan, request)
    (tmp_path / "restart").write_text("no")
    plan = holders_kill.observe(request, None, reader, self_pid=processes.decoy("module").pid, restart_policy=policy)
    assert plan.restarting == [] and pids_of(plan.targets) == {pid} and holders_kill.refusal(plan, request) is None
    assert alive(pid)


@pytest.mark.covers('G6', 'G26', 'E6')
def test_outside_units_report_kills_the_units_holders_and_leaves_the_others_listed(devices, processes, nvml_env, unit_groups):
    """G6, G26, E6: a job in an SSH session, a container and another service keep running; the engine's holder dies."""
    placed = holders_in_units(devices, processes, unit_groups)
    result = run_module(MODULE, kill_args(devices, units=["vllm.service"], outside_units="report"), env=nvml_env)
    assert result.rc == 0
    assert pids_of(result["terminated"]) == {placed["vllm.service"]}
    assert pids_of(result["outside"]) == set(placed.values()) - {placed["vllm.service"]}
    assert all(alive(pid) for unit, pid in placed.items() if unit != "vllm.service")
    assert {s["pid"] for s in result["signals"]} == {placed["vllm.service"]}


@pytest.mark.covers('G6')
def test_outside_units_fail_signals_nothing_and_names_the_holders(devices, processes, nvml_env, unit_groups):
    """G6: fail closed - not even the listed unit's holder is signalled when another holder is outside the units."""
    placed = holders_in_units(devices, processes, unit_groups)
    for check_mode in (True, False):
        result = run_module(MODULE, kill_args(devices, units=["vllm.service"], outside_units="fail"), check_mode=check_mode, env=nvml_env)
        assert result.rc != 0 and result["signals"] == []
        assert "4 process(es) hold the GPUs outside the units being stopped" in result["msg"]
        assert "in session-42.scope (session)" in result["msg"] and "outside_units is fail: nothing was signalled" in result["msg"]
        assert pids_of(result["outside"]) == set(placed.values()) - {placed["vllm.service"]}
    assert all(alive(pid) for pid in placed.values())


def test_a_kept_units_holders_are_listed_and_never_signalled_whatever_outside_units_says(devices, processes, nvml_env, unit_groups):
    """A parked engine beside the teardown: its process keeps its GPU on purpose. Kept, neither a target nor foreign,
    while the unit being stopped and a loose holder are killed - in check mode and for real."""
    placed = {}
    for gpu, unit in enumerate(["vllm.service", "sglang.service"]):
        _helper, (pid,) = processes.holder("--open", devices.gpu(gpu))
        unit_groups.put(pid, unit)
        placed[unit] = pid
    _helper, (loose,) = processes.holder("--open", devices.gpu(2))
    args = kill_args(devices, units=["sglang.service"], kept_units=["vllm.service"])
    for check_mode in (True, False):
        result = run_module(MODULE, args, check_mode=check_mode, env=nvml_env)
        assert result.rc == 0, result.get("msg")
        assert pids_of(result["kept"]) == {placed["vllm.service"]} and result["kept"][0]["placement"] == "kept_unit"
        assert placed["vllm.service"] not in pids_of(result["targets"]) | pids_of(result["foreign"])
    assert pids_of(result["terminated"]) | pids_of(result["killed"]) == {placed["sglang.service"], loose}
    assert placed["vllm.service"] not in {s["pid"] for s in result["signals"]}
    assert alive(placed["vllm.service"]) and not alive(placed["sglang.service"]) and not alive(loose)
    refused = run_module(MODULE, kill_args(devices, kept_units=["vllm/x"]), check_mode=True, env=nvml_env)
    assert refused.rc != 0 and "units: 'vllm/x' is not a unit name" in refused["msg"]


def holders_by_owner(devices, processes, unit_groups) -> dict[str, int]:
    """The engine's process in its unit, a worker of the engine's user (daemon here) that escaped it, and a job of
    another user (nobody) in an SSH session's scope."""
    placed = {}
    for gpu, (role, user, unit) in enumerate([("engine", None, "vllm.service"), ("escaped", "daemon", "run-r9e1.scope"),
                                              ("foreign", "nobody", "session-42.scope")]):
        _helper, (pid,) = processes.holder("--open", devices.gpu(gpu), *(["--user", user] if user else []))
        unit_groups.put(pid, unit)
        placed[role] = pid
    return placed


def test_an_escaped_worker_that_is_started_again_is_killed_with_the_parent_that_starts_it(devices, processes, nvml_env, unit_groups,
                                                                                          tmp_path):
    """Found by the fault campaign: a worker of the engine's user outside its unit, under a parent of that user that
    starts it again whenever it dies (a launcher that outlived the unit). Killing the worker alone leaves a new one on
    the GPU; the parent is signalled with it, first. A parent of another user (here root: this test) is not."""
    pids_file = tmp_path / "pids"
    supervisor = subprocess.Popen([sys.executable, str(REPO / "tests" / "helpers" / "respawner.py"), "--user", "daemon", "--pids", str(pids_file),
                                   "--", sys.executable, str(HELPER), "--open", devices.gpu(1), "--user", "daemon"], stdout=subprocess.PIPE, text=True)
    processes.started.append(supervisor)
    line = supervisor.stdout.readline().split()
    assert line[:1] == ["ready"], line
    parent, worker = int(line[1]), int(line[2])
    unit_groups.put(parent, "run-r7a1.scope")  # its children are born there too
    unit_groups.put(worker, "run-r7a1.scope")
    args = kill_args(devices, units=["vllm.service"], owners=["daemon"])
    plan = run_module(MODULE, args, check_mode=True, env=nvml_env)
    assert plan.rc == 0, plan.get("msg")
    assert [(entry["pid"], entry["parent_of"], entry["user"]) for entry in plan["escaped_parents"]] == [(parent, worker, "daemon")]
    assert [target["pid"] for target in plan["targets"]] == [parent, worker]  # the parent first
    assert alive(parent) and alive(worker) and plan["signals"] == []

    result = run_module(MODULE, args, env=nvml_env)
    assert result.rc == 0, result.get("msg")
    assert pids_of(result["terminated"] + result["killed"]) == {parent, worker}
    assert [sent["pid"] for sent in result["signals"]][:1] == [parent]
    time.sleep(1.0)  # five times the parent's pause before a new child
    children = [int(word) for word in pids_file.read_text().split()]
    processes.extra_pids += children
    assert not alive(parent) and [pid for pid in children if alive(pid)] == []


@pytest.mark.covers('G26')
def test_owners_make_an_escaped_worker_the_engines_and_another_users_job_foreign(devices, processes, nvml_env, unit_groups):
    """G26 (scope by ownership): with outside_units=fail the other user's job refuses the kill, naming its pid, user and
    scope, and nothing is signalled; with report the engine and its escaped worker die and the job keeps running."""
    placed = holders_by_owner(devices, processes, unit_groups)
    args = kill_args(devices, units=["vllm.service"], owners=["daemon"])
    refused = run_module(MODULE, dict(args, outside_units="fail"), env=nvml_env)
    assert refused.rc != 0 and refused["signals"] == []
    assert pids_of(refused["outside"]) == pids_of(refused["foreign"]) == {placed["foreign"]}
    name = Path(f"/proc/{placed['foreign']}/comm").read_text().strip()  # python or python3: how pytest was started
    assert f"pid {placed['foreign']} {name} of user nobody in session-42.scope (session)" in refused["msg"]
    assert all(alive(pid) for pid in placed.values())
    by_pid = {holder["pid"]: holder for holder in refused["holders"]}
    assert (by_pid[placed["escaped"]]["user"], by_pid[placed["escaped"]]["foreign"]) == ("daemon", False)
    assert (by_pid[placed["foreign"]]["user"], by_pid[placed["foreign"]]["foreign"]) == ("nobody", True)

    left = run_module(MODULE, dict(args, outside_units="report"), env=nvml_env)
    assert left.rc == 0 and pids_of(left["terminated"] + left["killed"]) == {placed["engine"], placed["escaped"]}
    assert pids_of(left["outside"]) == pids_of(left["foreign"]) == {placed["foreign"]}
    assert alive(placed["foreign"]) and not alive(placed["engine"]) and not alive(placed["escaped"])


def test_without_owners_every_holder_outside_the_units_is_foreign(devices, processes, nvml_env, unit_groups):
    """The default (no owners): the escaped worker is as foreign as the other user's job; check mode lists both apart."""
    placed = holders_by_owner(devices, processes, unit_groups)
    plan = run_module(MODULE, kill_args(devices, units=["vllm.service"]), check_mode=True, env=nvml_env)
    assert pids_of(plan["targets"]) == set(placed.values()) and plan["signals"] == []
    assert pids_of(plan["foreign"]) == {placed["escaped"], placed["foreign"]}
    owned = run_module(MODULE, kill_args(devices, units=["vllm.service"], owners=["daemon", "no-such-user"]), check_mode=True, env=nvml_env)
    assert pids_of(owned["foreign"]) == {placed["foreign"]}, "a name that is no account owns nothing"
    assert all(alive(pid) for pid in placed.values())


@pytest.mark.parametrize(("owners", "message"), [(["root"], "owners: root owns the system's own processes"),
                                                 (["0"], "owners: root owns the system's own processes"),
                                                 (["vllm:vllm"], "owners: 'vllm:vllm' is not a user name or uid")])
def test_owners_refuses_root_and_malformed_names(devices, owners, message, nvml_env):
    result = run_module(MODULE, kill_args(devices, owners=owners), env=nvml_env)
    assert result.failed and result["msg"].startswith(message) and not result.result.get("signals")


@pytest.mark.covers('G22')
def test_device_node_is_matched_by_device_number_not_path(tmp_path, processes, nvml_env):
    """G22: the holder opened the same device through another path (a renamed or bind-mounted node)."""
    node = tmp_path / "renamed" / "nvidia-alias"
    node.parent.mkdir()
    try:
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # the device behind /dev/full
    except PermissionError:
        pytest.skip("mknod is not permitted here")
    _helper, (pid,) = processes.holder("--open", "/dev/full")
    result = run_module(MODULE, {"device_paths": [str(node)], "sources": ["proc"]}, check_mode=True, env=nvml_env)
    planned = [target for target in result["targets"] if target["pid"] == pid]
    assert planned and planned[0]["devices"] == [str(node)] and planned[0]["via"] == ["fd"]


@pytest.mark.host_pid_namespace
def test_selection_trusts_nvml_over_device_nodes_that_cuda_opens_for_every_gpu(devices, processes, sim, nvml_env):
    """Measured on H200s: a CUDA process on GPU 0 also holds /dev/nvidia1. Freeing GPU 1 must leave it alone."""
    # minors [2, 0, 3, 1]: index 0 is /dev/nvidia2, index 1 is /dev/nvidia0
    on_gpu0 = processes.holder("--open", devices.gpu(2), devices.gpu(0), devices.ctl, "--sim-root", str(sim.root), "--alloc", "0:8000")[1][0]
    on_gpu1 = processes.holder("--open", devices.gpu(2), devices.gpu(0), devices.ctl, "--sim-root", str(sim.root), "--alloc", "1:8000")[1][0]
    unlisted_both = processes.holder("--open", devices.gpu(2), devices.gpu(0))[1][0]
    unlisted_only_gpu1 = processes.holder("--open", devices.gpu(0))[1][0]
    result = run_module(MODULE, kill_args(devices, gpus=["1"]), env=nvml_env)
    assert pids_of(result["terminated"]) == {on_gpu1, unlisted_only_gpu1}
    assert pids_of(result["ambiguous"]) == {unlisted_both}
    assert alive(on_gpu0) and alive(unlisted_both)
    assert any("ambiguous" in w for w in result.warnings)
    everything = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env)
    assert {t["pid"]: t["gpus"] for t in everything["targets"]} == {on_gpu0: [0], unlisted_both: [0, 1]}
    forced = run_module(MODULE, kill_args(devices, gpus=["1"], ambiguous="kill"), check_mode=True, env=nvml_env)
    assert pids_of(forced["targets"]) == {unlisted_both} and forced["ambiguous"] == []


@pytest.mark.covers('G19', 'G20')
def test_unkillable_holder_fails_the_task_within_its_deadline_and_is_reported(devices, processes, frozen, nvml_env, signal_path):
    """G19/G20 (F4): a frozen holder stays in D state with SIGKILL pending. The module fails after kill_timeout
    instead of hanging, names the survivor with its state and pending signals, never reads its cmdline, and a
    second run reports the same survivor without counting a kill; on both signal paths (a pidfd's wait and the
    thread list's poll)."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(1))
    frozen.freeze(pid)
    args = kill_args(devices, term_timeout=0.5, kill_timeout=1)
    nvml_env = {**nvml_env, **signal_path.env}

    started = time.monotonic()
    first = run_module(MODULE, args, env=nvml_env, timeout=30)
    assert sent_via(first) == {signal_path.name}
    # the deadline held: the module's own time within its budget (TERM 0.5 s + KILL 1 s, and the scan and NVML reads),
    # and the whole run (with the interpreter's start) well inside the harness's 30 s
    assert first["elapsed"] < 0.5 + 1 + 4, f"the module took {first['elapsed']:.1f}s of a 1.5s budget"
    assert time.monotonic() - started < 0.5 + 1 + 15
    assert first.failed and f"{pid} (python" in first["msg"] and "state D" in first["msg"]
    (survivor,) = first["survivors"]
    assert survivor["pid"] == pid and survivor["state"] == "D" and survivor["cmdline"] is None
    assert "SIGKILL" in survivor["signals_pending"] and survivor["wchan"]
    assert first["killed"] == [] and first["terminated"] == []

    second = run_module(MODULE, args, env=nvml_env, timeout=30)
    assert second.failed and pids_of(second["survivors"]) == {pid}
    assert second["killed"] == [] and second["terminated"] == []

    frozen.thaw()  # the pending SIGKILL now takes effect
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, "thawed process did not die of its pending SIGKILL"
        time.sleep(0.05)
    after = run_module(MODULE, args, env=nvml_env)
    assert not after.failed and after["changed"] is False and after["holders"] == []


def still_reading(argv: list[str], within: float = 1.0) -> bool:
    """Whether a reader (argv) is still waiting after `within` seconds. It is killed either way, and not waited for:
    a wait on a FUSE server that took the request outlasts even SIGKILL (the hung_mount fixture's end wakes it)."""
    reader = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        reader.wait(timeout=within)
        return False
    except subprocess.TimeoutExpired:
        return True
    finally:
        reader.kill()


@pytest.mark.covers('G20')
@pytest.mark.timeout(120)
def test_holder_with_a_wedged_memory_map_is_reported_without_its_cmdline_and_the_run_ends(devices, processes, hung_mount, nvml_env):
    """G20: a holder one of whose threads faults a page in from a mount that never answers - its memory map lock held
    for read - while another waits for the lock for write, as a thread wedged in a driver ioctl leaves a process:
    reading its /proc/<pid>/cmdline blocks (shown first, with cat), though its leader sleeps in S, not D. The plan
    and the run still end: the holder is reported by pid, exe and state, its cmdline given up after its time box
    (cmdline None, blocked_reads), and, since its faulting thread cannot die until the mount answers, named as a
    survivor at kill_timeout. With the time box removed the first run_module hangs past its timeout."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(1), "--wedged-mm", str(hung_mount / "pages"))
    wait_for(lambda: still_reading(["cat", f"/proc/{pid}/cmdline"]), "reading the wedged holder's cmdline to block", timeout=20)
    assert ProcReader().stat(pid).state == "S"  # what the D-state skip alone would not catch

    plan = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env, timeout=30)
    (holder,) = plan["holders"]
    assert holder["pid"] == pid and holder["state"] == "S" and holder["exe"].startswith(sys.base_prefix)
    assert holder["cmdline"] is None and holder["blocked_reads"] == ["cmdline"] and holder["via"] == ["fd"]
    assert plan["changed"] is True and not plan.failed, plan["msg"]

    result = run_module(MODULE, kill_args(devices, term_timeout=0.5, kill_timeout=1), env=nvml_env, timeout=30)
    assert result.failed and pids_of(result["survivors"]) == {pid}
    (survivor,) = result["survivors"]
    assert survivor["cmdline"] is None and survivor["exe"] and survivor["state"] == "Z" and survivor["threads"] == 2


@pytest.mark.covers('G20')
@pytest.mark.timeout(120)
def test_holder_of_a_file_on_a_hung_mount_is_found_and_killed_without_hanging_the_scan(devices, processes, hung_mount, nvml_env):
    """G20, the scan's side (fuser's hang on a dead NFS or FUSE mount): a holder also keeps open a file whose stat()
    never returns, and after it another process keeps the next GPU. The scan gives the first up at that descriptor
    after its time box (files_blocked) - keeping the GPU it found there before - and goes on: both are killed. With
    the scan run in the module's own process instead, it hangs on the first."""
    _first_helper, (first,) = processes.holder("--open", devices.gpu(1), "--open-hung", str(hung_mount / "frozen"))
    frozen_fd = max(int(name) for name in os.listdir(f"/proc/{first}/fd"))
    assert still_reading(["stat", "-L", f"/proc/{first}/fd/{frozen_fd}"])  # the hang the scan meets
    _second_helper, (second,) = processes.holder("--open", devices.gpu(2))

    result = run_module(MODULE, kill_args(devices, term_timeout=2, kill_timeout=2), env=nvml_env, timeout=30)
    assert not result.failed, result["msg"]
    assert pids_of(result["terminated"]) | pids_of(result["killed"]) == {first, second}
    assert result["unreadable"].get("files_blocked", 0) >= 1
    (blocked,) = [holder for holder in result["holders"] if holder["pid"] == first]
    assert blocked["devices"] == [devices.gpu(1)] and blocked["blocked_reads"] == ["files"]


@pytest.mark.covers('G6', 'G20')
@pytest.mark.timeout(120)
def test_a_holder_behind_a_blocked_read_is_never_taken_for_no_holder(devices, processes, hung_mount, nvml_env):
    """G6 fail closed, G20: a file on a hung mount opened before the GPU device (a lower descriptor, read first by a plain
    scan). Holding the device under its own path, the holder is found anyway (descriptors named as a device are read
    first) and killed. Holding it under another name (a hard link of the stand-in: nothing in the link names a device),
    its open files cannot all be read: it is a possible holder, the run fails closed in check mode and for real, names
    it with blocked_reads and signals nothing - never rc 0 with "no holder"."""
    _helper, (named,) = processes.holder("--hung-first", "--open-hung", str(hung_mount / "frozen"), "--open", devices.gpu(1))
    assert min(int(fd) for fd in os.listdir(f"/proc/{named}/fd") if os.readlink(f"/proc/{named}/fd/{fd}").endswith("frozen")) < max(
        int(fd) for fd in os.listdir(f"/proc/{named}/fd") if os.readlink(f"/proc/{named}/fd/{fd}") == devices.gpu(1))
    result = run_module(MODULE, kill_args(devices, term_timeout=2, kill_timeout=2), env=nvml_env, timeout=30)
    assert not result.failed, result["msg"]
    assert named in pids_of(result["terminated"]) | pids_of(result["killed"]) and result["possible_holders"] == []

    other_name = str(devices.root / "renamed-gpu1")
    os.link(devices.gpu(1), other_name)
    _helper, (hidden,) = processes.holder("--hung-first", "--open-hung", str(hung_mount / "frozen"), "--open", other_name)
    for check_mode in (True, False):
        refused = run_module(MODULE, kill_args(devices, term_timeout=2, kill_timeout=2), check_mode=check_mode, env=nvml_env, timeout=30)
        assert refused.failed and refused["signals"] == [], refused.result
        assert "may hold the GPUs" in refused["msg"] and f"pid {hidden} " in refused["msg"] and "reading its open files blocked" in refused["msg"]
        (possible,) = refused["possible_holders"]
        assert possible["pid"] == hidden and possible["blocked_reads"] == ["files"]
        assert refused["unreadable"].get("files_blocked", 0) >= 1
    assert alive(hidden)
    spared = run_module(MODULE, kill_args(devices, protected_pids=[hidden]), check_mode=True, env=nvml_env, timeout=30)
    assert not spared.failed and spared["possible_holders"] == [], "protected_pids: the operator says it holds no GPU"


@pytest.mark.covers('S20')
def test_killable_d_state_holder_is_killed_and_not_reported_unkillable(devices, processes, nvml_env, tmp_path, signal_path):
    """S20 (F5): a vfork parent waits in killable D state with every signal but SIGKILL blocked; its child holds the
    inherited file. SIGTERM does nothing, SIGKILL ends both, and nothing is reported as a survivor; on both signal paths."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    _helper, (pid,) = processes.holder("--open", devices.gpu(2), "--vfork-blocked", str(fifo))
    deadline = time.monotonic() + 10
    while ProcReader().stat(pid).state != "D" or not psutil.Process(pid).children():
        assert time.monotonic() < deadline, "the helper never reached vfork's D state"
        time.sleep(0.02)
    (child,) = [c.pid for c in psutil.Process(pid).children()]

    result = run_module(MODULE, kill_args(devices, term_timeout=0.5), env={**nvml_env, **signal_path.env})
    assert not result.failed, result["msg"]
    assert sent_via(result) == {signal_path.name}
    assert pids_of(result["holders"]) == {pid, child}
    assert pids_of(result["killed"]) == {pid, child} and result["survivors"] == []
    assert [s["signal"] for s in result["signals"] if s["pid"] == pid] == ["SIGTERM", "SIGCONT", "SIGKILL"]
    assert not alive(pid) and not alive(child)


@pytest.mark.covers('G33')
def test_module_killed_mid_run_leaves_nothing_behind_and_the_next_run_converges(devices, processes, nvml_env):
    """G33 / S37: the task is killed (an Ansible timeout) while the module waits out term_timeout. The target is not
    left stopped (its SIGCONT was sent, and journalled), its host lock goes with it, and the next run finishes the job."""
    proc, (pid,) = processes.holder("--open", devices.gpu(0), "--ignore-term")
    stop(proc)  # stopped before the module starts, so that "running again" below can only be the module's SIGCONT
    module = start_module(MODULE, kill_args(devices, term_timeout=60), env=nvml_env)
    # SIGTERM then SIGCONT sent: the module now waits out term_timeout
    wait_for(lambda: not is_stopped(pid) or module.poll() is not None, "the module never continued the holder", timeout=20)
    assert module.poll() is None, "the module ended before it was killed"
    module.kill()
    module.communicate(timeout=10)
    assert alive(pid) and not is_stopped(pid)
    # the holder runs again as soon as SIGCONT reaches it, maybe before its outcome line is written: the intent is there
    written = [(line["phase"], line["signal"]) for line in journal_lines(devices)]
    assert written[:3] == [("intent", "SIGTERM"), ("outcome", "SIGTERM"), ("intent", "SIGCONT")] and written[3:] in ([], [("outcome", "SIGCONT")])

    result = run_module(MODULE, kill_args(devices, term_timeout=0.5, lock_timeout=2), env=nvml_env)
    assert not result.failed, result["msg"]
    assert pids_of(result["killed"]) == {pid} and not alive(pid)


@pytest.mark.covers('G8')
def test_holder_in_another_pid_namespace_is_found_with_its_namespace_pid(devices, nvml_env):
    """G8: a container-like holder (its own PID namespace) is found through our /proc, reported with the PID it has
    inside its namespace; outside the run's scope it is refused (the default), and in scope killed by its PID in
    ours. As its namespace's init it gets no SIGTERM it has no handler for (the kernel drops it), so SIGKILL ends it."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, str(HELPER), "--open", devices.gpu(1)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert outer.stdout.readline().split() == ["ready", "1"], "the helper is PID 1 of its namespace"
        (inner,) = [child.pid for child in psutil.Process(outer.pid).children()]
        refused = run_module(MODULE, {key: value for key, value in kill_args(devices).items() if key != "outside_units"}, env=nvml_env)
        assert refused.failed and pids_of(refused["outside"]) == {inner} and refused["signals"] == [], refused.result
        assert refused["outside"][0]["namespace_pid"] == 1 and alive(inner)
        result = run_module(MODULE, kill_args(devices, term_timeout=0.5), env=nvml_env)
        (holder,) = result["holders"]
        assert holder["pid"] == inner and holder["namespace_pid"] == 1
        assert pids_of(result["killed"]) == {inner} and not alive(inner)
    finally:
        outer.kill()
        outer.wait()


NAMESPACE_DRIVER = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import nvml_sim
helper, selected_device, other_device, sim_root, module_args = sys.argv[2:7]
def start(device):
    holder = subprocess.Popen([sys.executable, helper, "--open", device], stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    return holder
first, second = start(selected_device), start(other_device)  # PIDs 2 and 3 of this namespace
# NVML, as the host's driver would, lists a number of this namespace on GPU 1: here it names the holder of GPU 0
nvml_sim.allocate(sim_root, 1, 5000, [second.pid], reported_pid=second.pid)
done = subprocess.run([sys.executable, "-m", "ansible_collections.gpufleet.serving.plugins.modules.gpu_holders_kill", module_args],
                      capture_output=True, text=True, cwd="/", check=False)
first.poll()
print(json.dumps({"first": first.pid, "second": second.pid, "alive": [first.returncode is None, second.poll() is None],
                  "result": json.loads(done.stdout)}))
for holder in (first, second):
    holder.kill()
"""


@pytest.mark.covers('G8')
@pytest.mark.timeout(120)
def test_inside_a_pid_namespace_an_nvml_pid_never_picks_the_process_that_has_its_number_there(devices, sim, nvml_env):
    """G8, the wrong-target kill end to end: the module runs under `unshare --pid --fork --mount-proc`, with gpus: [1].
    PID 2 there holds GPU 1's device file; PID 3 holds only GPU 0's, and NVML lists the number 3 on GPU 1. PID 3 is no
    target and lives, the warning says NVML's PIDs were not used; PID 2 - an ordinary process in a namespace, not
    kthreadd - is the target, found by its device file, and killed."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    by_index = {gpu.index: devices.gpu(gpu.minor) for gpu in sim.gpus}
    module_args = json.dumps({"ANSIBLE_MODULE_ARGS": dict(kill_args(devices, gpus=["1"]), _ansible_check_mode=False)})
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAMESPACE_DRIVER, str(REPO / "tests" / "sim"),
                           str(HELPER), by_index[1], by_index[0], str(sim.root), module_args],
                          env={**os.environ, "PYTHONPATH": str(COLLECTIONS), **nvml_env}, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    result = seen["result"]
    assert (seen["first"], seen["second"]) == (2, 3) and not result.get("failed"), result
    assert pids_of(result["targets"]) == {2} and pids_of(result["terminated"]) | pids_of(result["killed"]) == {2}
    assert seen["alive"] == [False, True], "the holder of GPU 1 died; the process NVML's number names here lives"
    assert 3 not in {entry["pid"] for entry in result["signals"]}
    assert [(entry["pid"], entry["gpu"]) for entry in result["stale_nvml_pids"]] == [(3, 1)]
    assert "were not used to place or select holders" in json.dumps(result.get("warnings")), result.get("warnings")


def spawn_with_pid(pid: int, processes) -> subprocess.Popen | None:
    """A decoy that holds no GPU, started under a given PID through the PID namespace's last-PID counter (root)."""
    for _attempt in range(50):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as counter:
                counter.write(str(pid - 1))
        except OSError:
            return None
        decoy = processes.decoy("reused")
        if decoy.pid == pid:
            return decoy
    return None


@pytest.mark.covers("G12")
def test_a_pid_reused_between_the_scan_and_the_signal_is_never_signalled(devices, processes, nvml_env, signal_path):
    """G12: the holder scanned exits, an unrelated process takes its PID before the first signal; the plan's identity
    (PID and start time) no longer matches, so the newcomer is left alone and the holder is reported exited."""
    helper, (pid,) = processes.holder("--open", devices.gpu(0))
    reader = ProcReader()
    request = holders_kill.KillRequest.from_params(dict(kill_args(devices), gpus=None, sources=["proc"], protected=[], protected_pids=[],
                                                        ambiguous="report", max_targets=8, nvml_timeout=5, lock_timeout=5), reader)
    # observed as the module would see it from a process of its own: this test's children are not its descendants
    bystander = processes.decoy("module")
    plan = holders_kill.observe(request, None, reader, self_pid=bystander.pid)
    assert [target["pid"] for target in plan.targets] == [pid]
    helper.kill()
    helper.wait()
    newcomer = spawn_with_pid(pid, processes)
    if newcomer is None:
        pytest.skip("cannot steer the next PID here (ns_last_pid needs root in the initial PID namespace)")
    result = holders_kill.apply(plan, request, Signaller(reader, use_pidfd=signal_path.use_pidfd))
    assert result["not_signalled"] == [{"pid": pid, "start_time": plan.targets[0]["start_time"], "reason": "pid reused by another process"}]
    assert result["signals"] == [] and newcomer.poll() is None


@pytest.mark.covers('G6', 'E6')
def test_by_default_another_users_holder_refuses_the_run_and_nothing_is_signalled(devices, processes, nvml_env, unit_groups):
    """G6, E6 (fail closed is the default): given no outside_units, a job of another user in an SSH session refuses the
    run - in check mode and for real - naming it; not even the engine's own holder is signalled."""
    placed = holders_by_owner(devices, processes, unit_groups)
    args = {key: value for key, value in kill_args(devices, units=["vllm.service"], owners=["daemon"]).items() if key != "outside_units"}
    for check_mode in (True, False):
        refused = run_module(MODULE, args, check_mode=check_mode, env=nvml_env)
        assert refused.rc != 0 and refused["signals"] == []
        name = Path(f"/proc/{placed['foreign']}/comm").read_text().strip()  # python or python3: how pytest was started
        assert f"pid {placed['foreign']} {name} of user nobody in session-42.scope (session)" in refused["msg"]
        assert "outside_units is fail: nothing was signalled" in refused["msg"]
        assert pids_of(refused["foreign"]) == {placed["foreign"]}
    assert all(alive(pid) for pid in placed.values())
    assert not os.path.exists(journal_of(devices)), "nothing signalled, nothing journalled"


def journal_lines(devices) -> list[dict]:
    try:
        with open(journal_of(devices), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]
    except FileNotFoundError:
        return []


@pytest.mark.covers('G33', 'E9')
def test_a_module_killed_between_two_signals_leaves_the_first_signals_record_on_the_node(devices, processes, nvml_env):
    """G33, E9: the journal line of a signal is on the node before the signal is sent. Two holders ignore SIGTERM; the
    module is SIGKILLed while it waits to send SIGKILL: the journal holds SIGTERM and SIGCONT for both (pid, start time,
    exe, cgroup, uid, run id, outcome) and no SIGKILL; a plain rerun converges and journals its own signals."""
    _first, (first,) = processes.holder("--open", devices.gpu(0), "--ignore-term")
    _second, (second,) = processes.holder("--open", devices.gpu(1), "--ignore-term")
    plan = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env)
    assert pids_of(plan["targets"]) == {first, second}
    module = start_module(MODULE, kill_args(devices, term_timeout=60, run_id="run-interrupted"), env=nvml_env)
    try:
        wait_for(lambda: len([line for line in journal_lines(devices) if line["phase"] == "outcome"]) == 4,
                 "the module never journalled SIGTERM and SIGCONT for both holders", timeout=30)
        module.kill()
    finally:
        module.wait()
    lines = journal_lines(devices)
    assert [(line["phase"], line["signal"]) for line in lines if line["pid"] == first] == [
        ("intent", "SIGTERM"), ("outcome", "SIGTERM"), ("intent", "SIGCONT"), ("outcome", "SIGCONT")]
    assert {line["pid"] for line in lines} == pids_of(plan["targets"]), "only the planned holders were signalled"
    assert not is_stopped(first) and not is_stopped(second), "no process left stopped"
    intent = next(line for line in lines if line["pid"] == second and line["phase"] == "intent")
    assert intent["run_id"] == "run-interrupted" and intent["module"] == MODULE
    assert intent["start_time"] == ProcReader().start_time(second) and intent["uid"] == os.getuid()
    assert intent["exe"] == os.path.realpath(sys.executable) and intent["cgroup"] == ProcReader().cgroup(second)
    assert all(line["result"] == "sent" for line in lines if line["phase"] == "outcome")
    assert alive(first) and alive(second), "SIGKILL was never sent"

    rerun = run_module(MODULE, kill_args(devices, term_timeout=0.2, lock_timeout=2, run_id="run-rerun"), env=nvml_env)
    assert rerun["changed"] is True and pids_of(rerun["killed"]) == {first, second}
    assert not alive(first) and not alive(second)
    assert [line["signal"] for line in journal_lines(devices) if line["run_id"] == "run-rerun" and line["phase"] == "intent"] == [
        "SIGTERM", "SIGTERM", "SIGCONT", "SIGCONT", "SIGKILL", "SIGKILL"]
    # the result carries the journal's record of each signal
    assert {(entry["pid"], entry["signal"], entry["exe"]) for entry in rerun["signals"]} >= {(first, "SIGKILL", os.path.realpath(sys.executable))}
    assert rerun["journal_path"] == journal_of(devices)


def test_a_journal_that_cannot_be_written_refuses_the_run_before_any_signal(devices, processes, nvml_env, tmp_path):
    """Rule 12: no signal without its record. The journal's directory is a regular file: the run fails naming the path,
    and the holder was never signalled."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(0))
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    result = run_module(MODULE, kill_args(devices, journal_path=str(blocker / "signals.jsonl")), env=nvml_env)
    assert result.failed and f"the signal journal {blocker / 'signals.jsonl'} cannot be written" in result["msg"]
    assert "nothing was signalled" in result["msg"]
    assert alive(pid) and not is_stopped(pid)


# setpriv (util-linux) drops a capability from this process and every child for real: the kernel then hides the open
# files of other users' processes from root, as in a container given default capabilities
WITHOUT_PTRACE = ("setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--")


@pytest.mark.covers('G6')
def test_without_cap_sys_ptrace_the_scan_is_incomplete_and_the_run_refused_naming_the_capability(devices, processes, nvml_env):
    """G6 fail closed: root without CAP_SYS_PTRACE cannot read another user's /proc/<pid>/fd (EACCES) - the holder it
    hides is never "no holder". Check mode and the real run fail once, naming the missing capability and the possible
    holder; incomplete_scan=warn accepts the scan with a warning, still false in scan_complete; with the capability
    the same holder is found and planned."""
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to drop CAP_SYS_PTRACE")
    _helper, (hidden,) = processes.holder("--open", devices.gpu(1), "--user", "nobody")
    for check_mode in (True, False):
        refused = run_module(MODULE, kill_args(devices), check_mode=check_mode, env=nvml_env, prefix=WITHOUT_PTRACE)
        assert refused.failed and refused["signals"] == [] and refused["holders"] == [], refused.result
        assert refused["msg"].count("without CAP_SYS_PTRACE") == 1 and "incomplete_scan: warn" in refused["msg"]
        assert refused["scan_complete"] is False and refused["missing_capabilities"] == ["CAP_SYS_PTRACE"]
        (possible,) = [holder for holder in refused["possible_holders"] if holder["pid"] == hidden]
        assert possible["user"] == "nobody" and "permission denied" in possible["why"]
        assert refused["unreadable"]["permission_denied"] >= 1
    assert alive(hidden) and not os.path.exists(journal_of(devices))

    accepted = run_module(MODULE, kill_args(devices, incomplete_scan="warn"), check_mode=True, env=nvml_env, prefix=WITHOUT_PTRACE)
    assert not accepted.failed and accepted["scan_complete"] is False, accepted.result
    assert any("without CAP_SYS_PTRACE" in warning for warning in accepted.warnings)
    assert hidden in pids_of(accepted["possible_holders"]) and hidden not in pids_of(accepted["targets"])

    seen = run_module(MODULE, kill_args(devices), check_mode=True, env=nvml_env)
    assert seen["scan_complete"] is True and seen["missing_capabilities"] == [] and seen["possible_holders"] == []
    assert pids_of(seen["targets"]) == {hidden}
