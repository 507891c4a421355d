"""Parsers, planners, classifiers and pollers, with an injected clock where time matters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders, memory
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import parse_maps_identities, protected_name
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import select_gpus, validate_gpu_selectors
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, Deadline, poll_until
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import parse_cgroup_path, parse_cgroup_unit, parse_stat, parse_status
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative


class FakeClock(Clock):
    """Time moves only when the code under test sleeps (or a test jumps it)."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []
        super().__init__(monotonic=lambda: self.now, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_parse_stat_handles_spaces_and_parentheses_in_comm():
    text = "4242 (py (worker) 1) S 1 4242 4242 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 3 0 987654 1000 100 ..."
    stat = parse_stat(text)
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.start_time) == (4242, "py (worker) 1", "S", 1, 987654)
    assert not stat.is_kernel_thread


def test_kernel_threads_are_recognised_by_flag_and_parent():
    kthread = parse_stat("77 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 12 0 0 ...")
    assert kthread.is_kernel_thread
    assert parse_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0 ...").is_kernel_thread


def test_parse_status_and_cgroup_unit():
    status = parse_status("Name:\tpython3\nTgid:\t10\nNSpid:\t10\t1\nUid:\t0\t0\t0\t0\n")
    assert status["Tgid"] == "10" and status["NSpid"] == "10\t1"
    assert parse_cgroup_unit("0::/system.slice/vllm.service\n") == "vllm.service"
    assert parse_cgroup_unit("1:name=systemd:/system.slice/sglang.service/payload\n0::/\n") == "sglang.service"
    assert parse_cgroup_unit("0::/user.slice/user-0.slice/session-3.scope\n") == "session-3.scope"
    assert parse_cgroup_unit("0::/\n") is None
    assert parse_cgroup_path("1:name=systemd:/system.slice/sglang.service/payload\n0::/\n") == "/system.slice/sglang.service/payload"
    assert parse_cgroup_path("0::/user.slice/user-0.slice/session-3.scope\n") == "/user.slice/user-0.slice/session-3.scope"


def test_parse_maps_identities_reads_hex_device_and_inode():
    text = ("7f00-7f01 rw-s 00000000 00:05 1027 /dev/nvidia0\n"
            "7f01-7f02 r--p 00000000 fd:01 131 /usr/lib/libc.so.6\n"
            "7f02-7f03 rw-p 00000000 00:00 0 \n"
            "7ffd-7ffe rw-p 00000000 00:00 0 [stack]\n")
    assert parse_maps_identities(text) == {(os.makedev(0, 5), 1027), (os.makedev(0xfd, 1), 131)}


@pytest.mark.parametrize(("comm", "exe", "expected"), [
    ("nvidia-persiste", "/usr/bin/nvidia-persistenced", "nvidia-persistenced"),  # comm cut at 15
    ("nvidia-persiste", None, "nvidia-persistenced"),
    ("python3", "/usr/bin/nv-hostengine (deleted)", "nv-hostengine"),
    ("containerd-shim", "/usr/bin/containerd-shim-runc-v2", "containerd-shim"),
    ("python3", "/usr/bin/python3.11", None),
    ("systemd-journal", "/usr/lib/systemd/systemd-journald", None),  # only `systemd` itself is protected
])
def test_protected_names_match_comm_or_executable(comm, exe, expected):
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import BUILTIN_PROTECTED_NAMES
    assert protected_name(comm, exe, list(BUILTIN_PROTECTED_NAMES)) == expected


@pytest.mark.covers('M15')
def test_poll_until_stops_at_the_deadline_without_overrunning():
    """M15: monotonic deadline; the last sleep is cut to what is left."""
    clock = FakeClock()
    outcome = poll_until(lambda: 1, lambda value: False, timeout=2.0, interval=0.75, clock=clock)
    assert not outcome.satisfied and outcome.attempts == 4
    assert clock.sleeps == [0.75, 0.75, 0.5]
    assert outcome.elapsed == pytest.approx(2.0)


def test_poll_until_returns_on_first_success_and_on_stop_early():
    clock = FakeClock()
    values = iter([3, 2, 0])
    outcome = poll_until(lambda: next(values), lambda v: v == 0, timeout=10, interval=1, clock=clock)
    assert outcome.satisfied and outcome.attempts == 3 and outcome.value == 0
    early = poll_until(lambda: "lost", lambda v: False, timeout=10, interval=1, clock=FakeClock(), stop_early=lambda v: v == "lost")
    assert not early.satisfied and early.attempts == 1


def test_poll_until_with_zero_timeout_probes_once():
    outcome = poll_until(lambda: 5, lambda v: False, timeout=0, interval=1, clock=FakeClock())
    assert outcome.attempts == 1


@pytest.mark.covers('M15')
def test_a_real_poll_ignores_wall_clock_steps(monkeypatch):
    """M15 with the real clock: while a real poll runs, the wall clock jumps an hour ahead and then a day back (as an NTP
    step would); the poll neither ends at once nor waits a day: it probes for its own 0.3 s of monotonic time."""
    import time

    real_time, steps, offset = time.time, iter([3600.0, -86400.0]), [0.0]

    def stepped_wall_clock() -> float:
        offset[0] += next(steps, 0.0)
        return real_time() + offset[0]

    monkeypatch.setattr(time, "time", stepped_wall_clock)
    monkeypatch.setattr(time, "time_ns", lambda: int(stepped_wall_clock() * 1e9))
    started = time.perf_counter()
    outcome = poll_until(time.time, lambda wall: False, timeout=0.3, interval=0.05)
    elapsed = time.perf_counter() - started
    assert not outcome.satisfied and outcome.attempts >= 3 and offset[0] == -82800.0
    assert 0.3 <= elapsed < 5  # bounds an hour apart: a deadline on the wall clock would end at once or never


def test_deadline_expires_after_its_seconds_of_the_injected_clock():
    clock = FakeClock()
    deadline = Deadline(5, clock)
    clock.now += 4.9
    assert not deadline.expired() and deadline.remaining() == pytest.approx(0.1)
    clock.now += 0.1
    assert deadline.expired() and deadline.remaining() == 0


def test_deadline_ignores_wall_clock_steps(monkeypatch):
    """A real Deadline (the default clock) while the wall clock steps an hour back and a day ahead: it neither expires
    early nor late - it counts monotonic time only. The module is loaded again with the stepping clock in place, so
    that a default bound to the wall clock would be bound to the stepping one."""
    import importlib
    import time

    from ansible_collections.gpufleet.serving.plugins.module_utils import _polling

    real_time, offset = time.time, [0.0]
    monkeypatch.setattr(time, "time", lambda: real_time() + offset[0])
    monkeypatch.setattr(time, "time_ns", lambda: int((real_time() + offset[0]) * 1e9))
    try:
        deadline = importlib.reload(_polling).Deadline(0.3)
        offset[0] = -3600.0
        assert not deadline.expired() and 0.2 < deadline.remaining() <= 0.3
        offset[0] = 86400.0
        assert not deadline.expired() and 0.2 < deadline.remaining() <= 0.3
        time.sleep(0.35)
        assert deadline.expired() and deadline.remaining() == 0
    finally:
        monkeypatch.undo()
        importlib.reload(_polling)


@pytest.mark.parametrize(("value", "message"), [
    (-1, "at least 0"), (float("nan"), "not a number"), (True, "not a number"), (10**6, "more than a day"),
])
def test_non_negative_seconds(value, message):
    with pytest.raises(InvalidInput) as error:
        non_negative("timeout", value)
    assert message in error.value.msg and error.value.msg.startswith("timeout:")


INVENTORY = {"driver_version": "580", "gpus": [
    {"index": 0, "uuid": "GPU-a", "minor": 2, "status": "ok", "memory_api": "v2", "total_mib": 1000, "used_mib": 0, "reserved_mib": 10, "processes": []},
    {"index": 1, "uuid": "GPU-b", "minor": 0, "status": "ok", "memory_api": "v2", "total_mib": 1000, "used_mib": 700, "reserved_mib": 10,
     "processes": [{"pid": 5, "used_mib": 700, "type": "compute"}]},
    {"index": 2, "uuid": "GPU-c", "status": "lost", "error": "GPU is lost", "processes": []},
]}


def test_select_gpus_by_index_uuid_and_default():
    assert select_gpus(None, INVENTORY) == [0, 1, 2]
    assert select_gpus(["GPU-b", "0", "1"], INVENTORY) == [1, 0]
    with pytest.raises(InvalidInput, match="GPU index 3 does not exist"):
        select_gpus(["3"], INVENTORY)


@pytest.mark.parametrize("selector", ["", "gpu0", "-1", "GPU-", "GPU-a b", "1.5"])
def test_gpu_selector_syntax(selector):
    with pytest.raises(InvalidInput):
        validate_gpu_selectors([selector])


def test_assess_flags_used_memory_processes_and_fatal_status():
    assessment = memory.assess(INVENTORY, [0, 1, 2], memory.Limits(max_used_mib=512, max_processes=0))
    assert assessment.dirty == [1, 2] and assessment.fatal == [2] and not assessment.passed
    problems = {gpu["index"]: gpu["problems"] for gpu in assessment.gpus}
    assert problems[0] == []
    assert problems[1] == ["700 MiB used > max_used_mib 512", "1 processes > max_processes 0"]
    assert problems[2] == ["NVML status lost: GPU is lost"]


@pytest.mark.covers('M2')
def test_v1_reading_is_compared_after_subtracting_the_reserve():
    """M2: v1 615 MiB on an idle GPU is 0 after the reserve; a raw comparison would fail a 512 MiB check."""
    idle_v1 = {"memory_api": "v1", "used_mib": 615}
    assert memory.comparable_used_mib(idle_v1, 1024) == 0
    assert memory.comparable_used_mib({"memory_api": "v1", "used_mib": 3000}, 1024) == 1976
    assert memory.comparable_used_mib({"memory_api": "v2", "used_mib": 615}, 1024) == 615


def test_classification_and_failure_message():
    assessment = memory.assess(INVENTORY, [1, 2], memory.Limits(max_used_mib=512))
    holders = {0: [{"pid": 5, "comm": "python3", "state": "S"}]}
    details = memory.explain_dirty(assessment, holders, proc_confirmed={5})
    assert details[1]["classification"] == memory.HOLDER_PRESENT
    assert details[2]["classification"] == memory.GPU_LOST
    assert memory.classify({"status": "ok"}, []) == memory.NO_HOLDER_FOUND
    assert memory.classify({"status": "reset_required"}, []) == memory.RESET_REQUIRED
    message = memory.failure_message(assessment, details, timeout=60)
    assert message.splitlines()[0] == "2 of 2 GPU(s) not clean after 60s:"
    assert "GPU 1 (GPU-b, bus ?): 700 MiB used > max_used_mib 512; holders in /proc: 5 (python3, state S); NVML processes: 5;" in message


def test_stale_nvml_pid_is_marked_in_details():
    assessment = memory.assess(INVENTORY, [1], memory.Limits(max_used_mib=512))
    details = memory.explain_dirty(assessment, {}, proc_confirmed=set())
    assert details[1]["nvml_processes"][0]["stale"] == "not a live holder in /proc"
    assert details[1]["classification"] == memory.NO_HOLDER_FOUND


@pytest.mark.covers('M3', 'M7')
def test_watch_passes_when_memory_frees_and_stops_early_on_a_lost_gpu():
    """M3, M7 with an injected clock and scripted NVML readings."""
    request = memory.MemoryRequest(None, None, memory.Limits(512), timeout=30, interval=0.5, nvml_timeout=10, device_paths=[])
    busy = {"driver_version": "x", "gpus": [dict(INVENTORY["gpus"][1])]}
    busy["gpus"][0]["index"] = 0
    free = {"driver_version": "x", "gpus": [dict(busy["gpus"][0], used_mib=0, processes=[])]}
    readings = iter([busy, busy, free])
    clock = FakeClock()
    watched = memory.watch(lambda: next(readings), request, [0], next(readings), clock)
    assert watched.assessment.passed and watched.attempts == 3 and watched.elapsed == pytest.approx(1.0)
    lost = {"driver_version": "x", "gpus": [{"index": 0, "status": "lost", "processes": []}]}
    stopped = memory.watch(lambda: lost, request, [0], lost, FakeClock())
    assert not stopped.assessment.passed and stopped.attempts == 1 and not stopped.timed_out


class _Nvml:
    """An NVML client that lists the given processes on GPU 0."""

    def __init__(self, processes):
        self.processes = processes

    def __call__(self, _timeout):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False

    def inventory(self):
        return {"gpus": [{"index": 0, "uuid": "GPU-0", "minor": 0, "processes": self.processes}]}


def unused_plausible_pid() -> int:
    """A pid below this kernel's limit (so not implausible) that no process has."""
    with open("/proc/sys/kernel/pid_max", encoding="ascii") as handle:
        pid = int(handle.read()) - 7
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


class _TwoGpuNvml(_Nvml):
    """An NVML client that lists the given processes on GPU 1 (minor 1), beside an empty GPU 0."""

    def inventory(self):
        return {"gpus": [{"index": 0, "uuid": "GPU-0", "minor": 0, "processes": []},
                         {"index": 1, "uuid": "GPU-1", "minor": 1, "processes": self.processes}]}


@pytest.mark.covers("G8")
@pytest.mark.parametrize("namespaced", [False, True])
def test_in_a_pid_namespace_nvml_pids_select_nothing(tmp_path, namespaced):
    """G8, the wrong-target kill: NVML lists on GPU 1 a number that, where this module runs, belongs to a process holding
    only GPU 0's device file. In the host's namespace NVML's word is the host's truth and places it on GPU 1 (the control
    case, so the test can fail); inside a PID namespace the number is another process's: it selects nothing, it is not
    signalled, and the warning says why."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill as _holders_kill
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
    for name in ("nvidia0", "nvidia1"):
        (tmp_path / name).write_bytes(b"")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)",
                               str(tmp_path / "nvidia0")], stdout=subprocess.PIPE, text=True)
    # the module's stand-in: a sibling of the holder, so that the holder is not among the module's own descendants
    module = subprocess.Popen(["sleep", "60"])
    try:
        assert holder.stdout.readline().strip() == "ready"
        request = _holders_kill.KillRequest(gpus=["1"], device_paths=[str(tmp_path / "nvidia*")], sources=["proc", "nvml"], protected=[],
                                            protected_pids=[], term_timeout=1, kill_timeout=1, max_targets=8, kill_ambiguous=False,
                                            nvml_timeout=5, lock_timeout=1, outside_units="kill")
        plan = _holders_kill.observe(request, _TwoGpuNvml([{"pid": holder.pid, "used_mib": 10, "type": "compute"}]), ProcReader(),
                                     self_pid=module.pid, init_pid_namespace=lambda: not namespaced)
        if not namespaced:
            assert [target["pid"] for target in plan.targets] == [holder.pid], "the host's NVML places its own PID on GPU 1"
            return
        assert plan.targets == [] and plan.ambiguous == [], plan.targets
        assert plan.stale_nvml_pids == [{"pid": holder.pid, "gpu": 1, "used_mib": 10, "reason": _holders_kill.HOST_PID}]
        assert any(f"NVML PIDs {holder.pid} were not used to place or select holders" in warning for warning in plan.warnings)
        assert holder.poll() is None
    finally:
        for process in (holder, module):
            process.kill()
            process.wait()


@pytest.mark.covers("G8")
def test_outside_a_pid_namespace_an_unconfirmed_nvml_pid_is_stale_and_nothing_is_said(tmp_path):
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill as _holders_kill
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
    (tmp_path / "nvidia0").write_bytes(b"")
    pid = unused_plausible_pid()
    request = _holders_kill.KillRequest(gpus=None, device_paths=[str(tmp_path / "nvidia*")], sources=["proc", "nvml"], protected=[],
                                        protected_pids=[], term_timeout=1, kill_timeout=1, max_targets=8, kill_ambiguous=False,
                                        nvml_timeout=5, lock_timeout=1, outside_units="kill")
    plan = _holders_kill.observe(request, _Nvml([{"pid": pid, "used_mib": 10, "type": "compute"}]), ProcReader(), init_pid_namespace=lambda: True)
    assert plan.targets == [] and [entry["pid"] for entry in plan.stale_nvml_pids] == [pid]
    assert not any("PID namespace" in warning for warning in plan.warnings)


def _kill_request(**params):
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders_kill import KillRequest
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader

    defaults = {"term_timeout": 1, "kill_timeout": 1, "max_targets": 64, "nvml_timeout": 1, "lock_timeout": 1}
    return KillRequest.from_params({**defaults, **params}, ProcReader())


def _plan_of(*units):
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import KillPlan

    holders = [{"pid": 100 + index, "comm": "python3", "unit": unit} for index, unit in enumerate(units)]
    return KillPlan(holders=holders, targets=list(holders))


@pytest.mark.covers('G25')
@pytest.mark.parametrize("outside_units", ["kill", "report"])
def test_a_holder_in_a_service_systemd_restarts_is_never_killed_alone(outside_units):
    """G25: with kill the task is refused naming the unit; with report the holder is left and listed."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders_kill import place_holders, refusal

    request = _kill_request(units=["vllm.service"], outside_units=outside_units)
    plan = _plan_of("vllm.service", "inference-proxy.service", "batch.service", "ssh.service", "inference-proxy.service")
    # pid 101 is the proxy's main process, 104 a child of it; batch.service does not restart
    policies = {"inference-proxy.service": ("always", 101), "batch.service": ("no", 102)}
    asked = []
    place_holders(plan, request, lambda unit: asked.append(unit) or policies[unit])
    assert sorted(asked) == ["batch.service", "inference-proxy.service"]  # the listed unit and SSH's need no question
    assert [t["placement"] for t in plan.holders] == ["listed_unit", "other_service", "other_service", "session", "other_service"]
    if outside_units == "kill":
        assert [t["pid"] for t in plan.restarting] == [101]
        message = refusal(plan, request)
        assert "run in inference-proxy.service (Restart=always), which systemd would start again: nothing was signalled" in message
    else:
        assert plan.restarting == [] and refusal(plan, request) is None
        assert [t["unit"] for t in plan.targets] == ["vllm.service"]
        assert [t["pid"] for t in plan.outside] == [101, 102, 103, 104]


def test_a_restarting_service_among_the_units_being_stopped_is_killed():
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders_kill import place_holders, refusal

    request = _kill_request(units=["vllm.service"])
    plan = _plan_of("vllm.service")
    place_holders(plan, request, lambda unit: pytest.fail(f"asked for {unit}'s Restart= though it is being stopped"))
    assert refusal(plan, request) is None and [t["placement"] for t in plan.targets] == ["listed_unit"]


@pytest.mark.parametrize(("params", "message"), [
    ({"units": ["vllm"]}, "units: 'vllm' is not a unit name"),
    ({"units": ["../x.service"]}, "units: '../x.service' is not a unit name"),
    ({"outside_units": "ignore"}, "outside_units: 'ignore' is not one of kill, report, fail"),
])
def test_bad_units_and_outside_units_are_refused(params, message):
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(".", r"\.")):
        _kill_request(**params)


@pytest.mark.covers('G8')
def test_a_pid_namespace_that_cannot_be_read_is_not_taken_for_the_hosts(monkeypatch):
    """G8 fail closed: where /proc/self/ns/pid cannot be read, NVML's host PIDs are not trusted to name our processes."""
    assert holders.in_init_pid_namespace() is (os.readlink("/proc/self/ns/pid") == holders.INIT_PID_NAMESPACE)

    def refused(_path):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(holders.os, "readlink", refused)
    assert holders.in_init_pid_namespace() is False


def test_the_capability_a_complete_scan_needs_is_read_from_the_effective_set():
    assert holders.missing_scan_capabilities({"CapEff": "000001ffffffffff"}) == []
    assert holders.missing_scan_capabilities({"CapEff": "000001fffff7ffff"}) == ["CAP_SYS_PTRACE"]  # bit 19 cleared
    assert holders.missing_scan_capabilities({"CapEff": "0000000000080000"}) == []
    assert holders.missing_scan_capabilities({}) == ["CAP_SYS_PTRACE"]
