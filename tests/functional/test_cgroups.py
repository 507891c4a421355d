"""Killing a unit's control group for real: cgroup v2 with cgroup.kill, and the v1 loop without it.

The groups are created by the test in the machine's own hierarchies (as root); each holds a daemonising
tree - a child, a `setsid` escapee and a double-forked orphan reparented to PID 1 (the catalogue's F2) -
next to a decoy outside the group that must survive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import alive, remove_cgroup, wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.cgroup import Cgroup

HIERARCHIES = {"v2": "/sys/fs/cgroup/unified", "v1": "/sys/fs/cgroup/systemd"}


def make_group(root: str) -> str:
    if not os.path.isfile(os.path.join(root, "cgroup.procs")):
        pytest.skip(f"no cgroup hierarchy at {root}")
    path = os.path.join(root, f"gpufleet-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here: {exc}")
    return path


@pytest.fixture(params=sorted(HIERARCHIES))
def group(request):
    path = make_group(HIERARCHIES[request.param])
    yield request.param, path
    remove_cgroup(path)


def daemonising_tree(group_path: str, count_file: str) -> subprocess.Popen:
    """A shell that joins the group, then starts a child, a setsid escapee and an orphan, and records their pids."""
    script = (f'echo $$ > "{group_path}/cgroup.procs"; '
              "sleep 1000 & echo $! >> \"$0\"; "
              "setsid sleep 1000 & echo $! >> \"$0\"; "
              "(sleep 1000 & echo $! >> \"$0\"); "
              "echo $$ >> \"$0\"; exec sleep 1000")
    proc = subprocess.Popen(["sh", "-c", script, count_file])
    deadline = time.monotonic() + 10
    recorded = Path(count_file)
    while not recorded.exists() or len(recorded.read_text().split()) < 4:
        assert time.monotonic() < deadline, "tree did not start"
        time.sleep(0.02)
    return proc


@pytest.mark.covers('S12', 'S27', 'S28')
def test_whole_group_is_killed_and_the_decoy_outside_survives(group, tmp_path):
    """S12, S27, S28: every process of the group dies (orphan with PPID 1 and setsid escapee included)."""
    layout, path = group
    decoy = subprocess.Popen(["sleep", "1000"])
    tree = daemonising_tree(path, str(tmp_path / "pids"))
    try:
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
        cgroup = Cgroup(path, ProcReader())
        assert set(pids) <= set(cgroup.pids())
        assert not cgroup.empty()

        method = cgroup.kill_all(Signaller(), Deadline(10))
        assert method == ("cgroup.kill" if layout == "v2" else "signal loop")
        deadline = time.monotonic() + 10
        while not cgroup.empty():
            tree.poll()
            assert time.monotonic() < deadline, f"group still holds {cgroup.pids()}"
            time.sleep(0.02)
        tree.wait(timeout=10)
        assert not any(alive(pid) for pid in pids)
        assert alive(decoy.pid)
    finally:
        decoy.kill()
        decoy.wait()
        if tree.poll() is None:
            tree.kill()
            tree.wait()


@pytest.mark.covers('S12')
def test_a_process_in_a_sub_group_of_the_unit_is_listed_and_killed(group, tmp_path):
    """S12 with Delegate=yes: the engine's process sits in <unit>.service/payload, not in the unit's own group. It is
    listed, keeps the group from reading empty, and dies with the group (on v1 by the signal loop, which finds it only by
    walking the sub-groups); a process in the unit's own group beside it too."""
    layout, path = group
    payload = os.path.join(path, "payload")
    os.mkdir(payload)
    inside = subprocess.Popen(["sh", "-c", f'echo $$ > "{payload}/cgroup.procs"; exec sleep 1000'])
    beside = subprocess.Popen(["sh", "-c", f'echo $$ > "{path}/cgroup.procs"; exec sleep 1000'])
    try:
        cgroup = Cgroup(path, ProcReader())
        wait_for(lambda: {inside.pid, beside.pid} <= set(cgroup.pids()), "the processes never joined their groups")
        assert not cgroup.empty()
        method = cgroup.kill_all(Signaller(), Deadline(10))
        assert method == ("cgroup.kill" if layout == "v2" else "signal loop")
        assert inside.wait(timeout=10) == -signal.SIGKILL and beside.wait(timeout=10) == -signal.SIGKILL
        wait_for(cgroup.empty, f"group still holds {cgroup.pids()}")
    finally:
        for proc in (inside, beside):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        remove_cgroup(payload)


@pytest.mark.covers('S28', 'S38')
def test_forking_process_is_caught_by_the_kill(group, tmp_path):
    """S28/S38: a process forking in a loop; forks racing the kill are killed too."""
    _layout, path = group
    script = f'echo $$ > "{path}/cgroup.procs"; while :; do sleep 1000 & done'
    forker = subprocess.Popen(["sh", "-c", script])
    cgroup = Cgroup(path, ProcReader())
    try:
        deadline = time.monotonic() + 10
        while len(cgroup.pids()) < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cgroup.kill_all(Signaller(), Deadline(10))
        deadline = time.monotonic() + 10
        while not cgroup.empty():
            forker.poll()
            assert time.monotonic() < deadline, f"{len(cgroup.pids())} processes left"
            time.sleep(0.02)
    finally:
        if forker.poll() is None:
            forker.kill()
        forker.wait()


@pytest.mark.covers('S29')
def test_threaded_group_falls_back_to_the_loop_and_its_processes_are_found(tmp_path):
    """S29: in a threaded cgroup (a Delegate=yes unit may create one) cgroup.procs and cgroup.kill answer EOPNOTSUPP.
    The group's processes are found through its threads, the walk from the unit's group does not crash, and the kill
    falls back to the signal loop."""
    domain = make_group(HIERARCHIES["v2"])
    threaded = os.path.join(domain, "workers")
    os.mkdir(threaded)
    worker = None
    try:
        try:
            Path(threaded, "cgroup.type").write_text("threaded")
        except OSError as exc:
            pytest.skip(f"no threaded cgroups here: {exc}")
        worker = subprocess.Popen(["sleep", "1000"])
        Path(domain, "cgroup.procs").write_text(str(worker.pid))
        Path(threaded, "cgroup.threads").write_text(str(worker.pid))
        with pytest.raises(OSError, match="not supported"):
            Path(threaded, "cgroup.procs").read_text()

        assert Cgroup(domain, ProcReader()).pids() == [worker.pid]
        group = Cgroup(threaded, ProcReader())
        assert group.pids() == [worker.pid]
        assert group.kill_all(Signaller(), Deadline(10)) == "signal loop (cgroup.kill failed: Operation not supported)"
        worker.wait(timeout=10)
        assert not alive(worker.pid)
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
        remove_cgroup(threaded)
        remove_cgroup(domain)


@pytest.mark.covers('S30')
def test_a_cgroup_kill_that_fails_falls_back_to_the_loop_and_says_why(tmp_path):
    """S30: the write to cgroup.kill fails (WSL2 answers EINVAL; here the file cannot be written at all): every process of
    the group is still killed, by the signal loop, and the method reported names the error."""
    group_dir = tmp_path / "group"
    (group_dir / "cgroup.kill").mkdir(parents=True)  # exists, yet no write to it can succeed
    sleepers = [subprocess.Popen(["sleep", "1000"]) for _sleeper in range(3)]
    try:
        (group_dir / "cgroup.procs").write_text("".join(f"{s.pid}\n" for s in sleepers))
        group = Cgroup(str(group_dir), ProcReader())
        assert group.kill_all(Signaller(), Deadline(10)) == "signal loop (cgroup.kill failed: Is a directory)"
        assert [s.wait(timeout=5) for s in sleepers] == [-signal.SIGKILL] * 3
    finally:
        for sleeper in sleepers:
            sleeper.kill()


@pytest.mark.covers('S12', 'E9')
def test_cgroup_kill_journals_every_member_before_the_write(tmp_path, monkeypatch):
    """E9 for the cgroup.kill path: each member's intent is on disk before the one write that kills them all. The group
    is a stand-in directory; the kernel's side is played where the module opens cgroup.kill: the journal is read at
    that moment (a journal written after the write would show nothing then), then the members are killed."""
    import builtins
    import json

    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
    from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import cgroup as _systemd

    members = [subprocess.Popen(["sleep", "1000"]) for _member in range(2)]
    group_dir = tmp_path / "vllm.service"
    group_dir.mkdir()
    (group_dir / "cgroup.procs").write_text("".join(f"{member.pid}\n" for member in members))
    (group_dir / "cgroup.kill").write_text("")
    journal_path = tmp_path / "journal" / "signals.jsonl"
    seen = {}

    def kernel_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("cgroup.kill") and "w" in mode:
            seen["journal"] = [json.loads(line) for line in journal_path.read_text().splitlines()] if journal_path.exists() else []
            for member in members:
                member.kill()
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(_systemd, "open", kernel_open, raising=False)
    try:
        reader = ProcReader()
        journal = Journal(str(journal_path), "run-1", "systemd_stop_hard", reader).open()
        assert Cgroup(str(group_dir), reader).kill_all(Signaller(reader, journal=journal), Deadline(10)) == "cgroup.kill"
        assert (group_dir / "cgroup.kill").read_text() == "1"
        intents = [(line["pid"], line["phase"], line["signal"], line["via"]) for line in seen["journal"]]
        assert intents == [(member.pid, "intent", "SIGKILL", "cgroup.kill") for member in members], seen["journal"]
        after = [json.loads(line) for line in journal_path.read_text().splitlines()]
        assert [(line["pid"], line["result"]) for line in after if line["phase"] == "outcome"] == [(m.pid, "sent") for m in members]
    finally:
        for member in members:
            member.kill()
            member.wait()
