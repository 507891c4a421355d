# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A unit's stop that always ends. The stop is a real stop job (only a stop job suppresses Restart=), queued without
blocking and watched against our own monotonic deadline, so units with TimeoutStopSec=infinity or SendSIGKILL=no
cannot hang the task. At the deadline every process of the unit's control group is SIGKILLed (cgroup.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, Error, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock, lock_path
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcessIdentity, ProcReader, describe
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, survivor_report
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.cgroup import Cgroup
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import UnitState, normalize_unit_name, refusal
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative


@dataclass(frozen=True)
class StopRequest:
    unit: str
    stop_timeout: float
    kill_timeout: float
    must_exist: bool
    disable: bool
    allow_protected: bool
    settle: float
    stop_triggers: bool = False


@dataclass
class StopPlan:
    unit: str
    found: bool
    state: UnitState
    members: list[dict]
    stop: bool
    disable: bool
    warnings: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)  # active triggers to stop first

    @property
    def changes(self) -> bool:
        return self.stop or self.disable or bool(self.triggers)


def longest_run(request: StopRequest) -> float:
    """Seconds a run may take: how long a second run on the same unit waits for the host lock."""
    return request.stop_timeout * (2 if request.stop_triggers else 1) + request.kill_timeout + request.settle


def plan_stop(request: StopRequest, state: UnitState, cgroup: Cgroup, protected_pids: set[int],
              trigger_states: dict[str, UnitState] | None = None) -> StopPlan:
    """What must happen to reach 'inactive, empty and (optionally) disabled'; refuses what must never happen.

    trigger_states: the units in TriggeredBy=, read when stop_triggers is asked for.
    """
    if not state.found:
        if request.must_exist:
            raise Refused(f"{request.unit} does not exist (LoadState={state.properties.get('LoadState')}) and must_exist is true")
        return StopPlan(request.unit, False, state, [], stop=False, disable=False)
    members = cgroup.members()
    ours = sorted({member["pid"] for member in members} & protected_pids)
    if ours:
        raise Refused(f"{request.unit}'s control group holds this module or its ancestors (pids {', '.join(map(str, ours))}); "
                      "stopping it would kill the run itself", pids=ours)
    needs_stop = not state.inactive or state.job_pending or bool(members)
    needs_disable = request.disable and state.properties.get("UnitFileState") == "enabled"
    warnings = state.warnings() if needs_stop else []
    triggers = _triggers_to_stop(request, trigger_states or {}) if request.stop_triggers else []
    if state.triggered_by and needs_stop and not request.stop_triggers:
        warnings.append(f"{request.unit} can still be started by {', '.join(state.triggered_by)}; "
                        "set stop_triggers to stop them first")
    return StopPlan(request.unit, True, state, members, stop=needs_stop, disable=needs_disable, warnings=warnings,
                    triggers=triggers)


def _triggers_to_stop(request: StopRequest, trigger_states: dict[str, UnitState]) -> list[str]:
    """The active triggers; one that is protected refuses the whole run."""
    triggers = []
    for trigger, trigger_state in trigger_states.items():
        if trigger_state.inactive and not trigger_state.job_pending:
            continue
        reason = refusal(trigger, request.allow_protected)
        if reason:
            raise Refused(f"{request.unit} is triggered by {trigger}, which cannot be stopped: {reason}", unit=request.unit)
        triggers.append(trigger)
    return triggers


@dataclass
class StopOutcome:
    state_after: UnitState
    escalated: bool = False
    kill_method: str | None = None
    terminated: list[dict] = field(default_factory=list)
    killed: list[dict] = field(default_factory=list)
    survivors: list[dict] = field(default_factory=list)
    restarted: bool = False
    errors: list[str] = field(default_factory=list)
    triggers_stopped: list[str] = field(default_factory=list)


class UnitStopper:
    """Runs a StopPlan: stop job, leftovers, deadline, SIGKILL of the group, verification."""

    POLL_SECONDS = 0.1

    def __init__(self, systemctl: Systemctl, reader: ProcReader, signaller: Signaller, clock: Clock | None = None,
                 locate=Cgroup.locate):
        self.systemctl = systemctl
        self.reader = reader
        self.signaller = signaller
        self.clock = clock or Clock()
        self.locate = locate

    def cgroup(self, state: UnitState, fallback: str) -> Cgroup:
        return self.locate(state.control_group or fallback, self.reader)

    def run(self, plan: StopPlan, request: StopRequest) -> StopOutcome:
        outcome = StopOutcome(state_after=plan.state)
        if plan.triggers:
            self._stop_triggers(plan.triggers, request, outcome)
            if outcome.errors:
                return outcome
        if plan.stop:
            self._stop(plan, request, outcome)
        if plan.disable:
            self.systemctl.disable(plan.unit)
            outcome.state_after = self.systemctl.show(plan.unit)
        return outcome

    def _stop_triggers(self, triggers: list[str], request: StopRequest, outcome: StopOutcome) -> None:
        """First the sockets, timers and paths, so that nothing can start the unit while it is being stopped."""
        deadline = Deadline(request.stop_timeout, self.clock)
        for trigger in triggers:
            self.systemctl.stop(trigger)
        for trigger in triggers:
            state = self._wait(trigger, lambda s: s.inactive and not s.job_pending, deadline)
            if state.inactive and not state.job_pending:
                outcome.triggers_stopped.append(trigger)
            else:
                outcome.errors.append(f"trigger {trigger} is still {state.active_state} after stop_timeout={request.stop_timeout:g}s")

    def _stop(self, plan: StopPlan, request: StopRequest, outcome: StopOutcome) -> None:
        group_path = plan.state.control_group
        initial = {(m["pid"], m["start_time"]): m for m in plan.members}
        state = self._stop_gracefully(plan, request, group_path)
        if self._restarted(state, plan.state.restart_marks):
            self._report_restart(plan.unit, state, plan.state.restart_marks, outcome)
            outcome.state_after = state
            return
        if not self._settled(state, group_path):
            outcome.escalated = True
            group = self.cgroup(state, group_path)
            at_kill = {(m["pid"], m["start_time"]): m for m in group.members()}
            deadline = Deadline(request.kill_timeout, self.clock)
            outcome.kill_method = group.kill_all(self.signaller, deadline)
            state = self._wait(plan.unit, lambda s: self._settled(s, group_path), deadline)
            outcome.killed = [m for key, m in at_kill.items() if not self._alive(key)]
            initial.update({key: m for key, m in at_kill.items() if key not in initial})
        killed_keys = {(m["pid"], m["start_time"]) for m in outcome.killed}
        outcome.terminated = [m for key, m in initial.items() if key not in killed_keys and not self._alive(key)]
        final_group = self.cgroup(state, group_path)
        outcome.survivors = [survivor_report(self.reader, ProcessIdentity(pid, self.reader.start_time(pid) or 0), self._describe(pid))
                             for pid in final_group.pids()]
        if not outcome.survivors and final_group.unlisted():
            outcome.errors.append(f"{plan.unit}: its control group {final_group.directory} is still populated (cgroup.events: populated 1) "
                                  "but lists no process this module can see (a process of another PID namespace?): not empty")
        if not state.inactive:
            outcome.errors.append(f"{plan.unit} is {state.active_state} after the stop")
        outcome.state_after = self._check_restart(plan.unit, state, plan.state.restart_marks, request, outcome)

    def _stop_gracefully(self, plan: StopPlan, request: StopRequest, group_path: str) -> UnitState:
        """Queue the stop job, then wait; leftovers of KillMode=process/none get SIGTERM+SIGCONT once the unit is down."""
        self.systemctl.stop(plan.unit)
        deadline = Deadline(request.stop_timeout, self.clock)
        told_leftovers = False
        while True:
            state = self.systemctl.show(plan.unit)
            if self._settled(state, group_path) or deadline.expired() or self._restarted(state, plan.state.restart_marks):
                return state
            if state.inactive and not state.job_pending and not told_leftovers:
                told_leftovers = True
                self._terminate_leftovers(self.cgroup(state, group_path))
            self.clock.sleep(min(self.POLL_SECONDS, deadline.remaining()))

    def _terminate_leftovers(self, group: Cgroup) -> None:
        for pid in group.pids():
            start = self.reader.start_time(pid)
            _status, handle = self.signaller.open(ProcessIdentity(pid, start)) if start is not None else ("gone", None)
            if handle is not None:
                self.signaller.send(handle, signal.SIGTERM)
                self.signaller.send(handle, signal.SIGCONT)
                self.signaller.close([handle])

    def _wait(self, unit: str, done, deadline: Deadline) -> UnitState:
        while True:
            state = self.systemctl.show(unit)
            if done(state) or deadline.expired():
                return state
            self.clock.sleep(min(self.POLL_SECONDS, deadline.remaining()))

    def _settled(self, state: UnitState, group_path: str) -> bool:
        return state.inactive and not state.job_pending and self.cgroup(state, group_path).empty()

    def _alive(self, key: tuple[int, int]) -> bool:
        # an exited process awaiting its reaper is already out of the group: count it as gone
        return self.reader.thread_group_alive(*key)

    def _describe(self, pid: int) -> dict:
        try:
            return describe(self.reader, pid)
        except (ProcessGone, PermissionError):
            return {"pid": pid}

    @staticmethod
    def _restarted(state: UnitState, before_marks: tuple[str, str]) -> bool:
        return state.restart_marks != before_marks and not state.inactive

    def _report_restart(self, unit: str, state: UnitState, before_marks: tuple[str, str], outcome: StopOutcome) -> None:
        outcome.restarted = True
        outcome.errors.append(
            f"{unit} was started again (InvocationID {before_marks[0] or '-'} -> {state.restart_marks[0] or '-'}, "
            f"NRestarts {before_marks[1] or '-'} -> {state.restart_marks[1] or '-'}): a trigger ({state.properties.get('TriggeredBy') or 'none'}), "
            "a dependency or another client started it")

    def _check_restart(self, unit: str, state: UnitState, before_marks: tuple[str, str], request: StopRequest,
                       outcome: StopOutcome) -> UnitState:
        """InvocationID and NRestarts must not move: after `settle` seconds the unit must still be down."""
        if request.settle and not outcome.errors:
            self.clock.sleep(request.settle)
            state = self.systemctl.show(unit)
        if self._restarted(state, before_marks):
            self._report_restart(unit, state, before_marks, outcome)
        elif not state.inactive and not outcome.errors:
            outcome.errors.append(f"{unit} is {state.active_state} again after the stop")
        return state


def stop_request(params: dict) -> StopRequest:
    """Validate every option before anything runs."""
    unit = normalize_unit_name(params["name"])
    reason = refusal(unit, params["allow_protected"])
    if reason:
        raise Refused(reason, unit=unit)
    return StopRequest(
        unit=unit,
        stop_timeout=non_negative("stop_timeout", params["stop_timeout"]),
        kill_timeout=non_negative("kill_timeout", params["kill_timeout"]),
        must_exist=params["must_exist"],
        disable=params["disable"],
        allow_protected=params["allow_protected"],
        settle=non_negative("settle", params["settle"]),
        stop_triggers=params["stop_triggers"],
    )


def stop_unit(request: StopRequest, systemctl: Systemctl, reader: ProcReader, check_mode: bool, warn=lambda _message: None,
              clock: Clock | None = None, journal: Journal | None = None) -> dict:
    """Observe, plan and (unless check mode) stop one unit under its host lock: the result systemd_stop_hard returns.

    A stop that leaves survivors, or errors (a restart, a trigger that stayed up), raises CheckFailed carrying the
    whole result, so that every caller (the module, the switch's cutover) reports the same keys.
    """
    clock = clock or Clock()
    started = clock.monotonic()
    with host_lock(lock_path(f"systemd_stop_hard.{request.unit}"), longest_run(request)):
        state = systemctl.show(request.unit)
        ourselves = {os.getpid()} | {stat.pid for stat in reader.ancestors(os.getpid())}
        triggers = {name: systemctl.show(name) for name in state.triggered_by} if request.stop_triggers else None
        plan = plan_stop(request, state, Cgroup.locate(state.control_group, reader), ourselves, triggers)
        for warning in plan.warnings:
            warn(warning)
        outcome = StopOutcome(state_after=state)
        journal = journal or Journal(None, "-", "systemd_stop_hard", reader)
        first_entry = len(journal.entries)
        if plan.changes and not check_mode:
            journal.open()  # a journal that cannot be written refuses the stop before it begins
            outcome = UnitStopper(systemctl, reader, Signaller(reader, journal=journal), clock).run(plan, request)
    result = dict(
        changed=plan.changes, unit=request.unit, found=plan.found, state_before=state.summary(),
        state_after=outcome.state_after.summary(), processes=plan.members, escalated=outcome.escalated,
        kill_method=outcome.kill_method, terminated=outcome.terminated, killed=outcome.killed, survivors=outcome.survivors,
        disabled=plan.disable and not check_mode, elapsed=clock.monotonic() - started,
        triggers_stopped=plan.triggers if check_mode else outcome.triggers_stopped,
        # the signals this module sent itself (systemd's own stop signals are systemd's): leftovers, the escalation
        signals=journal.entries[first_entry:], journal_path=journal.path,
    )
    if outcome.survivors:
        listed = ", ".join(f"{s['pid']} ({s.get('comm')}, state {s.get('state')})" for s in outcome.survivors)
        raise CheckFailed(f"{request.unit}: processes survived SIGKILL and kill_timeout={request.kill_timeout:g}s: {listed}", **result)
    if outcome.errors:
        raise CheckFailed("; ".join(outcome.errors), **result)
    return result


def stop_units(requests: list[StopRequest], systemctl: Systemctl, reader: ProcReader, check_mode: bool,
               warn=lambda _message: None, journal: Journal | None = None) -> tuple[list[dict], list[str]]:
    """stop_unit for each request in order, in one run; a unit that fails does not keep the next one running.

    Returns every unit's result (a failed one with failed and msg, and what its stop did) and the failure messages.
    """
    results, failures = [], []
    for request in requests:
        try:
            results.append(stop_unit(request, systemctl, reader, check_mode, warn, journal=journal))
        except Error as exc:
            results.append(dict(exc.context, unit=request.unit, failed=True, msg=exc.msg))
            failures.append(exc.msg)
    return results, failures
