# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Who holds the GPU device files: discovery from /proc, NVML cross-check, and the kill plan.

Holders are matched by file identity, as fuser does: an open fd by st_rdev for device nodes
(st_dev + st_ino for other files), an mmap by the (device, inode) pair /proc/<pid>/maps shows.
Paths never decide anything, so renamed or bind-mounted nodes are still found.
"""

from __future__ import annotations

import glob
import os
import re
import stat as stat_mode
from collections import Counter
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils import _bounded as bounded
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import (
    EXITED_STATES,
    ProcessGone,
    ProcReader,
    describe,
    pid_directories,
    read_file,
)

DEFAULT_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*")
NVIDIA_MAJOR = 195  # fixed by the driver; per-GPU nodes are minors 0..253 (254 modeset, 255 nvidiactl)
FIRST_SHARED_MINOR = 254
GPU_NODE_NAME = re.compile(r"^nvidia(\d+)$")
INIT_PID_NAMESPACE = "pid:[4026531836]"  # PROC_PID_INIT_INO
PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's ceiling for pid_max on 64-bit
IMPLAUSIBLE_PID = "implausible PID"  # the stale reason of an NVML PID no process can have
PERMISSION_DENIED = "permission_denied"  # the unreadable reason of a process whose files the kernel refused to show
CAP_SYS_PTRACE = 19  # include/uapi/linux/capability.h

# Never signalled whatever the options: daemons a GPU node runs besides the engines, each with why.
PROTECTED_DAEMONS = {
    "nvidia-persistenced": "keeps the driver loaded; killing it tears the GPUs' state down",
    "nv-hostengine": "DCGM host engine (health, metrics)",
    "dcgmi": "DCGM command line (diagnostics an operator runs)",
    "dcgm-exporter": "DCGM metrics exporter",
    "nvidia-fabricmanager": "NVSwitch fabric manager: without it the GPUs lose NVLink",
    "nv-fabricmanager": "NVSwitch fabric manager: without it the GPUs lose NVLink",
    "nvidia-imex": "IMEX daemon (multi-node NVLink memory export)",
    "nvidia-gridd": "vGPU licensing daemon",
    "nvidia-topologyd": "vGPU topology daemon",
    "nvlsm": "NVLink subnet manager",
    # MPS: the control daemon starts a server that holds GPU memory for all its clients. Killing the server breaks
    # every MPS client and the daemon starts another; the memory assertion names it instead (stop MPS with `quit`).
    "nvidia-cuda-mps-control": "CUDA MPS control daemon",
    "nvidia-cuda-mps-server": "CUDA MPS server, owned by its control daemon: stop MPS with its quit command",
    # Kubernetes: the device plugin, feature discovery and the GPU Operator's validators and MIG manager
    "nvidia-device-plugin": "Kubernetes device plugin",
    "gpu-feature-discovery": "Kubernetes GPU feature discovery",
    "nvidia-validator": "GPU Operator validator",
    "nvidia-mig-manager": "GPU Operator MIG manager",
    "nvidia-mig-parted": "MIG partition editor",
    "Xorg": "display server", "Xwayland": "display server", "sshd": "remote access", "systemd": "service manager",
    "containerd-shim": "container runtime", "containerd": "container runtime", "dockerd": "container runtime",
    # Ansible controllers on a local connection: an async task's module is detached from them, so they are not its
    # ancestors, yet they run the play (and inherit whatever fds their shell held).
    "ansible-playbook": "Ansible controller", "ansible": "Ansible controller", "ansible-pull": "Ansible controller",
}
BUILTIN_PROTECTED_NAMES = tuple(PROTECTED_DAEMONS)
COMM_LENGTH = 15  # the kernel cuts comm to TASK_COMM_LEN - 1


@dataclass(frozen=True)
class DeviceNode:
    path: str
    fd_key: tuple  # what an open fd is compared by
    map_key: tuple  # (st_dev, st_ino) as /proc/<pid>/maps shows a mapping of this file
    gpu_minor: int | None  # None for nodes shared by all GPUs (nvidiactl, nvidia-uvm, caps)


def device_nodes(patterns: list[str], gpu_major: int = NVIDIA_MAJOR) -> list[DeviceNode]:
    nodes = {}
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat_mode.S_ISDIR(info.st_mode) or path in nodes:
                continue
            nodes[path] = _device_node(path, info, gpu_major)
    return list(nodes.values())


def _device_node(path: str, info: os.stat_result, gpu_major: int) -> DeviceNode:
    is_device = stat_mode.S_ISCHR(info.st_mode) or stat_mode.S_ISBLK(info.st_mode)
    if is_device:
        fd_key = ("rdev", info.st_rdev)
        per_gpu = os.major(info.st_rdev) == gpu_major and os.minor(info.st_rdev) < FIRST_SHARED_MINOR
        gpu_minor = os.minor(info.st_rdev) if per_gpu else None
    else:
        # stand-in files (simulated nodes, tests): the per-GPU ones are named nvidia<minor>
        fd_key = ("inode", info.st_dev, info.st_ino)
        match = GPU_NODE_NAME.match(os.path.basename(path))
        gpu_minor = int(match.group(1)) if match else None
    return DeviceNode(path, fd_key, (info.st_dev, info.st_ino), gpu_minor)


def fd_key_of(info: os.stat_result) -> tuple:
    if stat_mode.S_ISCHR(info.st_mode) or stat_mode.S_ISBLK(info.st_mode):
        return ("rdev", info.st_rdev)
    return ("inode", info.st_dev, info.st_ino)


def parse_maps_identities(text: str) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of every file-backed mapping in /proc/<pid>/maps."""
    found = set()
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[4] == "0":
            continue
        major, _colon, minor = fields[3].partition(":")
        found.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
    return found


@dataclass
class Holding:
    pid: int
    via: set[str] = field(default_factory=set)  # fd, mmap, nvml
    devices: set[str] = field(default_factory=set)
    gpus: set[int] = field(default_factory=set)  # NVML indexes NVML lists this process on


@dataclass
class ScanResult:
    holdings: dict[int, Holding] = field(default_factory=dict)
    unreadable: Counter = field(default_factory=Counter)  # /proc entries that could not be read, by reason
    minor_by_path: dict[str, int | None] = field(default_factory=dict)
    blocked: dict[int, str] = field(default_factory=dict)  # pid -> the read (files, maps) that blocked past its time box
    denied: set[int] = field(default_factory=set)  # pids whose open files or mappings the kernel refused to show (EACCES)


FILES_STAGE, MAPS_STAGE = 1, 2
SCAN_STAGES = {0: "files", FILES_STAGE: "files", MAPS_STAGE: "maps"}


def _holding_value(holding: Holding) -> dict:
    return {"via": sorted(holding.via), "devices": sorted(holding.devices)}


class HolderScanner:
    """Finds which processes hold any of `nodes` open or mapped."""

    def __init__(self, nodes: list[DeviceNode], reader: ProcReader | None = None):
        self.reader = reader or ProcReader()
        self.by_fd_key = {node.fd_key: node for node in nodes}
        self.by_map_key = {node.map_key: node for node in nodes}
        self.minor_by_path = {node.path: node.gpu_minor for node in nodes}
        self.paths = {node.path for node in nodes}
        self.map_tokens = {f" {node.map_key[1]} ".encode() for node in nodes}

    def scan(self, pids: list[int] | None = None) -> ScanResult:
        """Every process's files and mappings, read in a child process: a process whose /proc entries block the read
        (a wedged thread holding its memory map's lock, a file on a hung mount) is given up after a time box, counted
        in `unreadable` as files_blocked or maps_blocked and recorded in `blocked`, with what was found before."""
        result = ScanResult(minor_by_path=self.minor_by_path)
        pids = pid_directories(self.reader.root) if pids is None else list(pids)
        found: dict[int, dict] = {}
        outcome = bounded.run_pass(pids, self._scan_item)
        for index, value in outcome.values:
            found[pids[index]] = value  # the last word on a process wins: its final outcome, or what it found before blocking
        for index, stage in outcome.blocked.items():
            pid = pids[index]
            result.blocked[pid] = SCAN_STAGES[stage]
            result.unreadable[f"{SCAN_STAGES[stage]}_blocked"] += 1
            self.reader.blocked.setdefault(pid, set()).add(SCAN_STAGES[stage])
        for pid, value in found.items():
            if value.get("unreadable"):
                result.unreadable[value["unreadable"]] += 1
            if value.get("unreadable") == PERMISSION_DENIED:
                result.denied.add(pid)
            if value["via"]:
                result.holdings[pid] = Holding(pid, set(value["via"]), set(value["devices"]))
        return result

    def _scan_item(self, pid: int, send, stage) -> None:
        """One process, in the scanning child: what it holds by fd is sent before its maps are read (which can block)."""
        holding = Holding(pid)
        reason = None
        sent = False

        def found(partial: Holding) -> None:
            nonlocal sent
            send(_holding_value(partial))
            sent = True

        try:
            state = self.reader.stat(pid).state
            base = self._live_view(pid, state)
            stage(FILES_STAGE)
            if self._scan_fds(base, holding, found):
                reason = PERMISSION_DENIED  # the maps may still show a holding: read them all the same
            stage(MAPS_STAGE)
            if state == "D":
                reason = reason or "maps_skipped_uninterruptible"  # reading maps can block on a wedged task
            else:
                self._scan_maps(base, holding)
        except (ProcessGone, FileNotFoundError, ProcessLookupError):
            reason, holding = "vanished", Holding(pid)
        except PermissionError:
            reason = PERMISSION_DENIED
        except (ValueError, IndexError):
            reason, holding = "unparsable", Holding(pid)
        if holding.via or reason or sent:  # the rest hold nothing: nothing to send
            send(dict(_holding_value(holding), unreadable=reason))

    def scan_process(self, pid: int, unreadable: Counter) -> Holding | None:
        """One process's holding (None when it holds nothing), its unreadable reasons added to `unreadable`."""
        single = self.scan([pid])
        unreadable.update(single.unreadable)
        return single.holdings.get(pid)

    def _live_view(self, pid: int, state: str) -> str:
        """/proc directory showing the process's files and mappings.

        A zombie leader has dropped its own view of them, but its live threads still hold them:
        read those through one of the threads (fuser misses such holders).
        """
        if state in EXITED_STATES:
            for tid in sorted(os.listdir(self.reader.path(pid, "task"))):
                if tid != str(pid):
                    return self.reader.path(pid, "task", tid)
        return self.reader.path(pid)

    def _scan_fds(self, base: str, holding: Holding, found=None) -> int:
        """`found(holding)` after each device found: stat() of a later descriptor may block (a file on a hung mount).
        Returns how many descriptors the kernel refused to show (EACCES: no CAP_SYS_PTRACE over the process, an LSM):
        any of them may be a GPU's, so the caller never reads that as "holds nothing"."""
        # stat each descriptor relative to the open fd directory: a one-component lookup instead of a /proc path walk
        directory = os.open(os.path.join(base, "fd"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

        def named_a_device(name: str) -> bool:
            try:  # readlink names the file without asking its file system, which may never answer
                return os.readlink(name, dir_fd=directory) in self.paths
            except OSError:
                return False
        denied = 0
        try:
            # descriptors named as a device first: a file on a hung mount opened earlier cannot hide them
            for name in sorted(os.listdir(directory), key=lambda name: not named_a_device(name)):
                try:
                    info = os.stat(name, dir_fd=directory)
                except PermissionError:
                    denied += 1
                    continue
                except OSError:
                    continue  # closed meanwhile, or a dangling anon inode
                node = self.by_fd_key.get(fd_key_of(info))
                if node is not None and node.path not in holding.devices:
                    holding.via.add("fd")
                    holding.devices.add(node.path)
                    if found is not None:
                        found(holding)
        finally:
            os.close(directory)
        return denied

    def _scan_maps(self, base: str, holding: Holding) -> None:
        text = read_file(os.path.join(base, "maps"))
        # most processes map none of the nodes: a substring test on their inode numbers skips the parse
        if not any(token in text for token in self.map_tokens):
            return
        for identity in parse_maps_identities(text.decode("utf-8", errors="replace")):
            node = self.by_map_key.get(identity)
            if node is not None:
                holding.via.add("mmap")
                holding.devices.add(node.path)


def in_init_pid_namespace() -> bool:
    """Whether this process sees the host's PIDs, as NVML reports them. Where that cannot be read, it is not assumed:
    NVML's PIDs are then used for nothing (the device files found by fd and mmap decide alone)."""
    try:
        return os.readlink("/proc/self/ns/pid") == INIT_PID_NAMESPACE
    except OSError:
        return False


def missing_scan_capabilities(status: dict[str, str]) -> list[str]:
    """The capabilities a complete scan needs that this process lacks (from its /proc/self/status): without
    CAP_SYS_PTRACE the kernel refuses to show the open files of every process this one may not ptrace (another user's,
    or root's with capabilities it lacks), so no scan can say "no holder"."""
    effective = int(status.get("CapEff", "0") or "0", 16)
    return [] if effective & (1 << CAP_SYS_PTRACE) else ["CAP_SYS_PTRACE"]


def protected_name(comm: str, exe: str | None, names: list[str]) -> str | None:
    """The protected name this process carries as executable name or, failing that, as comm (cut at 15 characters:
    names sharing their first 15 characters are told apart by the executable only)."""
    exe_name = os.path.basename(exe.removesuffix(" (deleted)")) if exe else None
    if exe_name in names:
        return exe_name
    return next((name for name in names if comm == name[:COMM_LENGTH]), None)


@dataclass
class Guard:
    """Processes that are never signalled, with the reason reported for each."""

    names: list[str]
    self_pid: int
    ancestors: set[int]
    descendants: set[int]
    pids: set[int] = field(default_factory=set)

    def reason(self, info: dict, is_kernel_thread: bool) -> str | None:
        pid = info["pid"]
        if pid == 1:
            return "PID 1"
        if is_kernel_thread:
            return "kernel thread"
        if pid == self.self_pid:
            return "this module's own process"
        if pid in self.ancestors:
            return "ancestor of this module (the connection or command that runs it)"
        if pid in self.descendants:
            return "child of this module"
        if pid in self.pids:
            return "listed in protected_pids"
        name = protected_name(info["comm"], info["exe"], self.names)
        if not name:
            return None
        why = PROTECTED_DAEMONS.get(name)
        return f"protected name {name} ({why})" if why else f"protected name {name}"


@dataclass
class NvmlProcess:
    gpu: int
    pid: int
    used_mib: int | None
    kind: str


@dataclass
class KillPlan:
    holders: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)
    protected: list[dict] = field(default_factory=list)
    stale_nvml_pids: list[dict] = field(default_factory=list)
    ambiguous: list[dict] = field(default_factory=list)
    outside: list[dict] = field(default_factory=list)  # outside the units being stopped, left alone (report) or refused (fail)
    restarting: list[dict] = field(default_factory=list)  # in another service systemd would restart: refused
    foreign: list[dict] = field(default_factory=list)  # outside the units and not the engines' users', whatever was done with them
    kept: list[dict] = field(default_factory=list)  # a parked engine's: never signalled
    escaped_parents: list[dict] = field(default_factory=list)  # of the engines' escaped workers: signalled with them, first
    # processes whose open files could not all be read (a read blocked past its time box, or the kernel refused it) and
    # in which nothing was found: they may hold a GPU, so the run fails closed naming them (never "no holder")
    possible: list[dict] = field(default_factory=list)
    missing_capabilities: list[str] = field(default_factory=list)  # what this process lacks for a complete scan
    unreadable: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    inventory: dict | None = None  # NVML's reading the plan was made from (None: not queried)


# why a process is a possible holder (possible_holders' `why`)
BLOCKED_WHY = "reading its open files blocked past the time box (a file on a hung mount) before every descriptor was seen"
DENIED_WHY = "the kernel refused to show its open files (permission denied: no CAP_SYS_PTRACE over it, an LSM or hidepid)"


def cross_check_nvml(listed: list[NvmlProcess], scanner: HolderScanner, scan: ScanResult, reader: ProcReader) -> list[dict]:
    """Add NVML-listed PIDs that /proc confirms as holders; return the ones it does not (stale)."""
    stale = []
    for process in listed:
        holding = scan.holdings.get(process.pid)
        if holding is None and process.pid > 1 and reader.is_process(process.pid):
            holding = scanner.scan_process(process.pid, scan.unreadable)
            if holding is not None:
                scan.holdings[process.pid] = holding
        if holding is None:
            stale.append({"pid": process.pid, "gpu": process.gpu, "used_mib": process.used_mib,
                          "reason": _stale_reason(process.pid, reader)})
            continue
        holding.via.add("nvml")
        holding.gpus.add(process.gpu)
    return stale


def _stale_reason(pid: int, reader: ProcReader) -> str:
    if pid <= 1 or pid > PID_MAX_LIMIT:
        return IMPLAUSIBLE_PID
    try:
        status = reader.status(pid)
        state = reader.stat(pid).state
    except (ProcessGone, PermissionError, ValueError, IndexError):
        return "no such process"
    if status.get("Tgid") != str(pid):
        return "a thread id, not a process"
    if state in EXITED_STATES and reader.thread_count(pid) <= 1:
        return "exited (a zombie its parent has not reaped)"
    return "PID now belongs to a process that holds no GPU device (reused)"


def plan_kill(scan: ScanResult, reader: ProcReader, guard: Guard, minor_to_index: dict[int, int] | None,
              selected_minors: set[int] | None, selected_indexes: set[int] | None, uuid_by_index: dict[int, str] | None = None) -> KillPlan:
    """Describe every holder of the selected GPUs and split them into targets, protected and ambiguous. Each holder
    names its GPUs by NVML index and, where NVML was asked, by UUID (an index can change across reboots, a UUID not)."""
    plan = KillPlan(unreadable=dict(scan.unreadable))
    unseen = {pid: BLOCKED_WHY for pid, stage in scan.blocked.items() if stage == "files"}
    unseen.update({pid: DENIED_WHY for pid in scan.denied})
    for pid in sorted(unseen):
        if pid in scan.holdings:
            continue
        try:
            info = describe(reader, pid)
            if guard.reason(info, reader.stat(pid).is_kernel_thread) is None:
                blocked = sorted(reader.blocked.get(pid) or ({scan.blocked[pid]} if pid in scan.blocked else set()))
                plan.possible.append(dict(info, why=unseen[pid], **({"blocked_reads": blocked} if blocked else {})))
        except (ProcessGone, PermissionError, ValueError, IndexError):
            continue  # gone since: it holds nothing
    for pid in sorted(scan.holdings):
        holding = scan.holdings[pid]
        node_gpus = _node_gpus(holding, scan, minor_to_index)
        verdict = _selection(holding, scan, node_gpus, selected_minors, selected_indexes)
        if verdict == "outside":
            continue
        try:
            info = describe(reader, pid)
            is_kernel_thread = reader.stat(pid).is_kernel_thread
        except (ProcessGone, PermissionError):
            plan.unreadable["vanished"] = plan.unreadable.get("vanished", 0) + 1
            continue
        # a CUDA process opens every visible GPU's node: NVML's list says which GPUs it really uses
        gpus = holding.gpus or node_gpus
        info.update(via=sorted(holding.via), devices=sorted(holding.devices), gpus=sorted(gpus),
                    gpu_uuids=[uuid_by_index[index] for index in sorted(gpus) if index in (uuid_by_index or {})])
        plan.holders.append(info)
        reason = guard.reason(info, is_kernel_thread)
        if reason:
            plan.protected.append(dict(info, reason=reason))
        elif verdict == "ambiguous":
            plan.ambiguous.append(dict(info, reason="holds device nodes of selected and other GPUs and NVML lists it on none: not signalled"))
        else:
            plan.targets.append(info)
    return plan


def _minors(holding: Holding, scan: ScanResult) -> set[int]:
    return {scan.minor_by_path[path] for path in holding.devices if scan.minor_by_path.get(path) is not None}


def _node_gpus(holding: Holding, scan: ScanResult, minor_to_index: dict[int, int] | None) -> set[int]:
    if minor_to_index is None:
        return set()
    return {minor_to_index[minor] for minor in _minors(holding, scan) if minor in minor_to_index}


def _selection(holding: Holding, scan: ScanResult, node_gpus: set[int], selected_minors: set[int] | None,
               selected_indexes: set[int] | None) -> str:
    """'target', 'outside' or 'ambiguous' for a GPU selection.

    Measured on H200s: a CUDA process holds /dev/nvidiaN of every GPU it can see, not only of those it uses, so a
    device node alone does not place a process on a GPU. NVML's list does; a holder NVML does not list (a forked
    child, an mmap-only holder) is placed by its nodes only when they all belong to the selection.
    """
    if selected_minors is None:
        return "target"
    selected = selected_indexes or set()
    if holding.gpus:
        return "target" if holding.gpus & selected else "outside"
    minors = _minors(holding, scan)
    if not minors & selected_minors:
        return "outside"
    return "target" if minors <= selected_minors else "ambiguous"
