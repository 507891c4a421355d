"""Who holds the GPU device files (plugins/module_utils/_gpus/holders.py), piece by piece: device nodes and their keys,
the /proc scan on real processes holding stand-in device files, the guard, NVML's cross-check and the kill plan."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import (
    Guard,
    HolderScanner,
    Holding,
    NvmlProcess,
    ScanResult,
    device_nodes,
    plan_kill,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader


def scanner_of(devices) -> HolderScanner:
    return HolderScanner(device_nodes(devices.globs))


def guard(**overrides) -> Guard:
    values = {"names": list(holders.BUILTIN_PROTECTED_NAMES), "self_pid": os.getpid(), "ancestors": set(), "descendants": set()}
    return Guard(**{**values, **overrides})


def test_stand_in_nodes_are_keyed_by_inode_and_placed_on_gpus_by_name(devices, tmp_path):
    nodes = device_nodes(devices.globs + [devices.gpu(0), str(tmp_path / "none*")])
    by_path = {node.path: node for node in nodes}
    assert sorted(by_path) == sorted([devices.gpu(m) for m in range(4)] + [devices.ctl, devices.uvm, str(devices.root / "nvidia-caps/nvidia-cap1")])
    assert len(nodes) == len(by_path), "a file two patterns name is one node"
    info = os.stat(devices.gpu(2))
    assert by_path[devices.gpu(2)] == holders.DeviceNode(devices.gpu(2), ("inode", info.st_dev, info.st_ino), (info.st_dev, info.st_ino), 2)
    assert by_path[devices.ctl].gpu_minor is None and by_path[devices.uvm].gpu_minor is None
    assert str(devices.root / "nvidia-caps") not in by_path, "a directory is no node"


def test_a_character_device_is_keyed_by_its_device_number_and_shared_minors_belong_to_no_gpu():
    null, full = os.stat("/dev/null"), os.stat("/dev/full")  # char 1:3 and 1:7
    (node_null,) = device_nodes(["/dev/null"], gpu_major=os.major(null.st_rdev))
    assert node_null.fd_key == ("rdev", null.st_rdev) and node_null.gpu_minor == os.minor(null.st_rdev)
    assert node_null.map_key == (null.st_dev, null.st_ino)
    assert device_nodes(["/dev/full"])[0].gpu_minor is None, "another major is no GPU"
    assert device_nodes(["/dev/null"], gpu_major=os.major(null.st_rdev) - 1)[0].gpu_minor is None, "nor a greater one"
    assert holders.fd_key_of(full) == ("rdev", full.st_rdev)
    regular = os.stat(__file__)
    assert holders.fd_key_of(regular) == ("inode", regular.st_dev, regular.st_ino)
    assert holders.NVIDIA_MAJOR == 195 and holders.FIRST_SHARED_MINOR == 254


def test_the_driver_minors_from_254_up_are_shared_nodes():
    """nvidia-modeset (254) and nvidiactl (255) share the GPUs' major: a character device of minor 195:N as stat() gives it."""
    char = tuple(os.stat("/dev/null"))[:10]
    for minor, expected in [(0, 0), (253, 253), (254, None), (255, None)]:
        info = os.stat_result(char, {"st_rdev": os.makedev(195, minor)})
        assert holders._device_node("/dev/nvidia-x", info, 195).gpu_minor == expected


def test_maps_lines_give_the_device_and_inode_of_file_backed_mappings():
    text = ("7f00-7f01 rw-s 00000000 00:2a 123456 /dev/nvidia0\n"
            "7f01-7f02 r--p 00000000 fd:01 77 /usr/lib/libc.so\n"
            "7f02-7f03 rw-p 00000000 00:00 0 \n"
            "7f03-7f04 rw-p 00000000 00:00\n"
            "7f04-7f05 rw-s 00000000 00:2b 555\n")  # a file's mapping whose path is not shown is still that file's
    assert holders.parse_maps_identities(text) == {(os.makedev(0, 0x2a), 123456), (os.makedev(0xfd, 1), 77), (os.makedev(0, 0x2b), 555)}


def test_the_scan_finds_holders_by_fd_by_mmap_and_both_and_nothing_else(devices, processes):
    _fd, (by_fd,) = processes.holder("--open", devices.gpu(0), devices.ctl)
    _map, (by_map,) = processes.holder("--mmap", devices.gpu(1))
    _both, (by_both,) = processes.holder("--open", devices.gpu(2), "--mmap", devices.gpu(2))
    decoy = processes.decoy("vllm")
    scan = scanner_of(devices).scan()
    assert scan.holdings[by_fd].via == {"fd"} and scan.holdings[by_fd].devices == {devices.gpu(0), devices.ctl}
    assert scan.holdings[by_map].via == {"mmap"} and scan.holdings[by_map].devices == {devices.gpu(1)}
    assert scan.holdings[by_both].via == {"fd", "mmap"} and scan.holdings[by_both].devices == {devices.gpu(2)}
    assert decoy.pid not in scan.holdings and os.getpid() not in scan.holdings
    assert scan.minor_by_path[devices.gpu(3)] == 3 and scan.minor_by_path[devices.ctl] is None
    only = scanner_of(devices).scan([by_map, decoy.pid])
    assert sorted(only.holdings) == [by_map]
    counted = holders.Counter()
    assert scanner_of(devices).scan_process(by_fd, counted).devices == {devices.gpu(0), devices.ctl}
    assert scanner_of(devices).scan_process(decoy.pid, counted) is None and counted == holders.Counter()


def test_a_zombie_leaders_files_are_read_through_its_live_thread(devices, processes):
    _proc, (leader,) = processes.holder("--open", devices.gpu(3), "--zombie-leader")
    holding = scanner_of(devices).scan([leader]).holdings[leader]
    assert holding.devices == {devices.gpu(3)} and holding.via == {"fd"}


def test_a_process_gone_before_its_scan_is_counted_vanished(devices):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    scan = scanner_of(devices).scan([proc.pid])
    assert scan.holdings == {} and scan.unreadable == holders.Counter({"vanished": 1})


def test_the_pid_namespace_of_the_host_is_recognised_by_its_fixed_inode(monkeypatch):
    monkeypatch.setattr(holders.os, "readlink", lambda path: "pid:[4026531836]")
    assert holders.in_init_pid_namespace() is True
    monkeypatch.setattr(holders.os, "readlink", lambda path: "pid:[4026532999]")
    assert holders.in_init_pid_namespace() is False


@pytest.mark.parametrize(("cap_eff", "missing"), [
    ("000001ffffffffff", []), (f"{1 << 19:016x}", []), (f"{(1 << 41) - 1 - (1 << 19):016x}", ["CAP_SYS_PTRACE"]), ("0", ["CAP_SYS_PTRACE"]),
    ("", ["CAP_SYS_PTRACE"]), (None, ["CAP_SYS_PTRACE"]),
])
def test_a_complete_scan_needs_cap_sys_ptrace_in_the_effective_set(cap_eff, missing):
    assert holders.missing_scan_capabilities({} if cap_eff is None else {"CapEff": cap_eff}) == missing


@pytest.mark.parametrize(("comm", "exe", "expected"), [
    ("sshd", "/usr/sbin/sshd", "sshd"),
    ("python3", "/usr/bin/nvidia-persistenced", "nvidia-persistenced"),
    ("nvidia-persiste", None, "nvidia-persistenced"),  # comm is cut at 15 characters
    ("nvidia-persiste", "/usr/bin/python3", "nvidia-persistenced"),
    ("x", "/usr/bin/nv-hostengine (deleted)", "nv-hostengine"),  # upgraded under a running daemon
    ("nvidia-persistenced", None, None),  # a comm no kernel shows: longer than 15
    ("vllm", "/usr/bin/python3", None),
])
def test_a_protected_name_is_the_executables_or_the_comms(comm, exe, expected):
    assert holders.protected_name(comm, exe, list(holders.BUILTIN_PROTECTED_NAMES)) == expected


def test_names_sharing_their_first_15_characters_are_told_apart_by_the_executable():
    names = ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"]
    assert holders.protected_name("nvidia-cuda-mps", "/usr/bin/nvidia-cuda-mps-server", names) == "nvidia-cuda-mps-server"
    assert holders.protected_name("nvidia-cuda-mps", None, names) == "nvidia-cuda-mps-control"


def test_the_guard_names_why_a_process_is_never_signalled_in_its_order():
    keeper = guard(self_pid=50, ancestors={40}, descendants={60}, pids={70}, names=["nvidia-persistenced", "my-daemon"])

    def why(pid, comm="python3", exe="/usr/bin/python3", kernel=False):
        return keeper.reason({"pid": pid, "comm": comm, "exe": exe}, kernel)

    assert why(1, kernel=True) == "PID 1"
    assert why(2, kernel=True) == "kernel thread"
    assert why(50, kernel=False) == "this module's own process"
    assert why(40) == "ancestor of this module (the connection or command that runs it)"
    assert why(60) == "child of this module"
    assert why(70, comm="nvidia-persiste") == "listed in protected_pids"
    assert why(80, comm="nvidia-persiste") == ("protected name nvidia-persistenced (keeps the driver loaded; killing it tears the GPUs' "
                                               "state down)")
    assert why(81, exe="/opt/bin/my-daemon") == "protected name my-daemon"
    assert why(82) is None


def plan_scan(devices, *holdings: Holding, **extra) -> ScanResult:
    scanner = scanner_of(devices)
    return ScanResult(holdings={holding.pid: holding for holding in holdings}, minor_by_path=scanner.minor_by_path, **extra)


def test_a_holder_is_placed_on_gpus_by_nvmls_list_else_by_its_nodes(devices, processes):
    _one, (on_one,) = processes.holder("--open", devices.gpu(1))
    _all, (on_all,) = processes.holder("--open", devices.gpu(0), devices.gpu(1))
    _listed, (listed,) = processes.holder("--open", devices.gpu(0), devices.gpu(1))
    _shared, (shared_only,) = processes.holder("--open", devices.ctl)
    scan = plan_scan(devices, Holding(on_one, {"fd"}, {devices.gpu(1)}), Holding(on_all, {"fd"}, {devices.gpu(0), devices.gpu(1)}),
                     Holding(listed, {"fd", "nvml"}, {devices.gpu(0), devices.gpu(1)}, {11}), Holding(shared_only, {"fd"}, {devices.ctl}))
    minor_to_index = {0: 10, 1: 11}
    uuids = {10: "GPU-a", 11: "GPU-b"}
    everything = plan_kill(scan, ProcReader(), guard(), minor_to_index, None, None, uuids)
    assert [info["pid"] for info in everything.targets] == sorted([on_one, on_all, listed, shared_only])
    by_pid = {info["pid"]: info for info in everything.holders}
    assert (by_pid[on_all]["gpus"], by_pid[on_all]["gpu_uuids"]) == ([10, 11], ["GPU-a", "GPU-b"])
    assert (by_pid[listed]["gpus"], by_pid[listed]["via"], by_pid[listed]["devices"]) == ([11], ["fd", "nvml"], [devices.gpu(0), devices.gpu(1)])
    assert by_pid[shared_only]["gpus"] == [] and by_pid[shared_only]["gpu_uuids"] == []

    second = plan_kill(scan, ProcReader(), guard(), minor_to_index, {1}, {11}, uuids)
    assert sorted(info["pid"] for info in second.targets) == sorted([on_one, listed]), "NVML places the listed one on 11"
    assert [info["pid"] for info in second.ambiguous] == [on_all]
    assert second.ambiguous[0]["reason"] == "holds device nodes of selected and other GPUs and NVML lists it on none: not signalled"
    assert shared_only not in {info["pid"] for info in second.holders}, "a node of no GPU places it on none selected"
    first = plan_kill(scan, ProcReader(), guard(), minor_to_index, {0}, {10}, uuids)
    assert [info["pid"] for info in first.targets] == [] and [info["pid"] for info in first.ambiguous] == [on_all]
    assert plan_kill(scan, ProcReader(), guard(), None, None, None).holders[0]["gpus"] == []


def test_a_protected_holder_is_listed_with_its_reason_and_never_a_target(devices, processes):
    _proc, (pid,) = processes.holder("--open", devices.gpu(0), "--comm", "nv-hostengine")
    plan = plan_kill(plan_scan(devices, Holding(pid, {"fd"}, {devices.gpu(0)})), ProcReader(), guard(), {0: 0}, None, None)
    why = "protected name nv-hostengine (DCGM host engine (health, metrics))"
    assert plan.targets == [] and [(entry["pid"], entry["reason"]) for entry in plan.protected] == [(pid, why)]
    assert [entry["pid"] for entry in plan.holders] == [pid]


def test_a_holder_gone_before_it_is_described_is_counted_vanished(devices):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    plan = plan_kill(plan_scan(devices, Holding(proc.pid, {"fd"}, {devices.gpu(0)}), unreadable=holders.Counter({"vanished": 2})),
                     ProcReader(), guard(), {0: 0}, None, None)
    assert plan.holders == [] and plan.unreadable == {"vanished": 3}


def test_processes_whose_files_could_not_all_be_read_are_possible_holders(devices, processes):
    denied_proc = processes.decoy("denied")
    blocked_proc = processes.decoy("blocked")
    maps_blocked = processes.decoy("maps")
    _holder, (holding_pid,) = processes.holder("--open", devices.gpu(0))
    reader = ProcReader()
    reader.blocked[blocked_proc.pid] = {"files"}
    scan = plan_scan(devices, Holding(holding_pid, {"fd"}, {devices.gpu(0)}),
                     blocked={blocked_proc.pid: "files", maps_blocked.pid: "maps", holding_pid: "files"},
                     denied={denied_proc.pid, os.getpid()})
    plan = plan_kill(scan, reader, guard(), {0: 0}, None, None)
    possible = {entry["pid"]: entry for entry in plan.possible}
    assert sorted(possible) == sorted([denied_proc.pid, blocked_proc.pid]), "found holders, maps-only blocks and protected ones are not"
    assert possible[denied_proc.pid]["why"] == holders.DENIED_WHY and "blocked_reads" not in possible[denied_proc.pid]
    assert possible[blocked_proc.pid]["why"] == holders.BLOCKED_WHY and possible[blocked_proc.pid]["blocked_reads"] == ["files"]
    unrecorded = plan_kill(plan_scan(devices, blocked={blocked_proc.pid: "files"}), ProcReader(), guard(), {0: 0}, None, None)
    assert unrecorded.possible[0]["blocked_reads"] == ["files"], "from the scan where the reader kept no record"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert plan_kill(plan_scan(devices, denied={gone.pid}), ProcReader(), guard(), {0: 0}, None, None).possible == []


def test_nvml_pids_proc_confirms_are_holders_on_their_gpu_and_the_rest_are_stale(devices, processes):
    _scanned, (scanned,) = processes.holder("--open", devices.gpu(0))
    _late, (late,) = processes.holder("--mmap", devices.gpu(1))  # not in the first scan: read when NVML names it
    bystander = processes.decoy("bystander")
    scanner = scanner_of(devices)
    scan = scanner.scan([scanned])
    listed = [NvmlProcess(0, scanned, 100, "compute"), NvmlProcess(1, late, 50, "compute"), NvmlProcess(1, bystander.pid, 5, "compute"),
              NvmlProcess(2, 1, None, "compute")]
    stale = holders.cross_check_nvml(listed, scanner, scan, ProcReader())
    assert scan.holdings[scanned].via == {"fd", "nvml"} and scan.holdings[scanned].gpus == {0}
    assert scan.holdings[late].via == {"mmap", "nvml"} and scan.holdings[late].gpus == {1}
    assert stale == [{"pid": bystander.pid, "gpu": 1, "used_mib": 5, "reason": "PID now belongs to a process that holds no GPU device (reused)"},
                     {"pid": 1, "gpu": 2, "used_mib": None, "reason": holders.IMPLAUSIBLE_PID}]
    assert 1 not in scan.holdings


def test_a_stale_nvml_pid_says_why(processes):
    reader = ProcReader()
    assert holders._stale_reason(0, reader) == holders._stale_reason(1, reader) == "implausible PID"
    assert holders._stale_reason(holders.PID_MAX_LIMIT + 1, reader) == "implausible PID"
    assert holders.PID_MAX_LIMIT == 4194304
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert holders._stale_reason(gone.pid, reader) == "no such process"
    code = ("import threading, time\nt = threading.Thread(target=time.sleep, args=(1e6,), daemon=True); t.start()\n"
            "print(t.native_id, flush=True)\ntime.sleep(1e6)")
    threaded = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    processes.started.append(threaded)
    assert holders._stale_reason(int(threaded.stdout.readline()), reader) == "a thread id, not a process"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    processes.started.append(zombie)
    while reader.stat(zombie.pid).state != "Z":
        time.sleep(0.01)
    assert holders._stale_reason(zombie.pid, reader) == "exited (a zombie its parent has not reaped)"


def test_a_dangling_link_among_the_device_files_is_passed_over(devices):
    (devices.root / "nvidia-0broken").symlink_to(devices.root / "gone")  # sorts before nvidia0
    expected = [devices.gpu(m) for m in range(4)] + [devices.ctl, devices.uvm, str(devices.root / "nvidia-caps/nvidia-cap1")]
    assert sorted(node.path for node in device_nodes(devices.globs)) == sorted(expected)


def test_a_holder_in_d_state_is_found_by_its_files_and_its_maps_are_not_read(devices, processes, tmp_path):
    """Reading maps takes the memory map's lock, which a task in D state may hold: skipped, and counted as skipped."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    _helper, (pid,) = processes.holder("--open", devices.gpu(2), "--vfork-blocked", str(fifo))
    reader = ProcReader()
    deadline = time.monotonic() + 10
    while reader.stat(pid).state != "D" or not reader.descendants(pid):
        assert time.monotonic() < deadline, "the helper never reached vfork's D state"
        time.sleep(0.02)
    processes.extra_pids += sorted(reader.descendants(pid))
    scan = scanner_of(devices).scan([pid])
    assert scan.holdings[pid].via == {"fd"} and scan.unreadable == holders.Counter({"maps_skipped_uninterruptible": 1})


def fake_process(root, pid: int, stat: str, threads: dict[int, list[str]] | None = None):
    """A /proc entry of files: its stat line and, per thread id, the files its fd directory links to."""
    directory = root / str(pid)
    (directory / "task").mkdir(parents=True)
    (directory / "stat").write_text(stat)
    for tid, targets in (threads or {}).items():
        fds = directory / "task" / str(tid) / "fd"
        fds.mkdir(parents=True)
        for number, target in enumerate(targets, 3):
            (fds / str(number)).symlink_to(target)
        (directory / "task" / str(tid) / "maps").write_text("")


@pytest.mark.parametrize("stat", ["1 (x)\n", "abc (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 100 0\n"], ids=["fields missing", "not a number"])
def test_a_stat_line_that_cannot_be_parsed_is_counted_unparsable(devices, tmp_path, stat):
    fake_process(tmp_path / "proc", 321, stat)
    scan = HolderScanner(device_nodes(devices.globs), ProcReader(str(tmp_path / "proc"))).scan([321])
    assert scan.holdings == {} and scan.unreadable == holders.Counter({"unparsable": 1})


def test_a_zombie_leaders_files_are_read_through_another_thread_whatever_its_number(devices, tmp_path):
    """Thread ids are compared as ids, not by how they sort: 1000 is another thread of leader 999."""
    stat = "999 (engine) Z 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 2 0 100 0 0\n"
    fake_process(tmp_path / "proc", 999, stat, {999: [], 1000: [devices.gpu(1)]})
    scan = HolderScanner(device_nodes(devices.globs), ProcReader(str(tmp_path / "proc"))).scan([999])
    assert scan.holdings[999].devices == {devices.gpu(1)} and scan.unreadable == holders.Counter()
