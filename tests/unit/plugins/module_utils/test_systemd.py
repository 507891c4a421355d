"""systemd_stop_hard's logic: names, refusals, `systemctl show`, cgroup location, the plan, and the stop loop.

The stop loop runs against real processes and real signals, with systemd replaced by FakeSystemd
(the catalogue's F12): what systemd itself does on a real node is covered by the Molecule scenarios.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, run_module

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed, InvalidInput, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import cgroup as systemd_cgroup
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import stop as systemd_stop
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemd_systemctl
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import units as systemd_units


@pytest.mark.covers('S5')
@pytest.mark.parametrize(("name", "expected"), [
    ("vllm", "vllm.service"),
    ("vllm.service", "vllm.service"),
    ("sglang@7b", "sglang@7b.service"),
    ("engine-a_1:x.scope", "engine-a_1:x.scope"),
    ("vllm.socket", "vllm.socket"),
    ("foo\\x2dbar.service", "foo\\x2dbar.service"),
])
def test_unit_names_resolve_as_systemctl_would(name, expected):
    """S5."""
    assert systemd_units.normalize_unit_name(name) == expected


@pytest.mark.covers('S3', 'S4')
@pytest.mark.parametrize(("name", "message"), [
    ("sglang*", "glob pattern"),
    ("vllm?", "glob pattern"),
    ("[v]llm", "glob pattern"),
    ("", "give a unit name"),
    ("../x", "is a path"),
    ("a/b.service", "is a path"),
    ("a..b", "is a path"),
    ("vllm\0.service", "NUL or line break"),
    ("vllm\nsshd", "NUL or line break"),
    ("x" * 300, "longer than systemd's limit of 255"),
    ("x" * 250, "longer than systemd's limit of 255"),
    ("vllm;reboot", "shell metacharacters"),
    ("vllm $(id)", "shell metacharacters"),
    ("vllm`id`", "shell metacharacters"),
    ("vllm|cat", "shell metacharacters"),
    ("foo\\bar", "shell metacharacters"),
    ("foo@.service", "template without an instance"),
    ("foo@", "template without an instance"),
    ("vllé", "non-ASCII"),
    ("--all", "starts with '-'"),
])
def test_bad_unit_names_are_rejected(name, message):
    """S3, S4."""
    with pytest.raises(InvalidInput, match=None) as error:
        systemd_units.normalize_unit_name(name)
    assert message in error.value.msg


@pytest.mark.covers('S25', 'S26')
@pytest.mark.parametrize(("unit", "allowed", "message"), [
    ("init.scope", True, "PID 1"),
    ("-.slice", True, "a slice"),
    ("system.slice", True, "a slice"),
    ("user.slice", True, "a slice"),
    ("multi-user.target", True, "not a service"),
    ("sshd.service", False, "protected"),
    ("systemd-journald.service", False, "protected"),
    ("nvidia-persistenced.service", False, "protected"),
    ("nvidia-fabricmanager.service", False, "protected"),
    ("nv-hostengine.service", False, "protected"),
    ("dcgm-exporter.service", False, "protected"),
    ("containerd.service", False, "protected"),
    ("dbus.service", False, "protected"),
])
def test_refused_units(unit, allowed, message):
    """S25, S26: slices and init.scope are refused even with allow_protected."""
    assert message in systemd_units.refusal(unit, allow_protected=allowed)


def test_protected_unit_allowed_when_asked():
    assert systemd_units.refusal("nvidia-persistenced.service", allow_protected=True) is None
    assert systemd_units.refusal("vllm.service", allow_protected=False) is None


def test_parse_show_keeps_values_with_equals_signs():
    text = "Id=vllm.service\nExecStart={ path=/usr/bin/vllm ; argv[]=/usr/bin/vllm serve --x=1 }\nJob=\n"
    parsed = systemd_units.parse_show(text)
    assert parsed["ExecStart"].endswith("--x=1 }") and parsed["Job"] == ""


@pytest.mark.covers('S8', 'S10')
def test_unit_warnings_name_unsafe_settings():
    """S8, S10: the unit's own policy would not finish the job."""
    state = systemd_units.UnitState({"Id": "minio.service", "KillMode": "none", "SendSIGKILL": "no", "TimeoutStopUSec": "infinity"})
    text = " ".join(state.warnings())
    assert "KillMode=none" in text and "SendSIGKILL=no" in text and "TimeoutStopSec=infinity" in text


@pytest.mark.covers('S27')
def test_cgroup_is_located_on_v2_hybrid_v1_and_inside_a_container(tmp_path):
    """S27 (layout part): ControlGroup is relative to systemd's root, which in a container is the container's group."""
    proc = tmp_path / "proc" / "1"
    proc.mkdir(parents=True)
    reader = ProcReader(str(tmp_path / "proc"))
    for layout in ("", "unified", "systemd"):
        (proc / "cgroup").write_text("0::/init.scope\n")
        group = tmp_path / "cg" / layout / "system.slice" / "vllm.service"
        group.mkdir(parents=True)
        (group / "cgroup.procs").write_text("")
        assert systemd_cgroup.Cgroup.locate("/system.slice/vllm.service", reader, str(tmp_path / "cg")).directory == str(group)
        (group / "cgroup.procs").unlink()
    (proc / "cgroup").write_text("0::/machine.slice/libpod-abc.scope/init.scope\n")
    nested = tmp_path / "cg" / "unified" / "machine.slice" / "libpod-abc.scope" / "system.slice" / "vllm.service"
    nested.mkdir(parents=True)
    (nested / "cgroup.procs").write_text("")
    assert systemd_cgroup.Cgroup.locate("/system.slice/vllm.service", reader, str(tmp_path / "cg")).directory == str(nested)
    assert systemd_cgroup.Cgroup.locate("/system.slice/gone.service", reader, str(tmp_path / "cg")).directory is None


class FakeCgroup(systemd_cgroup.Cgroup):
    """A control group whose members are real processes; no cgroup.kill, so the kill loop is exercised."""

    def __init__(self, unit: FakeSystemd):
        super().__init__("fake", ProcReader())
        self.unit = unit

    @property
    def has_kill_file(self) -> bool:
        return False

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.unit.members if alive(proc.pid)]

    def empty(self) -> bool:
        return not self.pids()


class FakeSystemd:
    """One unit: a main process plus others, with KillMode semantics and an optional restart after the stop."""

    def __init__(self, members: list[subprocess.Popen], kill_mode: str = "control-group", restart_after_stop: bool = False,
                 triggers: dict[str, str] | None = None, stuck_triggers: tuple[str, ...] = (), restart_sec: float = 0.0):
        self.members = members
        self.restart_sec = restart_sec  # RestartSec=: the restart comes this long after the first inactive read
        self.inactive_since: float | None = None
        self.triggers = dict(triggers or {})  # trigger unit -> ActiveState
        self.stuck_triggers = stuck_triggers  # triggers whose stop job never finishes
        self.kill_mode = kill_mode
        self.restart_after_stop = restart_after_stop
        self.calls: list[str] = []
        self.stopping = False
        self.invocation = "inv-1"
        self.restarts = 0

    def show(self, unit: str) -> systemd_units.UnitState:
        if unit in self.triggers:
            return systemd_units.UnitState({"Id": unit, "LoadState": "loaded", "ActiveState": self.triggers[unit], "Job": ""})
        self.calls.append("show")
        for proc in self.members:
            proc.poll()  # reap, as systemd reaps its children
        main_alive = alive(self.members[0].pid)
        # as systemd: with KillMode=control-group the stop job signalled every member and the unit stays deactivating
        # until the last one is gone (under load a member can outlive the main process by a moment)
        signalled_alive = any(alive(proc.pid) for proc in self.members) if self.kill_mode == "control-group" else main_alive
        if not self.stopping:
            active = "active" if main_alive else "inactive"
        elif signalled_alive:
            active = "deactivating"
        else:
            active = "inactive"
            if self.inactive_since is None:
                self.inactive_since = time.monotonic()
            if self.restart_after_stop and (self.restarts or time.monotonic() - self.inactive_since >= self.restart_sec):
                self.invocation, self.restarts, active = "inv-2", 1, "active"
        return systemd_units.UnitState({"Id": unit, "LoadState": "loaded", "ActiveState": active, "Job": "",
                                        "ControlGroup": "/system.slice/" + unit, "KillMode": self.kill_mode,
                                        "InvocationID": self.invocation, "NRestarts": str(self.restarts),
                                        "TriggeredBy": " ".join(self.triggers)})

    def stop(self, unit: str) -> None:
        if unit in self.triggers:
            self.calls.append(f"stop {unit}")
            self.triggers[unit] = "deactivating" if unit in self.stuck_triggers else "inactive"
            return
        self.calls.append("stop")
        self.stopping = True
        targets = self.members[:1] if self.kill_mode in ("process", "mixed") else self.members
        if self.kill_mode != "none":
            for proc in targets:
                if alive(proc.pid):
                    proc.send_signal(signal.SIGTERM)

    def disable(self, unit: str) -> None:
        self.calls.append("disable")


def sleeper(ignore_term: bool = False) -> subprocess.Popen:
    code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "") + "print('up', flush=True)\ntime.sleep(1e6)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


@pytest.fixture
def unit_processes():
    started: list[subprocess.Popen] = []

    def start(ignore_term: bool = False) -> subprocess.Popen:
        started.append(sleeper(ignore_term))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class RecordingSignaller(Signaller):
    """Signals for real, and writes each one into the fake systemd's call log, so that order can be asserted."""

    def __init__(self, log: list[str]):
        super().__init__()
        self.log = log

    def send(self, handle, signum: int) -> str:
        self.log.append(f"{signal.Signals(signum).name} {handle.pid}")
        return super().send(handle, signum)


def run_stop(fake: FakeSystemd, stop_timeout=5.0, kill_timeout=5.0, settle=0.0, stop_triggers=False) -> systemd_stop.StopOutcome:
    request = systemd_stop.StopRequest("engine.service", stop_timeout, kill_timeout, False, False, False, settle, stop_triggers)
    state = fake.show("engine.service")
    cgroup = FakeCgroup(fake)
    triggers = {name: fake.show(name) for name in state.triggered_by}
    plan = systemd_stop.plan_stop(request, state, cgroup, protected_pids=set(), trigger_states=triggers)
    stopper = systemd_stop.UnitStopper(fake, ProcReader(), RecordingSignaller(fake.calls), locate=lambda path, reader: cgroup)
    return stopper.run(plan, request)


@pytest.mark.covers('S6')
def test_well_behaved_unit_stops_without_escalation(unit_processes):
    """S6."""
    fake = FakeSystemd([unit_processes(), unit_processes()])
    outcome = run_stop(fake)
    assert not outcome.escalated and outcome.errors == [] and outcome.survivors == []
    assert {m["pid"] for m in outcome.terminated} == {p.pid for p in fake.members}
    # systemd's stop job did it all: one stop, and not one signal from the module
    assert fake.calls.count("stop") == 1 and [call for call in fake.calls if call.startswith("SIG")] == []


@pytest.mark.covers('S7', 'S8', 'S14')
def test_sigterm_ignorer_with_infinite_timeout_is_killed_at_our_deadline(unit_processes):
    """S7, S8, S14: stop job first, then at our deadline the whole group is SIGKILLed by the loop."""
    fake = FakeSystemd([unit_processes(ignore_term=True), unit_processes(ignore_term=True)])
    started = time.monotonic()
    outcome = run_stop(fake, stop_timeout=0.5)
    assert time.monotonic() - started < 5
    assert outcome.escalated and outcome.kill_method == "signal loop"
    assert {m["pid"] for m in outcome.killed} == {p.pid for p in fake.members}
    assert outcome.terminated == [] and outcome.survivors == [] and outcome.errors == []
    kills = [index for index, call in enumerate(fake.calls) if call.startswith("SIGKILL")]
    assert {fake.calls[index].split()[1] for index in kills} == {str(p.pid) for p in fake.members}
    assert fake.calls[0] == "show" and fake.calls.index("stop") < kills[0]  # S14: the stop job is queued before any SIGKILL


@pytest.mark.covers('S9')
def test_killmode_process_leftovers_get_sigterm_then_are_gone(unit_processes):
    """S9: the unit is inactive while its other processes live on; they are terminated, not left behind."""
    fake = FakeSystemd([unit_processes(), unit_processes(), unit_processes()], kill_mode="process")
    outcome = run_stop(fake, stop_timeout=5)
    assert not outcome.escalated
    assert {m["pid"] for m in outcome.terminated} == {p.pid for p in fake.members}
    assert all(not alive(p.pid) for p in fake.members)


@pytest.mark.covers('S10')
def test_killmode_none_leftovers_ignoring_sigterm_are_killed(unit_processes):
    """S10 with a SIGTERM-ignoring leftover."""
    main, stubborn = unit_processes(), unit_processes(ignore_term=True)
    fake = FakeSystemd([main, stubborn], kill_mode="none")
    main.terminate()
    outcome = run_stop(fake, stop_timeout=0.5)
    assert outcome.escalated and [m["pid"] for m in outcome.killed] == [stubborn.pid]


@pytest.mark.covers('S13', 'S18')
def test_restart_after_stop_is_detected(unit_processes):
    """S13/S18: a new InvocationID after our stop fails the run instead of reporting it stopped."""
    fake = FakeSystemd([unit_processes()], restart_after_stop=True)
    outcome = run_stop(fake, settle=0.1)
    assert outcome.restarted
    assert "was started again (InvocationID inv-1 -> inv-2, NRestarts 0 -> 1)" in outcome.errors[0]


@pytest.mark.covers('S13')
def test_a_restart_after_restart_sec_comes_within_the_settle_soak_and_fails_the_stop(unit_processes):
    """S13 with RestartSec>0: the unit reads inactive at first and comes back a second later, after every read of the
    stop itself. The settle soak reads it again at its end: restarted, never reported stopped."""
    fake = FakeSystemd([unit_processes()], restart_after_stop=True, restart_sec=1.0)
    outcome = run_stop(fake, settle=2.0)
    assert outcome.restarted and outcome.state_after.active_state == "active"
    assert "was started again (InvocationID inv-1 -> inv-2, NRestarts 0 -> 1)" in outcome.errors[0]


def test_plan_refuses_a_group_holding_this_run(unit_processes):
    """The plan's refusal for a given protected set (S24's end to end test is below)."""
    proc = unit_processes()
    fake = FakeSystemd([proc])
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, False, False, 0)
    with pytest.raises(Refused, match="holds this module or its ancestors"):
        systemd_stop.plan_stop(request, fake.show("engine.service"), FakeCgroup(fake), protected_pids={proc.pid})


@pytest.mark.covers('S1', 'S2', 'S31')
def test_plan_for_inactive_empty_missing_and_failed_units(unit_processes):
    """S1, S2, S31: unchanged when down and empty; a failed unit with leftovers still needs a stop."""
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, True, False, 0)
    empty = systemd_cgroup.Cgroup(None, ProcReader())
    down = systemd_units.UnitState({"Id": "engine.service", "LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "disabled"})
    assert not systemd_stop.plan_stop(request, down, empty, set()).changes
    missing = systemd_units.UnitState({"Id": "engine.service", "LoadState": "not-found", "ActiveState": "inactive"})
    plan = systemd_stop.plan_stop(request, missing, empty, set())
    assert not plan.found and not plan.changes
    with pytest.raises(Refused, match="does not exist"):
        systemd_stop.plan_stop(systemd_stop.StopRequest("engine.service", 1, 1, True, False, False, 0), missing, empty, set())
    fake = FakeSystemd([unit_processes()])
    failed = systemd_units.UnitState({"Id": "engine.service", "LoadState": "loaded", "ActiveState": "failed"})
    assert systemd_stop.plan_stop(request, failed, FakeCgroup(fake), set()).stop
    enabled = systemd_units.UnitState({"Id": "engine.service", "LoadState": "loaded", "ActiveState": "inactive", "UnitFileState": "enabled"})
    assert systemd_stop.plan_stop(request, enabled, empty, set()).disable


@pytest.mark.parametrize(("args", "message"), [
    ({"name": "sglang*"}, "glob pattern"),
    ({"name": "init.scope"}, "PID 1"),
    ({"name": "sshd"}, "protected"),
    ({"name": "vllm", "stop_timeout": -1}, "stop_timeout: must be at least 0"),
    ({"name": "vllm", "kill_timeout": "later"}, "kill_timeout"),
    ({"name": "vllm", "settle": -0.5}, "settle: must be at least 0"),
])
def test_module_rejects_bad_input_before_calling_systemctl(args, message, tmp_path):
    """Nothing executed: PATH holds no systemctl, so reaching it would fail differently."""
    result = run_module("systemd_stop_hard", args, env={"PATH": str(tmp_path)})
    assert result.failed and message in result["msg"]


@pytest.mark.covers('S34')
def test_module_without_systemctl_fails_cleanly(tmp_path):
    """S34."""
    result = run_module("systemd_stop_hard", {"name": "vllm"}, env={"PATH": str(tmp_path)})
    assert result.failed and "systemctl" in result["msg"] and "Traceback" not in result["msg"]


@pytest.mark.covers('S34')
def test_module_without_systemd_as_init_reports_systemctl_error(tmp_path):
    """S34: where PID 1 is not systemd, systemctl refuses every call; the module fails with systemctl's own words and
    never falls back to killing by name (a process named like the unit keeps running)."""
    systemctl = tmp_path / "systemctl"
    systemctl.write_text("#!/bin/sh\necho 'System has not been booted with systemd as init system (PID 1). Can'\\''t operate.' >&2\n"
                         "echo 'Failed to connect to bus: Host is down' >&2\nexit 1\n")
    systemctl.chmod(0o755)
    namesake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)", "vllm", "serve"])
    result = run_module("systemd_stop_hard", {"name": "vllm"}, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert result.failed and "System has not been booted with systemd" in result["msg"] and "Traceback" not in result["msg"]
    try:
        assert not result.result.get("killed") and namesake.poll() is None
    finally:
        namesake.kill()
        namesake.wait()


def test_triggers_are_named_in_a_warning_unless_stop_triggers(unit_processes):
    """S15, S16 (warning half): a socket or timer could start the unit again after the stop."""
    fake = FakeSystemd([unit_processes()], triggers={"engine.socket": "active", "engine.timer": "active"})
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, False, False, 0)
    plan = systemd_stop.plan_stop(request, fake.show("engine.service"), FakeCgroup(fake), set())
    assert plan.triggers == []
    assert "engine.service can still be started by engine.socket, engine.timer; set stop_triggers" in " ".join(plan.warnings)


@pytest.mark.covers('S15', 'S16')
def test_stop_triggers_stops_active_triggers_before_the_unit(unit_processes):
    """S15, S16: sockets and timers go first, so nothing can start the unit while it stops; inactive ones are left."""
    fake = FakeSystemd([unit_processes()], triggers={"engine.socket": "active", "engine.timer": "inactive"})
    outcome = run_stop(fake, stop_triggers=True)
    assert outcome.errors == [] and outcome.triggers_stopped == ["engine.socket"]
    assert fake.calls.index("stop engine.socket") < fake.calls.index("stop")
    assert "stop engine.timer" not in fake.calls and fake.triggers == {"engine.socket": "inactive", "engine.timer": "inactive"}


def test_stop_triggers_on_a_stopped_unit_is_a_change_only_while_a_trigger_is_active():
    """A unit already down whose socket still listens: stopping the socket is the change; then nothing is left to do."""
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, False, False, 0, True)
    down = systemd_units.UnitState({"Id": "engine.service", "LoadState": "loaded", "ActiveState": "inactive", "TriggeredBy": "engine.socket"})
    empty = systemd_cgroup.Cgroup(None, ProcReader())
    listening = {"engine.socket": systemd_units.UnitState({"Id": "engine.socket", "ActiveState": "active"})}
    stopped = {"engine.socket": systemd_units.UnitState({"Id": "engine.socket", "ActiveState": "inactive"})}
    assert systemd_stop.plan_stop(request, down, empty, set(), listening).changes
    assert not systemd_stop.plan_stop(request, down, empty, set(), stopped).changes


@pytest.mark.parametrize("trigger", ["ssh.socket", "dbus.socket", "systemd-journald.socket"])
def test_an_active_protected_trigger_is_refused_an_inactive_one_is_no_concern(trigger):
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, False, False, 0, True)
    state = systemd_units.UnitState({"Id": "engine.service", "LoadState": "loaded", "ActiveState": "active", "TriggeredBy": trigger})
    active = {trigger: systemd_units.UnitState({"Id": trigger, "ActiveState": "active"})}
    with pytest.raises(Refused, match=f"triggered by {trigger}, which cannot be stopped"):
        systemd_stop.plan_stop(request, state, systemd_cgroup.Cgroup(None, ProcReader()), set(), active)
    inactive = {trigger: systemd_units.UnitState({"Id": trigger, "ActiveState": "inactive"})}
    assert systemd_stop.plan_stop(request, state, systemd_cgroup.Cgroup(None, ProcReader()), set(), inactive).triggers == []


@pytest.mark.covers('S35')
def test_systemctl_is_read_in_the_c_locale_whatever_the_callers_language(tmp_path):
    """S35: a systemctl that answers in German unless LC_ALL=C; the module must read the C answer."""
    fake = tmp_path / "systemctl"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$LC_ALL" = C ]; then state=inactive; load=not-found; else state=inaktiv; load=nicht-gefunden; fi\n'
        'printf "Id=vllm.service\\nLoadState=%s\\nActiveState=%s\\nSubState=dead\\n" "$load" "$state"\n'
    )
    fake.chmod(0o755)
    german = {"LANG": "de_DE.UTF-8", "LC_ALL": "de_DE.UTF-8", "LC_MESSAGES": "de_DE.UTF-8"}
    result = run_module("systemd_stop_hard", {"name": "vllm"}, env={"PATH": f"{tmp_path}:/usr/bin:/bin", **german})
    assert not result.failed, result["msg"]
    assert result["found"] is False and result["changed"] is False
    assert result["state_after"]["ActiveState"] == "inactive"


def test_a_trigger_that_does_not_stop_fails_the_run_before_the_unit_is_touched(unit_processes):
    """The unit is left running rather than stopped while something can still start it again."""
    main = unit_processes()
    fake = FakeSystemd([main], triggers={"engine.socket": "active"}, stuck_triggers=("engine.socket",))
    outcome = run_stop(fake, stop_timeout=0.3, stop_triggers=True)
    assert outcome.errors == ["trigger engine.socket is still deactivating after stop_timeout=0.3s"]
    assert outcome.triggers_stopped == [] and "stop" not in fake.calls and alive(main.pid)


class ListedUnits:
    """systemctl for stop_units: one unit already down and empty, one whose systemctl call fails."""

    def __init__(self):
        self.shown: list[str] = []

    def show(self, unit: str) -> systemd_units.UnitState:
        self.shown.append(unit)
        if unit == "broken.service":
            raise CommandFailed("systemctl show broken.service failed (rc 1): Access denied")
        return systemd_units.UnitState({"Id": unit, "LoadState": "loaded", "ActiveState": "inactive", "Job": "", "ControlGroup": ""})


def test_a_list_of_units_is_stopped_in_order_and_one_failure_does_not_keep_the_next_running():
    """systemd_stop_hard names: each unit's own result, in order; the failed one named, the one after it still handled."""
    requests = [systemd_stop.stop_request({"name": name, "stop_timeout": 1, "kill_timeout": 1, "must_exist": False, "disable": False,
                                           "allow_protected": False, "settle": 0, "stop_triggers": False}) for name in ("vllm", "broken", "sglang")]
    fake = ListedUnits()
    results, failures = systemd_stop.stop_units(requests, fake, ProcReader(), check_mode=False)
    assert fake.shown == ["vllm.service", "broken.service", "sglang.service"]
    assert [result["unit"] for result in results] == ["vllm.service", "broken.service", "sglang.service"]
    assert not results[0]["changed"] and results[2]["found"] and not results[2].get("failed")
    assert results[1]["failed"] and failures == [results[1]["msg"]] and "Access denied" in failures[0]


@pytest.mark.parametrize(("args", "message"), [
    ({"names": ["vllm", "sglang*"]}, "glob pattern"),
    ({"names": ["vllm", "sshd"]}, "protected"),
    ({"name": "vllm", "names": ["sglang"]}, "mutually exclusive"),
    ({}, "one of the following is required"),
])
def test_module_checks_every_name_before_stopping_any(args, message, tmp_path):
    """A bad name anywhere in the list refuses the run before systemctl is called for the first one."""
    result = run_module("systemd_stop_hard", args, env={"PATH": str(tmp_path)})
    assert result.failed and message in result["msg"]


def test_set_boot_changes_only_units_not_as_they_should_be_and_reloads_once():
    """engine_cutover's boot step: the serving unit enabled, the others disabled, the rest left alone."""
    calls = []
    states = {"vllm.service": "enabled", "sglang.service": "disabled", "extra.service": "disabled"}

    def run_command(argv, environ_update=None):
        calls.append(argv[1:])
        if argv[1] == "is-enabled":
            state = states[argv[-1]]
            return (0 if state == "enabled" else 1), f"{state}\n", ""
        return 0, "", ""

    systemctl = systemd_systemctl.Systemctl(run_command, "systemctl")
    result = systemctl.set_boot("sglang.service", list(states))
    assert result == {"enabled": ["sglang.service"], "disabled": ["vllm.service"], "at_boot": "sglang.service"}
    changes = [call for call in calls if call[0] != "is-enabled"]
    assert changes == [["enable", "--no-reload", "--", "sglang.service"], ["disable", "--no-reload", "--", "vllm.service"], ["daemon-reload"]]

    calls.clear()
    states.update({"vllm.service": "disabled", "sglang.service": "enabled"})
    assert systemctl.set_boot("sglang.service", list(states)) == {"enabled": [], "disabled": [], "at_boot": "sglang.service"}
    assert all(call[0] == "is-enabled" for call in calls), "nothing to change: no enable, no disable, no reload"


def test_set_boot_reads_a_missing_unit_as_not_found_and_names_other_failures():
    def run_command(argv, environ_update=None):
        if argv[-1] == "gone.service":
            return 1, "", "Failed to get unit file state for gone.service: No such file or directory\n"
        return 1, "", "Failed to connect to bus: No such file or directory\n" if argv[-1] == "x" else "Access denied\n"

    systemctl = systemd_systemctl.Systemctl(run_command, "systemctl")
    assert systemctl.unit_file_state("gone.service") == "not-found"
    with pytest.raises(CommandFailed, match="Access denied"):
        systemctl.unit_file_state("y.service")


def cgroup_dir(tmp_path, events: str | None, procs: list[int]) -> systemd_cgroup.Cgroup:
    """A control group's files as the kernel shows them: cgroup.events on v2 only."""
    directory = tmp_path / f"engine-{len(list(tmp_path.iterdir()))}.service"
    directory.mkdir()
    (directory / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
    if events is not None:
        (directory / "cgroup.events").write_text(f"populated {events}\nfrozen 0\n")
    return systemd_cgroup.Cgroup(str(directory), ProcReader())


@pytest.mark.covers('S9')
def test_a_group_the_kernel_calls_populated_is_not_empty_even_when_it_lists_no_process(tmp_path, unit_processes):
    """Rule 4: cgroup.events is the kernel's word. 'populated 1' with an empty cgroup.procs (a process of another PID
    namespace, or one leaving) is not empty and is named as unlisted; 'populated 0' is empty; v1 (no events file)
    goes by the listed processes."""
    assert not cgroup_dir(tmp_path, "1", []).empty() and cgroup_dir(tmp_path, "1", []).unlisted()
    assert cgroup_dir(tmp_path, "0", []).empty() and not cgroup_dir(tmp_path, "0", []).unlisted()
    member = unit_processes()
    assert not cgroup_dir(tmp_path, "1", [member.pid]).empty() and not cgroup_dir(tmp_path, "1", [member.pid]).unlisted()
    assert not cgroup_dir(tmp_path, None, [member.pid]).empty()
    assert cgroup_dir(tmp_path, None, []).empty()


def test_a_stop_that_leaves_a_populated_group_with_no_process_listed_fails_naming_the_group(tmp_path, unit_processes):
    """Rule 4 in the stop: the unit's one process exits on SIGTERM, but its group still says 'populated 1' with nothing
    listed: the stop fails naming the group's path, instead of reporting an empty group."""
    fake = FakeSystemd([unit_processes()])
    ghost = cgroup_dir(tmp_path, "1", [])
    request = systemd_stop.StopRequest("engine.service", 0.3, 0.3, False, False, False, 0.0, False)
    state = fake.show("engine.service")
    plan = systemd_stop.plan_stop(request, state, FakeCgroup(fake), protected_pids=set(), trigger_states={})
    outcome = systemd_stop.UnitStopper(fake, ProcReader(), RecordingSignaller(fake.calls), locate=lambda path, reader: ghost).run(plan, request)
    assert outcome.survivors == [] and not alive(fake.members[0].pid)
    assert any(f"its control group {ghost.directory} is still populated (cgroup.events: populated 1)" in error for error in outcome.errors)


@pytest.mark.covers('S7')
def test_the_escalation_journals_each_sigkill_before_it_is_sent(tmp_path, unit_processes):
    """Rule 12 for systemd_stop_hard: SIGTERM ignorers are SIGKILLed at the deadline, and the node's journal holds an
    intent line for each before its outcome, with exe, cgroup, uid and the run id."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal, read

    fake = FakeSystemd([unit_processes(ignore_term=True), unit_processes(ignore_term=True)])
    path = tmp_path / "journal" / "signals.jsonl"
    journal = Journal(str(path), "run-7", "systemd_stop_hard")
    request = systemd_stop.StopRequest("engine.service", 0.3, 5.0, False, False, False, 0.0, False)
    state = fake.show("engine.service")
    cgroup = FakeCgroup(fake)
    plan = systemd_stop.plan_stop(request, state, cgroup, protected_pids=set(), trigger_states={})
    signaller = Signaller(ProcReader(), journal=journal)
    outcome = systemd_stop.UnitStopper(fake, ProcReader(), signaller, locate=lambda path, reader: cgroup).run(plan, request)
    assert outcome.escalated and outcome.survivors == []
    lines = read(str(path), "run-7")
    pids = {proc.pid for proc in fake.members}
    for pid in pids:
        mine = [(line["phase"], line["signal"]) for line in lines if line["pid"] == pid]
        assert mine == [("intent", "SIGKILL"), ("outcome", "SIGKILL")], mine
    assert all(line["exe"] == os.path.realpath(sys.executable) and line["uid"] == os.getuid() and line["cgroup"] for line in lines)
    assert {entry["pid"] for entry in journal.entries} == pids and all(entry["result"] == "sent" for entry in journal.entries)


class OwnLineage:
    """This test process as a unit's member: it stands for the module that would stop the unit running it."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None

    def send_signal(self, signum):
        raise AssertionError(f"signal {signum} sent to this run's own process")


@pytest.mark.covers('S24')
def test_a_unit_whose_group_holds_this_run_is_refused_by_stop_unit_itself(monkeypatch):
    """S24: the unit's group holds the process running the module (ansible-pull as a service, an SSH session in
    ssh.service): stop_unit works out its own lineage (pid and ancestors) from /proc - nothing passed in - and refuses
    before any stop job or signal. The stand-ins raise if anything reaches them."""
    fake = FakeSystemd([OwnLineage(os.getpid())], kill_mode="none")
    monkeypatch.setattr(systemd_cgroup.Cgroup, "locate", classmethod(lambda cls, path, reader, fs_root="/sys/fs/cgroup": FakeCgroup(fake)))
    monkeypatch.setattr(Signaller, "send", lambda self, handle, signum: pytest.fail(f"signal {signum} sent"))
    request = systemd_stop.StopRequest("engine.service", 1, 1, False, False, False, 0)
    with pytest.raises(Refused, match="holds this module or its ancestors"):
        systemd_stop.stop_unit(request, fake, ProcReader(), check_mode=False)
    assert "stop" not in fake.calls, "no stop job was queued"

    parent = FakeSystemd([OwnLineage(os.getppid())], kill_mode="none")
    monkeypatch.setattr(systemd_cgroup.Cgroup, "locate", classmethod(lambda cls, path, reader, fs_root="/sys/fs/cgroup": FakeCgroup(parent)))
    with pytest.raises(Refused, match="holds this module or its ancestors"):
        systemd_stop.stop_unit(request, parent, ProcReader(), check_mode=True)
    assert "stop" not in parent.calls


@pytest.mark.covers('S21')
def test_a_stopped_leftover_gets_sigcont_after_sigterm_and_ends_without_sigkill(unit_processes):
    """S21 (F6): KillMode=process leaves a SIGSTOPped process behind; the module's SIGTERM is followed by SIGCONT for it,
    so it ends within the TERM grace, never needing SIGKILL. Without the SIGCONT its SIGTERM stays pending and only the
    escalation's SIGKILL ends it."""
    main, stopped = unit_processes(), unit_processes()
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while ProcReader().stat(stopped.pid).state != "T":
        assert time.monotonic() < deadline, "the leftover never stopped"
        time.sleep(0.01)
    fake = FakeSystemd([main, stopped], kill_mode="process")
    outcome = run_stop(fake, stop_timeout=5, kill_timeout=5)
    sent = [call for call in fake.calls if call.startswith("SIG") and call.endswith(f" {stopped.pid}")]
    assert sent[:2] == [f"SIGTERM {stopped.pid}", f"SIGCONT {stopped.pid}"] and f"SIGKILL {stopped.pid}" not in sent, fake.calls
    assert stopped.pid in {member["pid"] for member in outcome.terminated} and not outcome.escalated and outcome.survivors == []


@pytest.mark.covers('S19')
@pytest.mark.timeout(60)
def test_an_unkillable_process_in_the_unit_fails_the_stop_at_its_deadline(unit_processes, frozen):
    """S19 (F4): a process of the unit frozen in D state with SIGKILL pending. The stop escalates, waits for it no longer
    than kill_timeout, and reports it as a survivor with state D, SigPnd and wchan - within the run's budget (the stop
    timeout, the kill timeout and a margin for the reads), not after a harness timeout."""
    main, wedged = unit_processes(ignore_term=True), unit_processes(ignore_term=True)
    frozen.freeze(wedged.pid)
    fake = FakeSystemd([main, wedged])
    started = time.monotonic()
    outcome = run_stop(fake, stop_timeout=0.5, kill_timeout=1)
    elapsed = time.monotonic() - started
    assert elapsed < 0.5 + 1 + 4, f"the stop took {elapsed:.1f}s of a 1.5s budget"
    assert outcome.escalated and [survivor["pid"] for survivor in outcome.survivors] == [wedged.pid]
    (survivor,) = outcome.survivors
    assert survivor["state"] == "D" and "SIGKILL" in survivor["signals_pending"] and survivor["wchan"]
    killed = {member["pid"] for member in outcome.killed}
    assert main.pid in killed and wedged.pid not in killed, "a frozen process is a survivor, never also killed"


@pytest.mark.covers('S40')
def test_a_second_stop_of_the_same_unit_waits_on_its_lock_and_another_unit_does_not(tmp_path, monkeypatch):
    """S40: the host lock is named by the unit. While another run holds engine.service's lock, a stop of it waits for the
    lock (and, given no more time than the lock is held, fails naming the holder); a stop of another unit goes on at once."""
    import fcntl

    from ansible_collections.gpufleet.serving.plugins.module_utils import _locking
    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import LockTimeout

    monkeypatch.setattr(_locking, "LOCK_DIRECTORY", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    fake = FakeSystemd([gone])  # nothing runs: a run changes nothing once it has the lock
    holder = os.open(_locking.lock_path("systemd_stop_hard.engine.service"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        other = systemd_stop.stop_unit(systemd_stop.StopRequest("other.service", 0.3, 0.3, False, False, False, 0.0, False), fake, ProcReader(), False)
        assert other["changed"] is False
        started = time.monotonic()
        with pytest.raises(LockTimeout, match="another run holds .*systemd_stop_hard.engine.service.lock"):
            systemd_stop.stop_unit(systemd_stop.StopRequest("engine.service", 0.3, 0.3, False, False, False, 0.0, False), fake, ProcReader(), False)
        assert time.monotonic() - started >= 0.6, "it waited for the lock, for as long as a run may take"
    finally:
        os.close(holder)
    assert systemd_stop.stop_unit(systemd_stop.StopRequest("engine.service", 0.3, 0.3, False, False, False, 0.0, False), fake, ProcReader(),
                                  False)["changed"] is False
