"""Reading processes from /proc (plugins/module_utils/_processes/procfs.py): real processes where the kernel can show
the case, a /proc tree of files for what no live process shows on demand (a vanished pid, a zombie leader with live
threads, a loop in parent links)."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import procfs
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader


def stat_line(pid: int, ppid: int, state: str = "S", comm: str = "worker", flags: int = 4194560, start: int = 1000) -> str:
    # fields after comm: state ppid pgrp session tty tpgid flags ... starttime is the 22nd field
    rest = [state, str(ppid), "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + [str(start)] + ["0"] * 10
    return f"{pid} ({comm}) {' '.join(rest)}\n"


class FakeProc:
    """A /proc tree of plain files."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(exist_ok=True)

    def add(self, pid: int, ppid: int, state: str = "S", start: int = 1000, threads: int = 1, **files: str) -> Path:
        directory = self.root / str(pid)
        (directory / "task").mkdir(parents=True, exist_ok=True)
        (directory / "stat").write_text(stat_line(pid, ppid, state, start=start))
        for tid in range(threads):
            (directory / "task" / str(pid + tid)).mkdir(exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text)
        return directory


@pytest.fixture
def fake(tmp_path):
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def sleeper():
    """A process stopped (state T): a sleeping one reads R in the instant it runs."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(1e6)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    os.kill(proc.pid, signal.SIGSTOP)
    while ProcReader().stat(proc.pid).state != "T":
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_stat_fields_are_read_at_their_positions():
    stat = procfs.parse_stat(stat_line(77, 5, "D", "a (b) c", flags=0x00200040, start=123456))
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.flags, stat.start_time) == (77, "a (b) c", "D", 5, 0x00200040, 123456)
    assert stat.is_kernel_thread


@pytest.mark.parametrize(("pid", "ppid", "flags", "kernel"), [
    (500, 1, procfs.PF_KTHREAD, True), (500, 1, procfs.PF_KTHREAD | 0x40, True), (500, 1, 0x40, False), (500, 1, 0x1, False),
    (2, 0, 0, True), (500, 2, 0, True), (500, 3, 0, False), (2, 0, 0x40, False), (500, 2, 0x40, False),
])
def test_a_kernel_thread_is_known_by_its_flag_or_without_flags_by_kthreadd(pid, ppid, flags, kernel):
    assert procfs.ProcStat(pid, "x", "S", ppid, flags, 1).is_kernel_thread is kernel


def test_status_lines_are_split_at_the_first_colon_and_trimmed():
    assert procfs.parse_status("Name:\tpy:thon\nUid:\t1\t2\t3\t4\nno colon here\nEmpty:\n") == {"Name": "py:thon", "Uid": "1\t2\t3\t4", "Empty": ""}


def test_the_cgroup_is_systemds_named_hierarchy_where_there_is_one_else_the_unified_one():
    v2 = "0::/system.slice/vllm.service\n"
    hybrid = "12:cpu:/other\n1:name=systemd:/system.slice/sglang.service/worker\n0::/unified.slice\n"
    assert procfs.parse_cgroup_path(v2) == "/system.slice/vllm.service"
    assert procfs.parse_cgroup_path(hybrid) == "/system.slice/sglang.service/worker"
    assert procfs.parse_cgroup_path("12:cpu:/other\nbroken line\n") is None
    assert procfs.parse_cgroup_path("0::\n") is None
    assert procfs.parse_cgroup_path("0::/system.slice/job:nightly.service\n") == "/system.slice/job:nightly.service", "a colon in the path"
    assert procfs.parse_cgroup_unit(hybrid) == "sglang.service", "the innermost unit, below it a plain group"
    assert procfs.parse_cgroup_unit("0::/user.slice/user-0.slice/session-4.scope/run-r1.scope/x\n") == "run-r1.scope"
    assert procfs.parse_cgroup_unit("0::/user.slice/foo.slice\n") is None
    assert procfs.parse_cgroup_unit("") is None


def test_a_file_larger_than_one_read_is_read_whole(tmp_path):
    big = tmp_path / "maps"
    data = bytes(range(256)) * (procfs.READ_SIZE // 256 * 2 + 3)
    big.write_bytes(data)
    assert procfs.read_file(str(big)) == data
    with pytest.raises(FileNotFoundError):
        procfs.read_file(str(tmp_path / "none"))


def test_own_status_is_this_process_and_pids_are_the_numeric_entries(fake):
    assert procfs.own_status()["Pid"] == str(os.getpid())
    fake.add(10, 1)
    fake.add(200, 10)
    (fake.root / "self").mkdir()
    (fake.root / "sys").mkdir()
    assert sorted(procfs.pid_directories(str(fake.root))) == [10, 200]


def test_a_real_process_is_read_whole(sleeper):
    reader = ProcReader()
    stat = reader.stat(sleeper.pid)
    assert (stat.pid, stat.ppid, stat.state) == (sleeper.pid, os.getpid(), "T")
    assert reader.start_time(sleeper.pid) == stat.start_time
    assert reader.status(sleeper.pid)["Tgid"] == str(sleeper.pid)
    assert reader.cmdline(sleeper.pid, "S") == [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(1e6)"]
    assert reader.exe(sleeper.pid) == os.path.realpath(sys.executable)
    assert reader.cgroup(sleeper.pid) == procfs.parse_cgroup_path(Path("/proc/self/cgroup").read_text())
    assert reader.thread_count(sleeper.pid) == 1
    assert reader.is_process(sleeper.pid) and reader.thread_group_alive(sleeper.pid, stat.start_time)
    assert not reader.thread_group_alive(sleeper.pid, stat.start_time + 1), "another process under the same pid"
    assert not reader.thread_group_alive(sleeper.pid, stat.start_time - 1), "the pid reused by a later process than the one recorded"
    assert [entry.pid for entry in reader.ancestors(sleeper.pid)][:1] == [os.getpid()]
    assert sleeper.pid in reader.descendants(os.getpid())


def test_a_thread_id_is_not_a_process():
    code = ("import threading, time\nt = threading.Thread(target=time.sleep, args=(1e6,), daemon=True); t.start()\n"
            "print(t.native_id, flush=True)\ntime.sleep(1e6)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        thread_id = int(proc.stdout.readline())
        reader = ProcReader()
        assert reader.is_process(proc.pid) and not reader.is_process(thread_id)
        assert reader.thread_count(proc.pid) == 2
    finally:
        proc.kill()
        proc.wait()


def test_a_vanished_process_is_gone_to_every_read(fake):
    reader = ProcReader(str(fake.root))
    for read in (reader.stat, reader.status):
        with pytest.raises(ProcessGone) as gone:
            read(4242)
        assert gone.value.pid == 4242 and str(gone.value) == "process 4242 no longer exists"
    assert reader.start_time(4242) is None and reader.exe(4242) is None and reader.unit(4242) is None and reader.cgroup(4242) is None
    assert reader.thread_count(4242) == 0 and reader.wchan(4242) is None and not reader.is_process(4242)
    assert not reader.thread_group_alive(4242, 1000)
    with pytest.raises(ProcessGone):
        reader.cmdline(4242, "S")


def test_an_empty_stat_is_a_process_gone(fake):
    directory = fake.add(50, 1)
    (directory / "stat").write_text("")
    with pytest.raises(ProcessGone):
        ProcReader(str(fake.root)).stat(50)
    assert ProcReader(str(fake.root)).start_time(50) is None


def test_a_zombie_leader_is_alive_while_another_thread_lives(fake):
    reader = ProcReader(str(fake.root))
    fake.add(60, 1, state="Z", start=7, threads=2)
    fake.add(61, 1, state="Z", start=7, threads=1)
    fake.add(62, 1, state="X", start=7, threads=1)
    fake.add(63, 1, state="D", start=7, threads=1)
    fake.add(64, 1, state="t", start=7, threads=1)
    fake.add(65, 1, state="Z", start=7, threads=0)  # its task directory already empty
    assert [reader.thread_group_alive(pid, 7) for pid in (60, 61, 62, 63, 64, 65)] == [True, False, False, True, True, False]


def test_a_cmdline_is_split_at_its_nuls_and_empty_for_a_kernel_thread(fake):
    fake.add(70, 1, cmdline="vllm\0serve\0/models/x y\0")
    fake.add(71, 1, cmdline="")
    reader = ProcReader(str(fake.root))
    assert reader.cmdline(70, "S") == ["vllm", "serve", "/models/x y"]
    assert reader.cmdline(71, "S") == []
    assert reader.cmdline(70, "D") is None, "never read for a task in D state"
    reader.blocked[70] = {"cmdline"}
    assert reader.cmdline(70, "S") is None, "never tried again once it blocked"


def test_a_cmdline_read_that_blocks_is_given_up_and_remembered(fake, monkeypatch):
    fake.add(72, 1, cmdline="x\0", status="Uid:\t0\t0\t0\t0\n")
    monkeypatch.setattr(procfs.bounded, "call_boxed", lambda read: (False, None))
    reader = ProcReader(str(fake.root))
    assert reader.cmdline(72, "S") is None and reader.blocked == {72: {"cmdline"}}
    info = procfs.describe(reader, 72)
    assert info["cmdline"] is None and info["blocked_reads"] == ["cmdline"]


def test_a_cmdline_the_kernel_refuses_is_none(fake, monkeypatch):
    fake.add(73, 1, cmdline="x\0")

    def refuse(read):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(procfs.bounded, "call_boxed", refuse)
    assert ProcReader(str(fake.root)).cmdline(73, "S") is None


def test_wchan_and_unreadable_entries(fake):
    fake.add(80, 1, wchan="do_wait", cgroup="0::/system.slice/vllm.service\n")
    fake.add(81, 1, wchan="")
    reader = ProcReader(str(fake.root))
    assert reader.wchan(80) == "do_wait" and reader.wchan(81) is None
    assert reader.unit(80) == "vllm.service" and reader.cgroup(80) == "/system.slice/vllm.service"
    (fake.root / "80" / "cgroup").chmod(0)
    (fake.root / "80" / "wchan").chmod(0)
    if os.geteuid() != 0:  # root reads a file whatever its mode
        assert reader.unit(80) is None and reader.wchan(80) is None


def test_ancestors_stop_at_pid_0_at_a_gap_and_at_a_loop(fake):
    fake.add(1, 0)
    fake.add(10, 1)
    fake.add(20, 10)
    fake.add(30, 20)
    reader = ProcReader(str(fake.root))
    assert [stat.pid for stat in reader.ancestors(30)] == [20, 10, 1]
    assert reader.ancestors(1) == []
    fake.add(40, 99)  # its parent is gone
    assert reader.ancestors(40) == []
    fake.add(50, 51)
    fake.add(51, 50)  # a loop no real /proc shows, stopped all the same
    assert [stat.pid for stat in reader.ancestors(50)] == [51]
    assert reader.ancestors(4242) == []


def test_descendants_are_every_generation_below_and_nothing_else(fake):
    for pid, ppid in [(1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)]:
        fake.add(pid, ppid)
    (fake.root / "14").mkdir()  # vanished between the listing and the read
    reader = ProcReader(str(fake.root))
    assert reader.descendants(10) == {11, 12, 13}
    assert reader.descendants(12) == set()
    assert reader.descendants(1) == {10, 11, 12, 13, 20, 21}


def test_describe_reports_identity_names_owner_unit_and_namespace(fake, sleeper):
    reader = ProcReader()
    info = procfs.describe(reader, sleeper.pid)
    assert info == {"pid": sleeper.pid, "start_time": reader.start_time(sleeper.pid), "comm": reader.stat(sleeper.pid).comm,
                    "exe": os.path.realpath(sys.executable), "cmdline": reader.cmdline(sleeper.pid, "S"), "uid": os.getuid(),
                    "user": pwd.getpwuid(os.getuid()).pw_name, "state": "T", "ppid": os.getpid(), "unit": reader.unit(sleeper.pid),
                    "cgroup": reader.cgroup(sleeper.pid), "namespace_pid": None}
    fake.add(90, 1, status="Uid:\t4242\t0\t0\t0\nNSpid:\t90\t7\n", cmdline="")
    other = procfs.describe(ProcReader(str(fake.root)), 90)
    assert (other["uid"], other["user"], other["namespace_pid"], other["exe"], other["cmdline"]) == (4242, "4242", 7, None, [])
    fake.add(91, 1, status="Name:\tx\n", cmdline="")
    assert procfs.describe(ProcReader(str(fake.root)), 91)["uid"] is None and procfs.describe(ProcReader(str(fake.root)), 91)["user"] is None


def test_user_names_and_owner_uids():
    assert procfs.user_name(0) == "root" and procfs.user_name(4242424) == "4242424"
    nobody = pwd.getpwnam("nobody").pw_uid
    assert procfs.owner_uid("nobody") == nobody and procfs.owner_uid(str(nobody)) == nobody and procfs.owner_uid(nobody) == nobody
    assert procfs.owner_uid("no-such-user-here") is None
    for bad in ["", "a:b", "a/b", "a b", "tab\there"]:
        with pytest.raises(InvalidInput, match="is not a user name or uid"):
            procfs.owner_uid(bad)
    for root in ["root", "0", 0]:
        with pytest.raises(InvalidInput, match="root owns the system's own processes"):
            procfs.owner_uid(root)


def test_the_namespace_pid_is_the_last_one_and_only_when_there_are_several():
    assert procfs.namespace_pid({"NSpid": "900\t12\t3"}) == 3
    assert procfs.namespace_pid({"NSpid": "900"}) is None and procfs.namespace_pid({}) is None


def test_a_signal_mask_names_each_pending_signal():
    assert procfs.signal_names(0) == []
    assert procfs.signal_names(1 << (signal.SIGKILL - 1)) == ["SIGKILL"]
    assert procfs.signal_names((1 << 0) | (1 << 14)) == ["SIGHUP", "SIGTERM"]
    assert procfs.signal_names(1 << 63) == ["SIGRTMAX"] if hasattr(signal, "SIGRTMAX") and signal.SIGRTMAX == 64 else ["SIG64"]
    assert procfs.signal_names(1 << 31) == ["SIG32"], "a number no name has"


def test_a_survivors_details_say_its_wait_channel_pending_signals_and_threads(fake):
    fake.add(95, 1, wchan="nvidia_ioctl", status="SigPnd:\t0000000000000100\nShdPnd:\t0000000000004000\nThreads:\t3\n")
    assert procfs.survivor_details(ProcReader(str(fake.root)), 95) == {"wchan": "nvidia_ioctl", "signals_pending": ["SIGKILL", "SIGTERM"],
                                                                       "threads": 3}
    fake.add(96, 1, status="Name:\tx\n")
    assert procfs.survivor_details(ProcReader(str(fake.root)), 96) == {"wchan": None, "signals_pending": [], "threads": 0}
    assert procfs.survivor_details(ProcReader(str(fake.root)), 4242) == {"wchan": None}


def test_a_thread_list_the_kernel_refuses_counts_the_process_itself(fake, monkeypatch):
    fake.add(98, 1, threads=3)
    real_listdir = os.listdir

    def refuse(path):
        if str(path).endswith("/98/task"):
            raise PermissionError(13, "Permission denied")
        return real_listdir(path)

    reader = ProcReader(str(fake.root))
    assert reader.thread_count(98) == 3
    monkeypatch.setattr(procfs.os, "listdir", refuse)
    assert reader.thread_count(98) == 1


def test_a_process_is_one_whose_tgid_is_its_own_pid_by_number_not_by_spelling(fake):
    fake.add(1001, 999, status="Tgid:\t999\n")  # a thread of 999: "999" sorts after "1001"
    fake.add(999, 1, status="Tgid:\t999\n")
    reader = ProcReader(str(fake.root))
    assert not reader.is_process(1001) and reader.is_process(999)


def test_a_process_whose_status_the_kernel_refuses_is_described_without_owner(fake, monkeypatch):
    fake.add(97, 1, cmdline="x\0", status="Uid:\t5\t5\t5\t5\n")

    def refuse(self, pid):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(ProcReader, "status", refuse)
    info = procfs.describe(ProcReader(str(fake.root)), 97)
    assert (info["uid"], info["user"], info["namespace_pid"], info["cmdline"]) == (None, None, None, ["x"])


def test_a_signal_pending_for_the_thread_and_the_process_is_named_once_and_threads_unsaid_are_none(fake):
    fake.add(94, 1, status="SigPnd:\t0000000000000100\nShdPnd:\t0000000000004100\nThreads:\t\n")
    details = procfs.survivor_details(ProcReader(str(fake.root)), 94)
    assert details["signals_pending"] == ["SIGKILL", "SIGTERM"] and details["threads"] == 0
