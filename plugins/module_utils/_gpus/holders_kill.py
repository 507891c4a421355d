# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""gpu_holders_kill without Ansible: validate the request, observe holders, apply the plan."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, InvalidInput, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import (
    BUILTIN_PROTECTED_NAMES,
    DEFAULT_DEVICE_GLOBS,
    IMPLAUSIBLE_PID,
    Guard,
    HolderScanner,
    KillPlan,
    NvmlProcess,
    ScanResult,
    cross_check_nvml,
    device_nodes,
    in_init_pid_namespace,
    missing_scan_capabilities,
    plan_kill,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import select_gpus, validate_gpu_selectors
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock, lock_path
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import (
    ProcessGone,
    ProcessIdentity,
    ProcReader,
    describe,
    own_status,
    owner_uid,
)
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, survivor_report, terminate_then_kill
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative, positive_int

SOURCES = ("proc", "nvml")
OUTSIDE_UNITS = ("kill", "report", "fail")
INCOMPLETE_SCAN = ("fail", "warn")
SESSION_SCOPE = re.compile(r"^session-[^/]+\.scope$")
# where logind does not run, an SSH login's processes stay in the SSH daemon's own service
SSH_SERVICES = ("ssh.service", "sshd.service")
# the scopes container engines put each container in (docker, podman, containerd and CRI-O under Kubernetes)
CONTAINER_SCOPE = re.compile(r"^(docker|libpod|libpod-conmon|cri-containerd|crio|crio-conmon|containerd)-[^/]+\.scope$")
NO_RESTART = ("", "no")


@dataclass(frozen=True)
class KillRequest:
    gpus: list[str] | None
    device_paths: list[str]
    sources: list[str]
    protected: list[str]
    protected_pids: list[int]
    term_timeout: float
    kill_timeout: float
    max_targets: int
    kill_ambiguous: bool
    nvml_timeout: float
    lock_timeout: float
    units: tuple[str, ...] = ()
    outside_units: str = "fail"
    # the uids of the engines' users: their holders outside the units are the engines' own (escaped workers)
    owner_uids: frozenset[int] = frozenset()
    # a parked engine's units: their processes are kept (never signalled, never foreign) and listed as such
    kept_units: tuple[str, ...] = ()
    # a scan that could not see every process's files (a capability missing, a read refused or blocked): refused, or warned
    incomplete_scan: str = "fail"

    @classmethod
    def from_params(cls, params: dict, reader: ProcReader) -> KillRequest:
        validate_gpu_selectors(params.get("gpus"))
        sources = params.get("sources") or list(SOURCES)
        if not sources:
            raise InvalidInput("sources: give at least one of proc, nvml")
        device_paths = params.get("device_paths") or list(DEFAULT_DEVICE_GLOBS)
        for pattern in device_paths:
            if not os.path.isabs(pattern) or "\0" in pattern or "\n" in pattern:
                raise InvalidInput(f"device_paths: {pattern!r} is not an absolute path or glob")
        units = tuple(params.get("units") or ())
        kept_units = tuple(params.get("kept_units") or ())
        for unit in units + kept_units:
            if not unit or "/" in unit or not unit.isprintable() or "." not in unit:
                raise InvalidInput(f"units: {unit!r} is not a unit name (for example vllm.service)")
        outside_units = params.get("outside_units") or "fail"
        if outside_units not in OUTSIDE_UNITS:
            raise InvalidInput(f"outside_units: {outside_units!r} is not one of {', '.join(OUTSIDE_UNITS)}")
        incomplete_scan = params.get("incomplete_scan") or "fail"
        if incomplete_scan not in INCOMPLETE_SCAN:
            raise InvalidInput(f"incomplete_scan: {incomplete_scan!r} is not one of {', '.join(INCOMPLETE_SCAN)}")
        owner_uids = frozenset(owner_uid(owner) for owner in params.get("owners") or [])
        protected = list(params.get("protected") or [])
        for name in protected:
            if not name or "/" in name or not name.isprintable():
                raise InvalidInput(f"protected: {name!r} is not a process name (a comm or executable name, without '/')")
        return cls(
            gpus=params.get("gpus") or None,
            device_paths=device_paths,
            sources=sources,
            protected=list(BUILTIN_PROTECTED_NAMES) + protected,
            protected_pids=[_protected_pid(pid, reader) for pid in params.get("protected_pids") or []],
            term_timeout=non_negative("term_timeout", params["term_timeout"]),
            kill_timeout=non_negative("kill_timeout", params["kill_timeout"]),
            max_targets=positive_int("max_targets", params["max_targets"]),
            kill_ambiguous=params.get("ambiguous") == "kill",
            nvml_timeout=non_negative("nvml_timeout", params["nvml_timeout"], minimum_exclusive=True),
            lock_timeout=non_negative("lock_timeout", params["lock_timeout"]),
            units=units,
            outside_units=outside_units,
            owner_uids=frozenset(uid for uid in owner_uids if uid is not None),
            kept_units=kept_units,
            incomplete_scan=incomplete_scan,
        )

    @property
    def needs_nvml(self) -> bool:
        return "nvml" in self.sources or bool(self.gpus)


def _protected_pid(pid: int, reader: ProcReader) -> int:
    if pid <= 1:
        raise InvalidInput(f"protected_pids: {pid} is not a valid process id (PID 1 and below are always protected)")
    if os.path.exists(reader.path(pid)) and not reader.is_process(pid):
        raise InvalidInput(f"protected_pids: {pid} is a thread id, not a process: give its process id (Tgid)")
    return pid


# why an NVML PID was not used when the module runs in a PID namespace (stale_nvml_pids' reason)
HOST_PID = "a host PID seen from inside a PID namespace: not used"


def observe(request: KillRequest, nvml_client_factory, reader: ProcReader, self_pid: int | None = None,
            restart_policy: Callable[[str], tuple[str, int]] | None = None, init_pid_namespace: Callable[[], bool] | None = None) -> KillPlan:
    """Find every holder of the selected GPUs and decide, for each, target, protected or left alone.

    restart_policy(unit) gives a service's Restart= setting and main PID (("", 0) where systemd does not run);
    init_pid_namespace() whether this process sees the host's PIDs, as NVML reports them (default: read from /proc).
    """
    warnings = []
    missing = missing_scan_capabilities(own_status())
    inventory = None
    if request.needs_nvml:
        with nvml_client_factory(request.nvml_timeout) as nvml:  # closed before the scan: its worker holds the devices
            inventory = nvml.inventory()
    selected_indexes = set(select_gpus(request.gpus, inventory)) if request.gpus else None
    minor_to_index = {gpu["minor"]: gpu["index"] for gpu in inventory["gpus"] if "minor" in gpu} if inventory else None
    selected_minors = None
    if selected_indexes is not None:
        selected_minors = {gpu["minor"] for gpu in inventory["gpus"] if gpu["index"] in selected_indexes and "minor" in gpu}

    nodes = device_nodes(request.device_paths)
    if not nodes:
        warnings.append(f"no device file matches {', '.join(request.device_paths)}")
    scanner = HolderScanner(nodes, reader)
    scan = scanner.scan() if "proc" in request.sources else ScanResult(minor_by_path=scanner.minor_by_path)
    stale = []
    if "nvml" in request.sources and inventory:
        # every GPU's list: it places processes on GPUs, which the selection below needs
        listed = [NvmlProcess(gpu["index"], p["pid"], p["used_mib"], p["type"]) for gpu in inventory["gpus"] for p in gpu["processes"]]
        if (in_init_pid_namespace if init_pid_namespace is None else init_pid_namespace)():
            stale = cross_check_nvml(listed, scanner, scan, reader)
        else:
            # NVML reports the host's PIDs: here the same number may be another process, so none selects anything; the
            # device files found by fd and mmap decide alone
            stale = [{"pid": process.pid, "gpu": process.gpu, "used_mib": process.used_mib, "reason": HOST_PID} for process in listed]
            if listed:
                warnings.append(f"this module runs in a PID namespace (or its namespace could not be read) while NVML reports host PIDs: NVML PIDs "
                                f"{', '.join(sorted({str(process.pid) for process in listed}, key=int))} were not used to place or "
                                "select holders (the device files found by fd and mmap decide), and were not signalled")
        stale = [entry for entry in stale if selected_indexes is None or entry["gpu"] in selected_indexes]
        implausible = [str(entry["pid"]) for entry in stale if entry["reason"] == IMPLAUSIBLE_PID]
        if implausible:
            warnings.append(f"NVML listed implausible PIDs {', '.join(implausible)}: ignored, never signalled")
    if inventory is None:
        warnings.append("NVML not queried: holders are reported by device file, without GPU indexes")

    self_pid = self_pid or os.getpid()
    guard = Guard(names=request.protected, self_pid=self_pid, ancestors={stat.pid for stat in reader.ancestors(self_pid)},
                  descendants=reader.descendants(self_pid), pids=set(request.protected_pids))
    uuid_by_index = {gpu["index"]: gpu["uuid"] for gpu in inventory["gpus"] if gpu.get("uuid")} if inventory else None
    plan = plan_kill(scan, reader, guard, minor_to_index, selected_minors, selected_indexes, uuid_by_index)
    plan.stale_nvml_pids = stale
    plan.inventory = inventory
    plan.missing_capabilities = missing
    if request.kill_ambiguous:
        plan.targets = sorted(plan.targets + [{k: v for k, v in holder.items() if k != "reason"} for holder in plan.ambiguous],
                              key=lambda holder: holder["pid"])
        plan.ambiguous = []
    place_holders(plan, request, restart_policy or (lambda _unit: ("", 0)))
    plan.escaped_parents = escaped_parents(plan, reader, guard)
    # first: a parent signalled after its worker could start it again in between
    plan.targets = plan.escaped_parents + plan.targets
    plan.warnings = warnings + _unit_warnings(plan)
    if request.incomplete_scan == "warn":
        plan.warnings += [f"{why} (incomplete_scan: warn)" for why in incomplete_scan_reasons(plan)]
    if plan.ambiguous:
        plan.warnings.append(f"{len(plan.ambiguous)} holder(s) hold nodes of the selected and other GPUs and NVML lists them on none "
                             "(forked children, NVML clients): left alone, see `ambiguous`; set ambiguous: kill or free all GPUs to include them")
    return plan


def placement(holder: dict, units: tuple[str, ...]) -> str:
    """Where a holder runs: in one of the units being stopped, in another service, a login session, a container, or
    elsewhere (a transient scope such as systemd-run --scope, or no unit at all)."""
    unit = holder.get("unit") or ""
    if unit in units:
        return "listed_unit"
    if SESSION_SCOPE.match(unit) or unit in SSH_SERVICES:
        return "session"
    if unit.endswith(".service"):
        return "other_service"
    if CONTAINER_SCOPE.match(unit):
        return "container"
    return "elsewhere"


def escaped_parents(plan: KillPlan, reader: ProcReader, guard: Guard) -> list[dict]:
    """The parents that would start an engine's escaped worker again once it is killed (a launcher or agent of the
    engine's user that outlived its unit): each target that is an engine's worker outside any unit or service
    (placement elsewhere) has its ancestors added while they are of the same user and in the same place, hold nothing
    themselves, and are not protected. A login session's or another service's processes are never added: systemd and
    the session's owner stop those."""
    holders = {holder["pid"] for holder in plan.holders}
    found: dict[int, dict] = {}
    for worker in plan.targets:
        if worker["foreign"] or worker["placement"] != "elsewhere" or worker.get("uid") is None:
            continue
        for ancestor in reader.ancestors(worker["pid"]):
            if ancestor.pid in holders or ancestor.pid in found:
                continue  # a holder is judged as one; a parent shared by several workers is added once
            try:
                info = describe(reader, ancestor.pid)
            except (ProcessGone, PermissionError):
                break
            if info["uid"] != worker["uid"] or info["unit"] != worker.get("unit") or guard.reason(info, ancestor.is_kernel_thread):
                break
            found[ancestor.pid] = dict(info, via=[], devices=[], gpus=[], gpu_uuids=[], placement="elsewhere", foreign=False,
                                       parent_of=worker["pid"])
    return [found[pid] for pid in sorted(found)]


def place_holders(plan: KillPlan, request: KillRequest, restart_policy: Callable[[str], tuple[str, int]]) -> None:
    """Mark every holder with its placement and whether it is foreign, and apply outside_units to the foreign targets.

    Foreign: outside the given units and not run by one of the engines' users (owners); an engine's escaped worker
    is not foreign and is killed with the units' processes. systemd starts a service again when its main process exits
    (Restart= other than no): a holder that is the main process of another such service is never killed alone. It goes
    to `restarting`, which fails the task, unless it is foreign and outside_units leaves it alone (report, fail).
    """
    # a parked engine's processes hold the GPUs on purpose: kept, whoever else is signalled
    plan.kept = [target for target in plan.targets if target.get("unit") in request.kept_units]
    plan.targets = [target for target in plan.targets if target.get("unit") not in request.kept_units]
    policies: dict[str, tuple[str, int]] = {}
    for holder in plan.holders + plan.targets + plan.protected + plan.ambiguous + plan.kept:
        holder["placement"] = "kept_unit" if holder.get("unit") in request.kept_units else placement(holder, request.units)
        if holder["placement"] == "other_service":
            unit = holder["unit"]
            if unit not in policies:
                policies[unit] = restart_policy(unit)
            restart, main_pid = policies[unit]
            holder["restart"] = restart or "no"
            holder["main_process"] = holder["pid"] == main_pid
        # the engines' own wherever they run (an escaped worker); anyone else's outside the units is foreign
        holder["foreign"] = holder["placement"] not in ("listed_unit", "kept_unit") and holder.get("uid") not in request.owner_uids
    plan.foreign = [target for target in plan.targets if target["foreign"]]
    # a holder systemd would start again is never killed alone, whoever runs it
    restarting = [target for target in plan.targets if target["placement"] == "other_service" and target.get("main_process")
                  and target["restart"] not in NO_RESTART]
    if request.outside_units == "kill":
        plan.restarting = restarting
        return
    # report leaves the foreign ones running, fail refuses them; the engines' own are killed either way
    plan.outside = plan.foreign
    plan.restarting = [target for target in restarting if not target["foreign"]]
    if request.outside_units == "report":
        plan.targets = [target for target in plan.targets if not target["foreign"]]


def incomplete_scan_reasons(plan: KillPlan) -> list[str]:
    """Why the scan could not see every process's open files: a capability this process lacks (said once, for every
    process it hides), then the processes whose files could not be read, each named with why (possible_holders)."""
    if plan.missing_capabilities:
        # said once: every process it hides is a possible holder for the same reason
        return [f"this module runs without {', '.join(plan.missing_capabilities)}: the kernel hides the open files of every "
                "process it may not trace (another user's, or root's with capabilities it lacks), so a GPU holder cannot be "
                "ruled out - " + (f"{len(plan.possible)} process(es) may hold the GPUs ({describe_possible(plan.possible, why=False)}; "
                                  "see possible_holders). " if plan.possible else "")
                + "Run it with that capability (as root on the host, or a container given --cap-add SYS_PTRACE)"]
    if plan.possible:
        return [f"{len(plan.possible)} process(es) may hold the GPUs ({describe_possible(plan.possible)}; see possible_holders)"]
    return []


def describe_possible(possible: list[dict], why: bool = True) -> str:
    """pid, command, user, unit (and why) of the first few possible holders, for a message."""
    shown = [f"pid {holder['pid']} {holder.get('comm')} of user {holder.get('user', holder.get('uid'))} in "
             f"{holder.get('unit') or 'no unit'}" + (f": {holder.get('why')}" if why else "") for holder in possible[:5]]
    return "; ".join(shown) + (f"; and {len(possible) - 5} more" if len(possible) > 5 else "")


def refusal(plan: KillPlan, request: KillRequest) -> str | None:
    """Why nothing may be signalled: an incomplete scan (a capability missing, a process whose files could not be read)
    unless incomplete_scan=warn, targets outside the units under outside_units=fail, or in a restarting service."""
    incomplete = incomplete_scan_reasons(plan)
    if incomplete and request.incomplete_scan == "fail":
        return ("the scan for GPU holders is incomplete: " + "; ".join(incomplete) + ". Nothing was signalled. Unwedge or stop "
                "the processes named, list them in protected_pids when they hold no GPU, or accept an incomplete scan with "
                "incomplete_scan: warn")
    if request.outside_units == "fail" and plan.outside:
        owners = " and not run by the engines' users" if request.owner_uids else ""
        return (f"{len(plan.outside)} process(es) hold the GPUs outside the units being stopped{owners} "
                f"({describe_holders(plan.outside)}) and outside_units is fail: nothing was signalled")
    if plan.restarting:
        units = sorted({f"{target['unit']} (Restart={target['restart']})" for target in plan.restarting})
        return (f"processes holding the GPUs run in {', '.join(units)}, which systemd would start again: nothing was signalled. "
                "Stop the unit with it (add it to the units being stopped), or stop it first")
    return too_many_targets(plan, request)


def describe_holders(holders: list[dict]) -> str:
    """pid, user, command and unit of the first few holders, for a message."""
    shown = [f"pid {holder['pid']} {holder.get('comm')} of user {holder.get('user', holder.get('uid'))} in "
             f"{holder.get('unit') or 'no unit'} ({holder['placement']})" for holder in holders[:5]]
    return "; ".join(shown) + (f"; and {len(holders) - 5} more" if len(holders) > 5 else "")


def _unit_warnings(plan: KillPlan) -> list[str]:
    """A holder killed inside a service that does not restart leaves that service running without it."""
    units = sorted({target["unit"] for target in plan.targets if target.get("placement") == "other_service"} - {t["unit"] for t in plan.restarting})
    return [f"holders run in {unit}, which is not among the units being stopped: they are killed, the unit is not stopped" for unit in units]


def apply(plan: KillPlan, request: KillRequest, signaller: Signaller) -> dict:
    """Signal every target (TERM+CONT, then KILL), each signal journalled first, and report what happened to each."""
    by_pid = {target["pid"]: target for target in plan.targets}
    signaller.journal.open()  # a journal that cannot be written refuses the run before the first signal
    first_entry = len(signaller.journal.entries)
    outcome = terminate_then_kill(signaller, [ProcessIdentity(t["pid"], t["start_time"]) for t in plan.targets],
                                  request.term_timeout, request.kill_timeout)
    return {
        "terminated": [by_pid[identity.pid] for identity in outcome.terminated],
        "killed": [by_pid[identity.pid] for identity in outcome.killed],
        "survivors": [survivor_report(signaller.reader, identity, by_pid[identity.pid]) for identity in outcome.survivors],
        "not_signalled": outcome.not_signalled,
        # every signal went through the journal: its entries are the audit trail, with exe, cgroup, uid and times
        "signals": signaller.journal.entries[first_entry:],
    }


def plan_result(plan: KillPlan) -> dict:
    return {"holders": plan.holders, "targets": plan.targets, "protected": plan.protected, "ambiguous": plan.ambiguous,
            "outside": plan.outside, "foreign": plan.foreign, "restarting": plan.restarting, "stale_nvml_pids": plan.stale_nvml_pids,
            "unreadable": plan.unreadable, "kept": plan.kept, "possible_holders": plan.possible, "escaped_parents": plan.escaped_parents,
            "scan_complete": not incomplete_scan_reasons(plan), "missing_capabilities": plan.missing_capabilities}


def too_many_targets(plan: KillPlan, request: KillRequest) -> str | None:
    if len(plan.targets) <= request.max_targets:
        return None
    return (f"{len(plan.targets)} processes would be signalled, more than max_targets={request.max_targets}: nothing was signalled. "
            "A plan this large is usually a selection mistake; see `targets` in the result")


def kill_holders(request: KillRequest, nvml_client_factory, reader: ProcReader, restart_policy, check_mode: bool,
                 warn=lambda _message: None, log=lambda _message: None, journal: Journal | None = None) -> dict:
    """Observe, plan and (unless check mode) signal the GPU holders under the host lock: gpu_holders_kill's result.

    A refused plan raises Refused and survivors raise CheckFailed, each carrying the whole result.
    """
    started = time.monotonic()
    with host_lock(lock_path("gpu_holders_kill"), request.lock_timeout):
        plan = observe(request, nvml_client_factory, reader, restart_policy=restart_policy)
        journal = journal or Journal(None, "-", "gpu_holders_kill", reader)
        result = dict(plan_result(plan), terminated=[], killed=[], survivors=[], not_signalled=[], signals=[], journal_path=journal.path)
        for warning in plan.warnings:
            warn(warning)
        refused = refusal(plan, request)
        if refused:
            raise Refused(refused, elapsed=time.monotonic() - started, **result)
        if plan.targets and not check_mode:
            result.update(apply(plan, request, Signaller(reader, journal=journal)))
            for sent in result["signals"]:
                log(f"gpu_holders_kill: {sent['signal']} to pid {sent['pid']} (start time {sent['start_time']}): {sent['result']}")
    # in check mode the plan is the change; for real, only a signal that reached a process is one
    changed = bool(plan.targets) if check_mode else any(sent["result"] == "sent" for sent in result["signals"])
    result.update(changed=changed, elapsed=time.monotonic() - started)
    if result["survivors"]:
        pids = ", ".join(f"{s['pid']} ({s['comm']}, state {s.get('state')})" for s in result["survivors"])
        raise CheckFailed(f"processes still hold the GPUs after SIGKILL and kill_timeout={request.kill_timeout:g}s: {pids}", **result)
    return result
