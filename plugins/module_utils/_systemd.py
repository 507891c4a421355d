# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""systemd units: names, `systemctl show`, control groups, and a stop that always ends.

The stop is a real stop job (only a stop job suppresses Restart=), queued without blocking and
watched against our own monotonic deadline, so units with TimeoutStopSec=infinity or
SendSIGKILL=no cannot hang the task. At the deadline every process of the unit's control group
is SIGKILLed: through cgroup.kill where the kernel has it (atomic, forks included), otherwise by
re-reading the group and killing by pidfd until it stays empty.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed, Error, InvalidInput, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock, lock_path
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcessIdentity, ProcReader, describe
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, survivor_report
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative

UNIT_NAME_MAX = 255  # systemd's UNIT_NAME_MAX is 256 with the terminating NUL
STOPPABLE_TYPES = (".service", ".scope", ".socket", ".timer", ".path")
OTHER_TYPES = (".slice", ".target", ".device", ".mount", ".automount", ".swap")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@-]+$")
SYSTEMD_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}")
INACTIVE_STATES = ("inactive", "failed")

# Units whose loss takes the node, its drivers or its monitoring down; refused unless allow_protected.
PROTECTED_UNITS = frozenset({
    "sshd.service", "ssh.service", "dbus.service", "dbus-broker.service", "nvidia-persistenced.service",
    "nvidia-fabricmanager.service", "nv-fabricmanager.service", "nvidia-dcgm.service", "dcgm.service",
    "nv-hostengine.service", "dcgm-exporter.service", "nvidia-imex.service", "containerd.service", "docker.service",
    "docker.socket", "crio.service", "podman.service", "kubelet.service",
    # sockets that start the above again
    "ssh.socket", "sshd.socket", "dbus.socket", "podman.socket", "containerd.socket", "nvidia-dcgm.socket",
})
PROTECTED_PREFIXES = ("systemd-",)  # systemd's own units: journald, logind, udevd, networkd, resolved ...

SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Job", "MainPID", "ControlPID", "ControlGroup", "KillMode",
    "SendSIGKILL", "TimeoutStopUSec", "Restart", "TriggeredBy", "InvocationID", "NRestarts", "FragmentPath",
    "UnitFileState", "MemoryCurrent",
)


def normalize_unit_name(name) -> str:
    """The unit name systemctl would act on (`vllm` -> `vllm.service`); anything ambiguous or unsafe is refused."""
    if not isinstance(name, str) or not name:
        raise InvalidInput("name: give a unit name such as vllm or vllm.service")
    if "\0" in name or "\n" in name or "\r" in name:
        raise InvalidInput(f"name: {name!r} contains a NUL or line break")
    if len(name) > UNIT_NAME_MAX:
        raise InvalidInput(f"name: {len(name)} characters is longer than systemd's limit of {UNIT_NAME_MAX}")
    if any(char in name for char in "*?[]"):
        raise InvalidInput(f"name: {name!r} is a glob pattern; give one unit (systemctl would act on every match)")
    if "/" in name or ".." in name:
        raise InvalidInput(f"name: {name!r} is a path; give a unit name")
    if not name.isascii():
        raise InvalidInput(f"name: {name!r} has non-ASCII characters; systemd unit names are ASCII (escape others as \\xNN)")
    if name.startswith("-") and name != "-.slice":
        raise InvalidInput(f"name: {name!r} starts with '-'")
    if not UNIT_NAME.match(SYSTEMD_ESCAPE.sub("", name)):
        raise InvalidInput(f"name: {name!r} contains characters a unit name cannot have (whitespace or shell metacharacters)")
    if not name.endswith(STOPPABLE_TYPES + OTHER_TYPES):
        name += ".service"
        if len(name) > UNIT_NAME_MAX:
            raise InvalidInput(f"name: {name!r} is longer than systemd's limit of {UNIT_NAME_MAX}")
    prefix = name.rsplit(".", 1)[0]
    if prefix.endswith("@") or prefix.startswith("@"):
        raise InvalidInput(f"name: {name!r} is a template without an instance; give an instance such as {prefix}1.service")
    return name


def refusal(unit: str, allow_protected: bool) -> str | None:
    """Why this unit must not be stopped by this module, or None."""
    if unit == "init.scope" or unit.endswith(".slice"):
        return f"{unit} is {'PID 1' if unit == 'init.scope' else 'a slice holding other units'}; refusing to stop it"
    if unit.endswith(OTHER_TYPES):
        return f"{unit} is not a service, scope, socket, timer or path unit; refusing to stop it"
    if not allow_protected and (unit in PROTECTED_UNITS or unit.startswith(PROTECTED_PREFIXES)):
        return f"{unit} is protected (node access, drivers, monitoring or container runtime); set allow_protected: true to stop it anyway"
    return None


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` output (KEY=VALUE lines, values may contain '=')."""
    properties = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            properties[key] = value
    return properties


def parse_show_units(text: str, units: list[str]) -> dict[str, dict[str, str]]:
    """`systemctl show UNIT...`: one block of KEY=VALUE lines per unit, in the order asked, blocks apart by a blank line."""
    blocks = text.strip("\n").split("\n\n")
    if len(blocks) != len(units):
        raise CommandFailed(f"systemctl show printed {len(blocks)} block(s) for {len(units)} unit(s)", stdout=text)
    return {unit: parse_show(block) for unit, block in zip(units, blocks)}


def exec_start_argv(exec_start: str | None) -> list[str]:
    """The words of a unit's first ExecStart=, as `systemctl show` prints it ({ path=... ; argv[]=WORDS ; ... }); []
    if none."""
    found = re.search(r"argv\[\]=(.*?) ; ", exec_start or "")
    return found.group(1).split() if found else []


@dataclass(frozen=True)
class UnitState:
    properties: dict

    @property
    def found(self) -> bool:
        return self.properties.get("LoadState") not in ("not-found", None, "") or self.active_state not in ("inactive", "")

    @property
    def active_state(self) -> str:
        return self.properties.get("ActiveState", "")

    @property
    def inactive(self) -> bool:
        return self.active_state in INACTIVE_STATES

    @property
    def job_pending(self) -> bool:
        return self.properties.get("Job", "") not in ("", "0")

    @property
    def triggered_by(self) -> list[str]:
        """Sockets, timers and paths that can start this unit again."""
        return self.properties.get("TriggeredBy", "").split()

    @property
    def control_group(self) -> str:
        return self.properties.get("ControlGroup", "")

    @property
    def restart_marks(self) -> tuple[str, str]:
        return self.properties.get("InvocationID", ""), self.properties.get("NRestarts", "")

    def summary(self) -> dict:
        keys = ("ActiveState", "SubState", "LoadState", "MainPID", "InvocationID", "NRestarts", "UnitFileState")
        return {key: self.properties.get(key) for key in keys}

    def warnings(self) -> list[str]:
        warnings = []
        kill_mode = self.properties.get("KillMode")
        if kill_mode in ("process", "none"):
            warnings.append(f"KillMode={kill_mode}: systemd leaves the unit's other processes running on stop; this module kills them")
        if self.properties.get("SendSIGKILL") == "no":
            warnings.append("SendSIGKILL=no: systemd would never SIGKILL this unit's processes; this module does at its deadline")
        if self.properties.get("TimeoutStopUSec") == "infinity":
            warnings.append("TimeoutStopSec=infinity: a plain systemctl stop could wait forever")
        return warnings


class Systemctl:
    """The seam to systemd: every call is an argv list run with LC_ALL=C (never a shell string)."""

    def __init__(self, run_command, binary: str):
        self.run_command = run_command
        self.binary = binary

    def _run(self, *args: str) -> str:
        argv = [self.binary, *args]
        rc, out, err = self.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        if rc != 0:
            raise CommandFailed(f"{' '.join(argv)} failed (rc {rc}): {err.strip() or out.strip()}", cmd=argv, rc=rc, stdout=out, stderr=err)
        return out

    def show(self, unit: str) -> UnitState:
        return UnitState(parse_show(self._run("show", f"--property={','.join(SHOW_PROPERTIES)}", "--", unit)))

    def stop(self, unit: str) -> None:
        # replace-irreversibly: a start job queued meanwhile (ExecStop restarting the unit, another client) cannot cancel ours
        self._run("--no-block", "--job-mode=replace-irreversibly", "stop", "--", unit)

    def disable(self, unit: str) -> None:
        self._run("disable", "--", unit)

    def start(self, unit: str) -> None:
        # blocks only until the main process is exec'd (Type=exec): an engine's readiness is waited for by its caller
        self._run("start", "--", unit)

    def reset_failed(self, units: list[str]) -> None:
        self._run("reset-failed", "--", *units)

    def daemon_reload(self) -> None:
        self._run("daemon-reload")

    def show_units(self, units: list[str], properties: tuple[str, ...]) -> dict[str, dict[str, str]]:
        """Some properties of several units, in one call."""
        return parse_show_units(self._run("show", f"--property={','.join(properties)}", "--", *units), units)

    def journal(self, unit: str, lines: int = 300) -> list[str]:
        """The unit's last log lines, messages only ([] when journalctl cannot say)."""
        journalctl = os.path.join(os.path.dirname(self.binary), "journalctl")
        rc, out, _err = self.run_command([journalctl, "--unit", unit, "--lines", str(lines), "--output", "cat", "--no-pager", "--quiet"],
                                         environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        return out.splitlines() if rc == 0 else []

    def unit_file_state(self, unit: str) -> str:
        """enabled, disabled, static, ... as `systemctl is-enabled` reads the files now ('not-found' when none)."""
        argv = [self.binary, "is-enabled", "--", unit]
        rc, out, err = self.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        state = out.strip().splitlines()[-1] if out.strip() else ""
        if state:
            return state
        if "No such file" in err or "not found" in err.lower():
            return "not-found"
        raise CommandFailed(f"{' '.join(argv)} failed (rc {rc}): {err.strip()}", cmd=argv, rc=rc, stdout=out, stderr=err)

    def set_boot(self, enable: str | None, units: list[str]) -> dict:
        """Only ``enable`` of ``units`` starts at boot (None: none of them); a unit already as it should be is left
        alone. One daemon-reload when something changed, so that systemd's UnitFileState says what the files say."""
        states = {unit: self.unit_file_state(unit) for unit in units}
        to_enable = [unit for unit in units if unit == enable and states[unit] != "enabled"]
        to_disable = [unit for unit in units if unit != enable and states[unit] == "enabled"]
        if to_enable:
            self._run("enable", "--no-reload", "--", *to_enable)
        if to_disable:
            self._run("disable", "--no-reload", "--", *to_disable)
        if to_enable or to_disable:
            self.daemon_reload()
        return {"enabled": to_enable, "disabled": to_disable, "at_boot": enable}

    def unit_state(self, unit: str) -> str:
        """ActiveState, or auto-restart when the engine exited and systemd waits to start it again (Restart=);
        'unknown' when systemctl cannot say."""
        try:
            state = self.show(unit)
        except CommandFailed:
            return "unknown"
        return "auto-restart" if state.properties.get("SubState") == "auto-restart" else state.active_state or "unknown"


class Cgroup:
    """A unit's control group on whichever hierarchy this host mounts (v2, hybrid or v1)."""

    def __init__(self, directory: str | None, reader: ProcReader):
        self.directory = directory
        self.reader = reader

    @classmethod
    def locate(cls, control_group: str, reader: ProcReader, fs_root: str = "/sys/fs/cgroup") -> Cgroup:
        if not control_group:
            return cls(None, reader)
        for candidate in _cgroup_candidates(control_group, fs_root, _systemd_root(reader)):
            if os.path.isfile(os.path.join(candidate, "cgroup.procs")):
                return cls(candidate, reader)
        return cls(None, reader)  # removed: systemd deletes the group of a stopped unit

    @property
    def has_kill_file(self) -> bool:
        return self.directory is not None and os.path.exists(os.path.join(self.directory, "cgroup.kill"))

    def pids(self) -> list[int]:
        """Every process of the group and its sub-groups (units with Delegate=yes create them)."""
        found = []
        if self.directory is None:
            return found
        for directory, _subdirs, files in os.walk(self.directory):
            if "cgroup.procs" not in files:
                continue
            try:
                found += self._read_ids(directory, "cgroup.procs")
            except FileNotFoundError:
                continue  # the group went away while we walked it
            except OSError as exc:
                if exc.errno != errno.EOPNOTSUPP:
                    raise
                # a threaded group lists threads only; its processes are those threads' thread groups
                found += self._thread_groups(self._read_ids(directory, "cgroup.threads"))
        return sorted(set(found))

    @staticmethod
    def _read_ids(directory: str, name: str) -> list[int]:
        with open(os.path.join(directory, name), encoding="ascii") as ids:
            return [int(line) for line in ids.read().split()]

    def _thread_groups(self, tids: list[int]) -> list[int]:
        groups = []
        for tid in tids:
            try:
                groups.append(int(self.reader.status(tid)["Tgid"]))
            except (ProcessGone, PermissionError, KeyError, ValueError):
                continue
        return groups

    def members(self) -> list[dict]:
        described = []
        for pid in self.pids():
            try:
                described.append(describe(self.reader, pid))
            except (ProcessGone, PermissionError):
                continue
        return described

    def populated(self) -> bool | None:
        """cgroup.events' word on the group and its sub-groups (v2); None where the file is not (v1), or the group gone."""
        if self.directory is None:
            return None
        try:
            with open(os.path.join(self.directory, "cgroup.events"), encoding="ascii") as handle:
                text = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return "populated 1" in text

    def empty(self) -> bool:
        """No process in the group: on v2 only when the kernel says so. 'populated 1' with no process listed (one of
        another PID namespace, or the last one leaving) is re-read once and is not empty while it stays."""
        if self.directory is None or not os.path.isdir(self.directory):
            return True
        populated = self.populated()
        if populated is None:
            return not self.pids()
        if not populated:
            return True
        if self.pids():
            return False
        return not self.populated()  # the last process may have left between the two reads

    def unlisted(self) -> bool:
        """The kernel says the group is populated but no process of it can be listed from here."""
        return self.directory is not None and bool(self.populated()) and not self.pids()

    def kill_all(self, signaller: Signaller, deadline: Deadline) -> str:
        """SIGKILL everything in the group; returns the method used (and why cgroup.kill was not)."""
        refused = ""
        if self.has_kill_file:
            # the journal names each member before the write; one forked after the listing dies with them unnamed
            records = [signaller.journal.intent(pid, start, "SIGKILL", "cgroup.kill")
                       for pid in self.pids() if (start := self.reader.start_time(pid)) is not None]
            try:
                with open(os.path.join(self.directory, "cgroup.kill"), "w", encoding="ascii") as kill:
                    kill.write("1")
                for record in records:
                    signaller.journal.outcome(record, "sent")
                return "cgroup.kill"
            except OSError as exc:  # threaded group (EOPNOTSUPP) or a kernel that refuses: fall back to the loop
                refused = f" (cgroup.kill failed: {exc.strerror or exc})"
                for record in records:
                    signaller.journal.outcome(record, f"failed: {exc.strerror or exc}")
        self._kill_loop(signaller, deadline)
        return "signal loop" + refused

    def _kill_loop(self, signaller: Signaller, deadline: Deadline) -> None:
        """Re-read the group after each round so that children forked meanwhile are killed too."""
        signalled: set[tuple[int, int]] = set()
        while not deadline.expired():
            fresh = []
            for pid in self.pids():
                start = self.reader.start_time(pid)
                if start is not None and (pid, start) not in signalled:
                    fresh.append(ProcessIdentity(pid, start))
            if not fresh:
                return
            for identity in fresh:
                signalled.add((identity.pid, identity.start_time))
                status, handle = signaller.open(identity)
                if handle is not None:
                    signaller.send(handle, signal.SIGKILL)
                    signaller.close([handle])


def _systemd_root(reader: ProcReader) -> str:
    """The cgroup systemd (PID 1) treats as its root: '' on a host, the container's group in a container."""
    try:
        with open(reader.path(1, "cgroup"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return ""
    for line in text.splitlines():
        hierarchy, _colon, path = line.partition(":")[2].partition(":")
        if hierarchy in ("", "name=systemd") and path.endswith("/init.scope"):
            return path[: -len("/init.scope")]
    return ""


def _cgroup_candidates(control_group: str, fs_root: str, systemd_root: str) -> list[str]:
    mounts = (fs_root, os.path.join(fs_root, "unified"), os.path.join(fs_root, "systemd"))
    relative = control_group.lstrip("/")
    candidates = []
    for mount in mounts:
        candidates.append(os.path.join(mount, relative))
        if systemd_root:
            candidates.append(os.path.join(mount, systemd_root.lstrip("/"), relative))
    return candidates


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
        stop_triggers=params.get("stop_triggers", False),
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


def restart_policy_reader(systemctl: Systemctl | None):
    """unit -> (Restart=, main PID) through systemctl, as gpu_holders_kill places a holder; ("", 0) for every unit
    where systemd is not the init system (systemctl None)."""
    if systemctl is None:
        return lambda _unit: ("", 0)

    def policy(unit: str) -> tuple[str, int]:
        properties = systemctl.show(unit).properties
        return properties.get("Restart", ""), int(properties.get("MainPID") or 0)
    return policy


def systemd_runs() -> bool:
    return os.path.isdir("/run/systemd/system")
