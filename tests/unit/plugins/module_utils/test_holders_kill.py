"""gpu_holders_kill without Ansible (plugins/module_utils/_gpus/holders_kill.py), piece by piece: the request's checks,
where a holder runs and whose it is, the launchers of escaped workers, every refusal's words, and a whole run on real
holders of stand-in device files (NVML's list given as the module's inventory shapes it)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
from conftest import HELPER

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, InvalidInput, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import BUILTIN_PROTECTED_NAMES, Guard, KillPlan
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders_kill import KillRequest
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader


def params(**overrides) -> dict:
    return {"term_timeout": 1, "kill_timeout": 1, "max_targets": 8, "nvml_timeout": 5, "lock_timeout": 1, **overrides}


def request_of(**overrides) -> KillRequest:
    return KillRequest.from_params(params(**overrides), ProcReader())


class Nvml:
    """NVML's inventory of GPUs 0..n-1 on minors 0..n-1, listing the given processes on their GPUs."""

    def __init__(self, listed: dict[int, list[int]] | None = None, gpus: int = 4):
        self.listed = listed or {}
        self.gpus = gpus
        self.opened = 0

    def __call__(self, _timeout):
        self.opened += 1
        return self

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False

    def inventory(self):
        return {"driver_version": "580", "gpus": [{"index": index, "minor": index, "uuid": f"GPU-{index}", "status": "ok",
                                                   "processes": [{"pid": pid, "used_mib": 100, "type": "compute"} for pid in self.listed.get(index, [])]}
                                                  for index in range(self.gpus)]}


def orphan(processes, *args: str) -> int:
    """A holder that is not this test's descendant (as an engine's worker is not the module's): its launcher exits."""
    launcher = subprocess.Popen(["sh", "-c", 'exec "$0" "$@" &', sys.executable, str(HELPER), *args], stdout=subprocess.PIPE, text=True)
    line = launcher.stdout.readline().split()
    launcher.wait()
    assert line[:1] == ["ready"], line
    processes.extra_pids.append(int(line[1]))
    return int(line[1])


def alive(pid: int) -> bool:
    try:
        return ProcReader().stat(pid).state not in ("Z", "X")
    except ProcessGone:
        return False


def test_a_request_takes_its_defaults():
    request = request_of()
    assert request.sources == ["proc", "nvml"] and request.device_paths == ["/dev/nvidia*", "/dev/nvidia-caps/*"]
    assert request.protected == list(BUILTIN_PROTECTED_NAMES) and request.protected_pids == [] and request.gpus is None
    assert (request.outside_units, request.incomplete_scan, request.kill_ambiguous, request.units, request.kept_units) == ("fail", "fail", False, (), ())
    assert request.owner_uids == frozenset() and request.needs_nvml
    given = request_of(gpus=["1"], sources=["proc"], protected=["my-agent"], units=["vllm.service"], kept_units=["sglang.service"],
                       outside_units="report", incomplete_scan="warn", ambiguous="kill", owners=["nobody", "no-such-user-here"])
    assert given.protected[-1] == "my-agent" and given.units == ("vllm.service",) and given.kept_units == ("sglang.service",)
    assert (given.outside_units, given.incomplete_scan, given.kill_ambiguous, given.gpus) == ("report", "warn", True, ["1"])
    assert given.owner_uids == frozenset({65534}), "a user no account has owns nothing"
    assert given.needs_nvml, "a GPU selection needs NVML's indexes"
    assert not request_of(sources=["proc"]).needs_nvml and request_of(sources=["nvml"]).needs_nvml
    assert not request_of(ambiguous="report").kill_ambiguous


@pytest.mark.parametrize(("overrides", "says"), [
    ({"device_paths": ["dev/nvidia*"]}, "device_paths: 'dev/nvidia*' is not an absolute path or glob"),
    ({"device_paths": ["/dev/nvidia\n0"]}, "device_paths: '/dev/nvidia\\n0' is not an absolute path or glob"),
    ({"device_paths": ["/dev/nvidia\x000"]}, "device_paths: '/dev/nvidia\\x000' is not an absolute path or glob"),
    ({"units": [""]}, "units: '' is not a unit name (for example vllm.service)"),
    ({"units": ["system.slice/vllm.service"]}, "units: 'system.slice/vllm.service' is not a unit name"),
    ({"units": ["vllm"]}, "units: 'vllm' is not a unit name"),
    ({"units": ["vllm\t.service"]}, "units: 'vllm\\t.service' is not a unit name"),
    ({"kept_units": ["parked"]}, "units: 'parked' is not a unit name"),
    ({"outside_units": "ignore"}, "outside_units: 'ignore' is not one of kill, report, fail"),
    ({"incomplete_scan": "ignore"}, "incomplete_scan: 'ignore' is not one of fail, warn"),
    ({"protected": [""]}, "protected: '' is not a process name (a comm or executable name, without '/')"),
    ({"protected": ["/usr/bin/dcgm"]}, "protected: '/usr/bin/dcgm' is not a process name"),
    ({"protected": ["a\nb"]}, "protected: 'a\\nb' is not a process name"),
    ({"protected_pids": [1]}, "protected_pids: 1 is not a valid process id (PID 1 and below are always protected)"),
    ({"protected_pids": [0]}, "protected_pids: 0 is not a valid process id"),
    ({"max_targets": 0}, "max_targets"),
    ({"nvml_timeout": 0}, "nvml_timeout"),
    ({"term_timeout": -1}, "term_timeout"),
    ({"kill_timeout": -1}, "kill_timeout"),
    ({"lock_timeout": -1}, "lock_timeout"),
    ({"owners": ["root"]}, "owners: root owns the system's own processes"),
])
def test_a_bad_request_is_refused_naming_the_option(overrides, says):
    with pytest.raises(InvalidInput) as refused:
        request_of(**overrides)
    assert refused.value.msg.startswith(says), refused.value.msg


def test_a_protected_pid_must_be_a_process_not_one_of_its_threads():
    code = ("import threading, time\nt = threading.Thread(target=time.sleep, args=(1e6,), daemon=True); t.start()\n"
            "print(t.native_id, flush=True)\ntime.sleep(1e6)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        thread_id = int(proc.stdout.readline())
        with pytest.raises(InvalidInput, match=f"protected_pids: {thread_id} is a thread id, not a process: give its process id"):
            request_of(protected_pids=[thread_id])
        assert request_of(protected_pids=[proc.pid, 4194303]).protected_pids == [proc.pid, 4194303], "a pid no process has is kept"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("unit", "where"), [
    ("vllm.service", "listed_unit"), ("session-42.scope", "session"), ("ssh.service", "session"), ("sshd.service", "session"),
    ("session-4.scope/x", "elsewhere"), ("dcgm.service", "other_service"), ("docker-0123abc.scope", "container"),
    ("libpod-conmon-9f.scope", "container"), ("cri-containerd-1.scope", "container"), ("crio-77.scope", "container"),
    ("run-r1a2.scope", "elsewhere"), (None, "elsewhere"), ("", "elsewhere"), ("docker.scope", "elsewhere"),
])
def test_a_holder_is_placed_by_its_unit(unit, where):
    assert holders_kill.placement({"unit": unit}, ("vllm.service",)) == where


def holder(pid: int, unit: str | None, uid: int = 1000, **more) -> dict:
    return {"pid": pid, "unit": unit, "uid": uid, "comm": "python3", "user": f"u{uid}", **more}


def plan_of(*targets: dict, **more) -> KillPlan:
    return KillPlan(holders=[dict(t) for t in targets], targets=list(targets), **more)


def test_placement_marks_each_holder_foreign_or_the_engines_and_asks_systemd_once_per_unit():
    asked = []

    def policy(unit):
        asked.append(unit)
        return {"dcgm.service": ("always", 30), "batch.service": ("", 0)}[unit]

    plan = plan_of(holder(10, "vllm.service", 999), holder(11, "run-x.scope", 1000), holder(12, "run-y.scope", 2000),
                   holder(13, "sglang.service", 2000), holder(30, "dcgm.service", 0), holder(31, "dcgm.service", 0), holder(40, "batch.service", 2000))
    request = request_of(units=["vllm.service"], kept_units=["sglang.service"], outside_units="kill")
    request = KillRequest(**{**request.__dict__, "owner_uids": frozenset({1000})})
    holders_kill.place_holders(plan, request, policy)
    assert asked == ["dcgm.service", "batch.service"]
    by_pid = {h["pid"]: h for h in plan.targets + plan.kept}
    assert [h["pid"] for h in plan.kept] == [13] and by_pid[13]["placement"] == "kept_unit" and by_pid[13]["foreign"] is False
    assert [(h["pid"], h["placement"], h["foreign"]) for h in plan.targets] == [
        (10, "listed_unit", False), (11, "elsewhere", False), (12, "elsewhere", True), (30, "other_service", True),
        (31, "other_service", True), (40, "other_service", True)]
    assert (by_pid[30]["restart"], by_pid[30]["main_process"], by_pid[31]["main_process"]) == ("always", True, False)
    assert (by_pid[40]["restart"], by_pid[40]["main_process"]) == ("no", False)
    assert [h["pid"] for h in plan.foreign] == [12, 30, 31, 40]
    assert [h["pid"] for h in plan.restarting] == [30] and plan.outside == []
    assert all("placement" in h for h in plan.holders)


@pytest.mark.parametrize("outside_units", ["report", "fail"])
def test_report_leaves_the_foreign_holders_and_fail_keeps_them_to_refuse(outside_units):
    plan = plan_of(holder(10, "vllm.service"), holder(12, "run-y.scope", 2000), holder(30, "dcgm.service", 0), holder(32, "agent.service", 1000))
    request = KillRequest(**{**request_of(units=["vllm.service"], outside_units=outside_units).__dict__, "owner_uids": frozenset({1000})})
    holders_kill.place_holders(plan, request, lambda unit: ("on-failure", 30 if unit == "dcgm.service" else 32))
    assert [h["pid"] for h in plan.outside] == [12, 30]
    assert [h["pid"] for h in plan.restarting] == [32], "the engines' own holder in a restarting service still refuses"
    kept = [10, 32] if outside_units == "report" else [10, 12, 30, 32]
    assert [h["pid"] for h in plan.targets] == kept


def test_a_restart_setting_of_no_or_none_is_not_restarting():
    for setting in ("", "no"):
        plan = plan_of(holder(30, "dcgm.service", 0))
        holders_kill.place_holders(plan, request_of(outside_units="kill"), lambda _unit, setting=setting: (setting, 30))
        assert plan.restarting == []


@pytest.fixture
def launcher():
    """A shell that started a sleeping worker: the worker's parent, of this user and in this test's own unit."""
    proc = subprocess.Popen(["sh", "-c", "sleep 1000 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    yield proc, worker
    for pid in (worker, proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    proc.wait()


def guard_for_this_test() -> Guard:
    reader = ProcReader()
    return Guard(names=list(BUILTIN_PROTECTED_NAMES), self_pid=os.getpid(), ancestors={stat.pid for stat in reader.ancestors(os.getpid())},
                 descendants=set(), pids=set())


def test_an_escaped_workers_launcher_of_the_same_user_and_place_is_signalled_first(launcher):
    proc, worker = launcher
    reader = ProcReader()
    target = dict(holder(worker, reader.unit(worker), os.getuid()), placement="elsewhere", foreign=False)
    plan = plan_of(target)
    found = holders_kill.escaped_parents(plan, reader, guard_for_this_test())
    assert [(entry["pid"], entry["parent_of"], entry["placement"], entry["foreign"], entry["via"]) for entry in found] == [
        (proc.pid, worker, "elsewhere", False, [])], "up to this module's own process, which is protected"
    for change in ({"foreign": True}, {"placement": "session"}, {"uid": None}, {"uid": os.getuid() + 1}, {"unit": "other.scope"}):
        assert holders_kill.escaped_parents(plan_of(dict(target, **change)), reader, guard_for_this_test()) == [], change
    plan.holders.append({"pid": proc.pid})
    assert holders_kill.escaped_parents(plan, reader, guard_for_this_test()) == [], "a parent that holds is judged as a holder"


def test_the_refusals_say_why_and_what_to_do():
    request = request_of(outside_units="fail")
    possible = [dict(holder(100 + n, "run-a.scope", 0, user="root"), why="blocked") for n in range(6)]
    capless = KillPlan(missing_capabilities=["CAP_SYS_PTRACE"], possible=possible[:1])
    reasons = holders_kill.incomplete_scan_reasons(capless)
    assert reasons == ["this module runs without CAP_SYS_PTRACE: the kernel hides the open files of every process it may not trace "
                       "(another user's, or root's with capabilities it lacks), so a GPU holder cannot be ruled out - 1 process(es) may "
                       "hold the GPUs (pid 100 python3 of user root in run-a.scope; see possible_holders). Run it with that capability "
                       "(as root on the host, or a container given --cap-add SYS_PTRACE)"]
    assert "may hold" not in holders_kill.incomplete_scan_reasons(KillPlan(missing_capabilities=["CAP_SYS_PTRACE"]))[0]
    many = holders_kill.incomplete_scan_reasons(KillPlan(possible=possible))
    assert many == ["6 process(es) may hold the GPUs (pid 100 python3 of user root in run-a.scope: blocked; pid 101 python3 of user root in "
                    "run-a.scope: blocked; pid 102 python3 of user root in run-a.scope: blocked; pid 103 python3 of user root in run-a.scope: "
                    "blocked; pid 104 python3 of user root in run-a.scope: blocked; and 1 more; see possible_holders)"]
    assert holders_kill.incomplete_scan_reasons(KillPlan()) == []
    assert holders_kill.refusal(capless, request).startswith("the scan for GPU holders is incomplete: this module runs without CAP_SYS_PTRACE")
    assert holders_kill.refusal(capless, request).endswith("list them in protected_pids when they hold no GPU, or accept an incomplete scan "
                                                           "with incomplete_scan: warn")
    assert holders_kill.refusal(capless, request_of(incomplete_scan="warn")) is None

    outside = [dict(holder(200 + n, None, 2000), placement="elsewhere") for n in range(6)]
    assert holders_kill.refusal(KillPlan(outside=outside[:1]), request) == (
        "1 process(es) hold the GPUs outside the units being stopped (pid 200 python3 of user u2000 in no unit (elsewhere)) and "
        "outside_units is fail: nothing was signalled")
    owned = KillRequest(**{**request.__dict__, "owner_uids": frozenset({1000})})
    assert "outside the units being stopped and not run by the engines' users (" in holders_kill.refusal(KillPlan(outside=outside[:1]), owned)
    assert holders_kill.describe_holders(outside).endswith("pid 204 python3 of user u2000 in no unit (elsewhere); and 1 more")
    assert holders_kill.refusal(KillPlan(outside=outside[:1]), request_of(outside_units="report")) is None

    restarting = [dict(holder(300, "b.service"), restart="always"), dict(holder(301, "a.service"), restart="on-failure"),
                  dict(holder(302, "a.service"), restart="on-failure")]
    assert holders_kill.refusal(KillPlan(restarting=restarting), request) == (
        "processes holding the GPUs run in a.service (Restart=on-failure), b.service (Restart=always), which systemd would start again: "
        "nothing was signalled. Stop the unit with it (add it to the units being stopped), or stop it first")

    nine = KillPlan(targets=[holder(n, None) for n in range(9)])
    assert holders_kill.refusal(nine, request) == ("9 processes would be signalled, more than max_targets=8: nothing was signalled. A plan "
                                                   "this large is usually a selection mistake; see `targets` in the result")
    assert holders_kill.refusal(KillPlan(targets=nine.targets[:8]), request) is None


def test_a_holder_killed_in_a_service_that_does_not_restart_is_said_to_leave_it_running():
    plan = KillPlan(targets=[dict(holder(1, "b.service"), placement="other_service"), dict(holder(2, "a.service"), placement="other_service"),
                             dict(holder(3, "c.service"), placement="other_service"), dict(holder(4, "vllm.service"), placement="listed_unit")],
                    restarting=[holder(3, "c.service")])
    assert holders_kill._unit_warnings(plan) == [
        "holders run in a.service, which is not among the units being stopped: they are killed, the unit is not stopped",
        "holders run in b.service, which is not among the units being stopped: they are killed, the unit is not stopped"]


def test_the_plans_result_keys_and_whether_the_scan_was_complete():
    result = holders_kill.plan_result(KillPlan())
    assert list(result) == ["holders", "targets", "protected", "ambiguous", "outside", "foreign", "restarting", "stale_nvml_pids", "unreadable",
                            "kept", "possible_holders", "escaped_parents", "scan_complete", "missing_capabilities"]
    assert result["scan_complete"] is True
    assert holders_kill.plan_result(KillPlan(missing_capabilities=["CAP_SYS_PTRACE"]))["scan_complete"] is False


def observe(devices, request: KillRequest, nvml=None, namespace=True):
    return holders_kill.observe(request, nvml or Nvml(), ProcReader(), init_pid_namespace=lambda: namespace)


def test_observe_places_nvml_listed_holders_and_reports_what_it_could_not_use(devices, processes):
    on_one = orphan(processes, "--open", devices.gpu(0), devices.gpu(1))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    nvml = Nvml({1: [on_one], 2: [gone.pid, 5_000_000]})
    plan = observe(devices, request_of(device_paths=devices.globs, gpus=["1"]), nvml)
    assert nvml.opened == 1
    assert [(t["pid"], t["gpus"], t["gpu_uuids"]) for t in plan.targets] == [(on_one, [1], ["GPU-1"])]
    assert plan.stale_nvml_pids == [], "stale PIDs on GPUs not selected are not reported"
    everything = observe(devices, request_of(device_paths=devices.globs), nvml)
    assert [(s["pid"], s["gpu"], s["reason"]) for s in everything.stale_nvml_pids] == [(gone.pid, 2, "no such process"), (5_000_000, 2, "implausible PID")]
    assert "NVML listed implausible PIDs 5000000: ignored, never signalled" in everything.warnings
    assert everything.inventory["driver_version"] == "580"


def test_observe_in_a_pid_namespace_uses_no_nvml_pid(devices, processes):
    on_one = orphan(processes, "--open", devices.gpu(0), devices.gpu(1))
    plan = observe(devices, request_of(device_paths=devices.globs, gpus=["1"], ambiguous="kill"), Nvml({1: [on_one, 77]}), namespace=False)
    assert [(s["pid"], s["reason"]) for s in plan.stale_nvml_pids] == [(on_one, holders_kill.HOST_PID), (77, holders_kill.HOST_PID)]
    listed = ", ".join(str(pid) for pid in sorted([77, on_one]))  # by number (a sandbox's PIDs may be below 77)
    assert any(f"NVML PIDs {listed} were not used to place or select holders" in w for w in plan.warnings), plan.warnings
    assert [t["pid"] for t in plan.targets] == [on_one] and "reason" not in plan.targets[0], "ambiguous: kill makes it a target"
    quiet = observe(devices, request_of(device_paths=devices.globs), Nvml(), namespace=False)
    assert not any("PID namespace" in w for w in quiet.warnings), "nothing listed, nothing to say"


def test_observe_without_nvml_or_devices_says_so(devices, processes, tmp_path):
    on_one = orphan(processes, "--open", devices.gpu(0), devices.gpu(1))
    nvml = Nvml()
    plan = observe(devices, request_of(device_paths=devices.globs, sources=["proc"]), nvml)
    assert nvml.opened == 0 and plan.inventory is None
    assert [t["pid"] for t in plan.targets] == [on_one] and plan.targets[0]["gpus"] == []
    assert plan.warnings == ["NVML not queried: holders are reported by device file, without GPU indexes"]
    empty = observe(devices, request_of(device_paths=[str(tmp_path / "none*")]), nvml)
    assert empty.warnings[0] == f"no device file matches {tmp_path / 'none*'}" and empty.holders == []
    nvml_only = observe(devices, request_of(device_paths=devices.globs, sources=["nvml"]), Nvml({0: [on_one]}))
    assert [t["pid"] for t in nvml_only.targets] == [on_one], "NVML's PID confirmed by reading that one process"


def test_an_ambiguous_holder_is_left_with_a_warning(devices, processes):
    on_both = orphan(processes, "--open", devices.gpu(0), devices.gpu(1))
    plan = observe(devices, request_of(device_paths=devices.globs, gpus=["1"]))
    assert plan.targets == [] and [a["pid"] for a in plan.ambiguous] == [on_both]
    assert plan.warnings[-1] == ("1 holder(s) hold nodes of the selected and other GPUs and NVML lists them on none (forked children, NVML "
                                 "clients): left alone, see `ambiguous`; set ambiguous: kill or free all GPUs to include them")


def test_an_incomplete_scan_under_warn_is_said_in_the_warnings(devices, monkeypatch):
    monkeypatch.setattr(holders_kill, "own_status", lambda: {"CapEff": "0"})
    plan = observe(devices, request_of(device_paths=devices.globs, incomplete_scan="warn"))
    assert plan.missing_capabilities == ["CAP_SYS_PTRACE"]
    assert plan.warnings[-1].startswith("this module runs without CAP_SYS_PTRACE") and plan.warnings[-1].endswith("(incomplete_scan: warn)")
    assert not any("CAP_SYS_PTRACE" in w for w in observe(devices, request_of(device_paths=devices.globs)).warnings)


def test_a_run_in_check_mode_signals_nothing_and_a_real_run_reports_each_signal(devices, processes, tmp_path):
    pid = orphan(processes, "--open", devices.gpu(0))
    request = request_of(device_paths=devices.globs, outside_units="kill")
    warned, logged = [], []
    planned = holders_kill.kill_holders(request, Nvml(), ProcReader(), None, check_mode=True, warn=warned.append, log=logged.append)
    assert planned["changed"] is True and planned["signals"] == [] and [t["pid"] for t in planned["targets"]] == [pid]
    assert alive(pid) and logged == [] and planned["journal_path"] is None
    journal = Journal(str(tmp_path / "signals.jsonl"), "run-1", "gpu_holders_kill")
    done = holders_kill.kill_holders(request, Nvml(), ProcReader(), None, check_mode=False, log=logged.append, journal=journal)
    assert done["changed"] is True and [t["pid"] for t in done["terminated"]] == [pid] and done["killed"] == [] and done["survivors"] == []
    assert [(s["signal"], s["result"]) for s in done["signals"]] == [("SIGTERM", "sent"), ("SIGCONT", "sent")]
    assert done["journal_path"] == journal.path and logged[0] == f"gpu_holders_kill: SIGTERM to pid {pid} (start time {done['targets'][0]['start_time']}): sent"
    assert done["elapsed"] >= 0 and not alive(pid)
    again = holders_kill.kill_holders(request, Nvml(), ProcReader(), None, check_mode=False)
    assert again["changed"] is False and again["targets"] == []
    assert not holders_kill.kill_holders(request, Nvml(), ProcReader(), None, check_mode=True)["changed"]


def test_a_refused_run_raises_with_the_whole_result(devices, processes):
    pid = orphan(processes, "--open", devices.gpu(0))
    with pytest.raises(Refused) as refused:
        holders_kill.kill_holders(request_of(device_paths=devices.globs, max_targets=1, units=["vllm.service"], outside_units="fail"),
                                  Nvml(), ProcReader(), None, check_mode=False)
    assert refused.value.msg.startswith("1 process(es) hold the GPUs outside the units being stopped")
    assert [h["pid"] for h in refused.value.context["outside"]] == [pid] and refused.value.context["signals"] == []
    assert "elapsed" in refused.value.context and alive(pid)


def test_a_survivor_fails_the_run_naming_it(devices, processes, monkeypatch):
    pid = orphan(processes, "--open", devices.gpu(0), "--ignore-term")

    class Unkillable(holders_kill.Signaller):
        def _send(self, handle, signum):
            return "sent" if signum == 9 else super()._send(handle, signum)

    monkeypatch.setattr(holders_kill, "Signaller", Unkillable)
    with pytest.raises(CheckFailed) as failed:
        holders_kill.kill_holders(request_of(device_paths=devices.globs, outside_units="kill", term_timeout=0.1, kill_timeout=0.1),
                                  Nvml(), ProcReader(), None, check_mode=False)
    assert failed.value.msg.startswith(f"processes still hold the GPUs after SIGKILL and kill_timeout=0.1s: {pid} (")
    assert [s["pid"] for s in failed.value.context["survivors"]] == [pid] and failed.value.context["changed"] is True
