"""systemd_stop_hard's plan and its edges (_systemd/stop.py): what a unit's state makes it do, what it warns of, how
long a second run waits - the cases its mutants showed untested. Units are read as `systemctl show` prints them."""

from __future__ import annotations

import pytest
import test_systemd
from conftest import alive
from test_systemd import FakeSystemd, RecordingSignaller, run_stop

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import cgroup as systemd_cgroup
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import stop as systemd_stop
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import UnitState, parse_show

unit_processes = test_systemd.unit_processes  # the fixture: real processes, killed after the test
EMPTY = systemd_cgroup.Cgroup(None, ProcReader())


def shown(text: str) -> UnitState:
    """A unit as `systemctl show` prints it: parsed, as the module reads it (never Python literals)."""
    return UnitState(parse_show("Id=engine.service\nLoadState=loaded\n" + text))


def request(disable=False, stop_triggers=False, stop_timeout=7.0, kill_timeout=3.0, settle=0.5) -> systemd_stop.StopRequest:
    return systemd_stop.StopRequest("engine.service", stop_timeout, kill_timeout, False, disable, False, settle, stop_triggers)


def test_a_second_run_waits_for_the_longest_a_first_one_can_take():
    """The host lock's wait: the stop job's bound (twice with triggers, stopped first), the kill's, the settle soak."""
    assert systemd_stop.longest_run(request()) == 7.0 + 3.0 + 0.5
    assert systemd_stop.longest_run(request(stop_triggers=True)) == 2 * 7.0 + 3.0 + 0.5


@pytest.mark.parametrize(("stop", "disable", "triggers", "changes"), [
    (True, False, [], True), (False, True, [], True), (False, False, ["engine.socket"], True), (False, False, [], False)])
def test_a_plan_changes_something_when_any_one_of_its_steps_is_due(stop, disable, triggers, changes):
    plan = systemd_stop.StopPlan("engine.service", True, shown("ActiveState=active\n"), [], stop=stop, disable=disable, triggers=triggers)
    assert plan.changes is changes


@pytest.mark.parametrize(("text", "why"), [
    ("ActiveState=active\nJob=\n", "active, its group listing nothing (RemainAfterExit=, a group of another namespace)"),
    ("ActiveState=inactive\nJob=42\n", "inactive with a start job queued"),
])
def test_a_unit_not_down_for_good_needs_a_stop_even_with_an_empty_group(text, why):
    assert systemd_stop.plan_stop(request(), shown(text), EMPTY, set()).stop, why


def test_a_stopped_unit_needs_nothing_and_an_enabled_one_only_its_disable():
    down = shown("ActiveState=inactive\nJob=\nUnitFileState=enabled\n")
    plan = systemd_stop.plan_stop(request(disable=True), down, EMPTY, set())
    assert not plan.stop and plan.disable, "UnitFileState read from systemctl's output, compared by value"
    assert not systemd_stop.plan_stop(request(disable=False), down, EMPTY, set()).changes


def test_unsafe_settings_are_warned_of_only_when_the_unit_is_to_be_stopped():
    unsafe = "TimeoutStopSec=infinity\nSendSIGKILL=no\nTriggeredBy=engine.socket\n"
    running = systemd_stop.plan_stop(request(), shown("ActiveState=active\n" + unsafe), EMPTY, set())
    assert any("SendSIGKILL" in warning for warning in running.warnings)
    assert any("can still be started by engine.socket; set stop_triggers" in warning for warning in running.warnings)
    assert systemd_stop.plan_stop(request(), shown("ActiveState=inactive\n" + unsafe), EMPTY, set()).warnings == []
    plain = systemd_stop.plan_stop(request(), shown("ActiveState=active\n"), EMPTY, set())
    assert not any("can still be started" in warning for warning in plain.warnings), "no triggers, nothing to name"
    asked = systemd_stop.plan_stop(request(stop_triggers=True), shown("ActiveState=active\n" + unsafe), EMPTY, set(),
                                   {"engine.socket": shown("ActiveState=active\n")})
    assert not any("can still be started" in warning for warning in asked.warnings), "stop_triggers: they are stopped first"


def test_every_active_trigger_is_stopped_whichever_comes_first():
    states = {"engine.timer": shown("ActiveState=inactive\nJob=\n"), "engine.socket": shown("ActiveState=active\nJob=\n"),
              "engine.path": shown("ActiveState=inactive\nJob=\n"), "engine-b.socket": shown("ActiveState=active\nJob=\n")}
    plan = systemd_stop.plan_stop(request(stop_triggers=True), shown("ActiveState=active\nTriggeredBy=engine.timer engine.socket\n"),
                                  EMPTY, set(), states)
    assert plan.triggers == ["engine.socket", "engine-b.socket"]


class VirtualClock(Clock):
    """Time that moves only when the code under test sleeps: how long a wait lasted, counted exactly."""

    def __init__(self):
        self.now = 0.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def stop_triggers_with(fake: FakeSystemd, clock: VirtualClock) -> systemd_stop.StopOutcome:
    outcome = systemd_stop.StopOutcome(state_after=fake.show("engine.service"))
    stopper = systemd_stop.UnitStopper(fake, ProcReader(), RecordingSignaller(fake.calls), clock=clock)
    stopper._stop_triggers(list(fake.triggers), request(stop_triggers=True, stop_timeout=4.0), outcome)
    return outcome


def test_a_trigger_that_stops_at_once_is_not_waited_for_and_a_stuck_one_to_the_stop_timeout(unit_processes):
    clock = VirtualClock()
    stopped = stop_triggers_with(FakeSystemd([unit_processes()], triggers={"engine.socket": "active"}), clock)
    assert stopped.triggers_stopped == ["engine.socket"] and stopped.errors == [] and clock.slept == 0.0
    clock = VirtualClock()
    stuck = stop_triggers_with(FakeSystemd([unit_processes()], triggers={"engine.socket": "active"}, stuck_triggers=("engine.socket",)), clock)
    assert stuck.errors == ["trigger engine.socket is still deactivating after stop_timeout=4s"]
    assert clock.slept == pytest.approx(4.0), "a trigger still deactivating is waited for to the bound"


def test_the_unit_is_disabled_only_when_asked(unit_processes):
    fake = FakeSystemd([unit_processes()])
    outcome = run_stop(fake)
    assert "disable" not in fake.calls and outcome.restarted is False and outcome.errors == []


def test_a_leftover_is_told_to_terminate_once_then_killed_at_the_deadline(unit_processes):
    """KillMode=none: the unit is down, a leftover ignores SIGTERM. It gets one SIGTERM (and SIGCONT) - not one per
    poll - and the group's SIGKILL when stop_timeout ends."""
    main, stubborn = unit_processes(), unit_processes(ignore_term=True)
    fake = FakeSystemd([main, stubborn], kill_mode="none")
    main.terminate()
    outcome = run_stop(fake, stop_timeout=1.0)
    sent = [call for call in fake.calls if call.endswith(f" {stubborn.pid}")]
    assert sent == ["SIGTERM " + str(stubborn.pid), "SIGCONT " + str(stubborn.pid), "SIGKILL " + str(stubborn.pid)]
    assert outcome.escalated and [m["pid"] for m in outcome.killed] == [stubborn.pid]


def test_a_restart_is_told_by_any_new_invocation_whichever_way_its_id_sorts(unit_processes):
    fake = FakeSystemd([unit_processes()], restart_after_stop=True)
    fake.invocation = "inv-9"  # systemd's InvocationIDs are random: the new one ("inv-2") may sort before the old
    outcome = run_stop(fake)
    assert outcome.restarted and "InvocationID inv-9 -> inv-2" in outcome.errors[0]
    assert "NRestarts 0 -> 1): a trigger (none), a dependency or another client started it" in outcome.errors[0]


class UnreadableReader(ProcReader):
    def stat(self, pid):
        raise PermissionError(13, "Permission denied")


def test_a_survivor_that_cannot_be_described_is_still_named_by_its_pid(unit_processes):
    """Gone meanwhile, or unreadable (hidepid, an LSM): the report still names it; the run does not crash."""
    gone = unit_processes()
    gone.kill()
    gone.wait()
    stopper = systemd_stop.UnitStopper(None, ProcReader(), None)
    assert stopper._describe(gone.pid) == {"pid": gone.pid}
    hidden = unit_processes()
    assert systemd_stop.UnitStopper(None, UnreadableReader(), None)._describe(hidden.pid) == {"pid": hidden.pid}


@pytest.fixture
def stop_unit(monkeypatch, tmp_path):
    """stop_unit as the module calls it, the unit's group being the fake's real processes, its host lock in tmp_path."""
    monkeypatch.setattr(systemd_stop, "lock_path", lambda name: str(tmp_path / f"{name}.lock"))

    def run(fake: FakeSystemd, check_mode: bool, clock: Clock | None = None, warnings: list | None = None, **options) -> dict:
        monkeypatch.setattr(systemd_cgroup.Cgroup, "locate",
                            classmethod(lambda cls, path, reader, fs_root="/sys/fs/cgroup": test_systemd.FakeCgroup(fake)))
        chosen = request(**(dict(stop_timeout=5.0, kill_timeout=5.0, settle=0.0) | options))
        return systemd_stop.stop_unit(chosen, fake, ProcReader(), check_mode, warn=(warnings if warnings is not None else []).append, clock=clock)
    return run


class EnabledUnit(FakeSystemd):
    """Enabled at boot until disabled."""

    def show(self, unit: str):
        state = super().show(unit)
        if unit in self.triggers:
            return state
        return UnitState(dict(state.properties, UnitFileState="disabled" if "disable" in self.calls else "enabled"))


def test_check_mode_plans_the_stop_and_changes_nothing_the_real_run_stops_and_disables(unit_processes, stop_unit):
    fake = EnabledUnit([unit_processes(), unit_processes()], triggers={"engine.socket": "active"})
    warned: list[str] = []
    planned = stop_unit(fake, check_mode=True, warnings=warned, disable=True)
    assert planned["changed"] and not planned["disabled"] and planned["triggers_stopped"] == []
    assert not any(call in ("stop", "disable") for call in fake.calls) and all(alive(proc.pid) for proc in fake.members)
    assert any("can still be started by engine.socket" in warning for warning in warned), "the plan's warnings reach the module"
    assert stop_unit(fake, check_mode=True, stop_triggers=True)["triggers_stopped"] == ["engine.socket"], "what the run would stop"
    assert fake.triggers == {"engine.socket": "active"}

    done = stop_unit(fake, check_mode=False, disable=True, stop_triggers=True)
    assert done["changed"] and done["disabled"] and done["triggers_stopped"] == ["engine.socket"]
    assert fake.calls.index("stop engine.socket") < fake.calls.index("stop") < fake.calls.index("disable")
    assert not any(alive(proc.pid) for proc in fake.members)


def test_the_result_says_how_long_the_stop_took_on_its_clock(unit_processes, stop_unit):
    clock = VirtualClock()
    clock.now = 1.0
    result = stop_unit(FakeSystemd([unit_processes()]), check_mode=False, clock=clock, settle=1.5)
    assert result["elapsed"] == pytest.approx(clock.now - 1.0) and result["elapsed"] >= 1.5


class ComesBackUnit(FakeSystemd):
    """Down at the stop's end, active again after the settle soak - and no InvocationID or NRestarts moved."""

    def __init__(self, members):
        super().__init__(members)
        self.inactive_reads = 0

    def show(self, unit: str):
        state = super().show(unit)
        if state.inactive:
            self.inactive_reads += 1
            if self.inactive_reads > 1:
                return UnitState(dict(state.properties, ActiveState="active"))
        return state


def test_a_unit_active_again_after_the_soak_fails_the_stop_even_when_no_restart_mark_moved(unit_processes, stop_unit):
    with pytest.raises(systemd_stop.CheckFailed, match="engine.service is active again after the stop"):
        stop_unit(ComesBackUnit([unit_processes()]), check_mode=False, clock=VirtualClock(), settle=1.0)


def test_the_group_is_the_one_systemd_names_now_or_the_plans_when_it_names_none():
    """A unit restarted meanwhile may sit in a group of its own (a new path); once stopped, systemd names none."""
    located = []
    stopper = systemd_stop.UnitStopper(None, ProcReader(), None, locate=lambda path, reader: located.append(path) or EMPTY)
    stopper.cgroup(shown("ActiveState=active\nControlGroup=/system.slice/engine.service/payload\n"), "/system.slice/engine.service")
    stopper.cgroup(shown("ActiveState=inactive\nControlGroup=\n"), "/system.slice/engine.service")
    assert located == ["/system.slice/engine.service/payload", "/system.slice/engine.service"]
