# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Reading processes from /proc: identity (pid, start time), state, ancestry, owning unit.

Reads that can block on a wedged process (cmdline, maps) are skipped for tasks in D state,
and every read tolerates the process vanishing or being unreadable.
"""

from __future__ import annotations

import functools
import os
import pwd
import signal
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils import _bounded as bounded
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

PF_KTHREAD = 0x00200000  # include/linux/sched.h
KTHREADD_PID = 2
UNIT_SUFFIXES = (".service", ".scope")
# States where the task is gone for our purposes unless other threads of its group live.
EXITED_STATES = ("Z", "X", "x")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    start_time: int  # clock ticks after boot: with pid, the process identity

    @property
    def is_kernel_thread(self) -> bool:
        # the kernel's own flag; PID 2 (kthreadd) and its children only where no flags were read: inside a PID namespace
        # PID 2 is an ordinary process
        return bool(self.flags & PF_KTHREAD) or (not self.flags and KTHREADD_PID in (self.pid, self.ppid))


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat; comm may hold spaces and parentheses, so split at the last ')'."""
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    fields = text[close_paren + 2:].split()
    return ProcStat(
        pid=int(text[:open_paren]),
        comm=text[open_paren + 1:close_paren],
        state=fields[0],
        ppid=int(fields[1]),
        flags=int(fields[6]),
        start_time=int(fields[19]),
    )


def parse_status(text: str) -> dict[str, str]:
    status = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            status[key] = value.strip()
    return status


def parse_cgroup_path(text: str) -> str | None:
    """The process's cgroup in systemd's hierarchy, from /proc/<pid>/cgroup: the named v1 one on legacy/hybrid
    hosts, the unified one otherwise."""
    paths = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    return paths.get("name=systemd") or paths.get("") or None


def parse_cgroup_unit(text: str) -> str | None:
    """The innermost systemd unit (service or scope) in /proc/<pid>/cgroup."""
    path = parse_cgroup_path(text) or ""
    for component in reversed(path.split("/")):
        if component.endswith(UNIT_SUFFIXES):
            return component
    return None


READ_SIZE = 65536


def read_file(path: str) -> bytes:
    """os-level read: Python's open() adds an fstat and an ioctl per file, which a scan of every process pays for."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, READ_SIZE)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def own_status() -> dict[str, str]:
    """This process's own /proc/self/status (its capabilities, its namespace PIDs), whatever tree a reader reads."""
    return parse_status(read_file("/proc/self/status").decode("utf-8", errors="replace"))


def pid_directories(proc_root: str = "/proc") -> list[int]:
    return [int(name) for name in os.listdir(proc_root) if name.isdigit()]


class ProcReader:
    """Reads one /proc tree. Every method raises ProcessGone when the process no longer exists."""

    def __init__(self, root: str = "/proc"):
        self.root = root
        # pid -> the reads of its entries that blocked past their time box (a wedged process): not tried again
        self.blocked: dict[int, set[str]] = {}

    def path(self, pid: int, *parts: str) -> str:
        return os.path.join(self.root, str(pid), *parts)

    def _read(self, pid: int, name: str, binary: bool = False):
        try:
            data = read_file(self.path(pid, name))
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        return data if binary else data.decode("utf-8", errors="replace")

    def stat(self, pid: int) -> ProcStat:
        text = self._read(pid, "stat")
        if not text:
            raise ProcessGone(pid)
        return parse_stat(text)

    def status(self, pid: int) -> dict[str, str]:
        return parse_status(self._read(pid, "status"))

    def cmdline(self, pid: int, state: str) -> list[str] | None:
        """argv, or None when skipped or given up: reading it takes the process's memory map lock, which a task in D
        state, or any thread of a wedged process, may hold (or wait for) forever."""
        if state == "D" or pid in self.blocked:
            return None
        try:
            finished, raw = bounded.call_boxed(lambda: self._read(pid, "cmdline", binary=True))
        except PermissionError:
            return None
        if not finished:
            self.blocked.setdefault(pid, set()).add("cmdline")
            return None
        return [arg.decode("utf-8", errors="replace") for arg in raw.split(b"\0")[:-1]] if raw else []

    def exe(self, pid: int) -> str | None:
        try:
            return os.readlink(self.path(pid, "exe"))
        except FileNotFoundError:
            # no executable: a kernel thread or a zombie; a vanished process shows in stat()
            return None
        except (PermissionError, ProcessLookupError, OSError):
            return None

    def unit(self, pid: int) -> str | None:
        try:
            return parse_cgroup_unit(self._read(pid, "cgroup"))
        except (ProcessGone, PermissionError):
            return None

    def cgroup(self, pid: int) -> str | None:
        try:
            return parse_cgroup_path(self._read(pid, "cgroup"))
        except (ProcessGone, PermissionError):
            return None

    def thread_count(self, pid: int) -> int:
        try:
            return len(os.listdir(self.path(pid, "task")))
        except (FileNotFoundError, ProcessLookupError):
            return 0
        except PermissionError:
            return 1

    def wchan(self, pid: int) -> str | None:
        try:
            return self._read(pid, "wchan") or None
        except (ProcessGone, PermissionError):
            return None

    def start_time(self, pid: int) -> int | None:
        try:
            return self.stat(pid).start_time
        except (ProcessGone, PermissionError, ValueError, IndexError):
            return None

    def thread_group_alive(self, pid: int, start_time: int) -> bool:
        """True while any thread of the process lives; a zombie leader with live threads is alive."""
        try:
            stat = self.stat(pid)
        except (ProcessGone, ValueError, IndexError):
            return False
        if stat.start_time != start_time:
            return False  # the PID now names another process
        if stat.state not in EXITED_STATES:
            return True
        return self.thread_count(pid) > 1

    def ancestors(self, pid: int) -> list[ProcStat]:
        """pid's parent chain up to (excluding) PID 0; stops quietly where /proc cannot be read."""
        chain = []
        seen = set()
        current = pid
        while current > 0 and current not in seen:
            seen.add(current)
            try:
                stat = self.stat(current)
            except (ProcessGone, PermissionError, ValueError, IndexError):
                break
            chain.append(stat)
            current = stat.ppid
        return chain[1:]

    def descendants(self, pid: int) -> set[int]:
        """Every live descendant of pid (by parent links), e.g. the module's own NVML worker."""
        children: dict[int, list[int]] = {}
        for other in pid_directories(self.root):
            try:
                children.setdefault(self.stat(other).ppid, []).append(other)
            except (ProcessGone, PermissionError, ValueError, IndexError):
                continue
        found: set[int] = set()
        pending = [pid]
        while pending:
            for child in children.get(pending.pop(), []):
                if child not in found:
                    found.add(child)
                    pending.append(child)
        return found

    def is_process(self, pid: int) -> bool:
        """A thread id has a /proc entry too (not listed, but readable): require Tgid == pid."""
        try:
            return self.status(pid).get("Tgid") == str(pid)
        except (ProcessGone, PermissionError):
            return False


class ProcessGone(Exception):
    def __init__(self, pid: int):
        super().__init__(f"process {pid} no longer exists")
        self.pid = pid


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int


def describe(reader: ProcReader, pid: int) -> dict:
    """The report of one process: identity, names, owner, unit, state. Raises ProcessGone."""
    stat = reader.stat(pid)
    try:
        status = reader.status(pid)
    except PermissionError:
        status = {}
    uid = status.get("Uid", "").split()
    info = {
        "pid": pid,
        "start_time": stat.start_time,
        "comm": stat.comm,
        "exe": reader.exe(pid),
        "cmdline": reader.cmdline(pid, stat.state),
        "uid": int(uid[0]) if uid else None,
        "user": user_name(int(uid[0])) if uid else None,
        "state": stat.state,
        "ppid": stat.ppid,
        "unit": reader.unit(pid),
        "cgroup": reader.cgroup(pid),
        "namespace_pid": namespace_pid(status),
    }
    if pid in reader.blocked:
        info["blocked_reads"] = sorted(reader.blocked[pid])  # given up: a wedged process (cmdline then reads None)
    return info


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The account name of a uid, or the number itself where no account has it (a container's own users)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner_uid(owner) -> int | None:
    """The uid of an engine's user, by name or number; None for a name no account has (it owns no process)."""
    text = str(owner)
    if not text or not text.isprintable() or any(char in text for char in ":/ "):
        raise InvalidInput(f"owners: {owner!r} is not a user name or uid")
    if text.isdigit():
        uid = int(text)
    else:
        try:
            uid = pwd.getpwnam(text).pw_uid
        except KeyError:
            return None
    if uid == 0:
        raise InvalidInput("owners: root owns the system's own processes; give the engines' own users (for example vllm, sglang)")
    return uid


def namespace_pid(status: dict) -> int | None:
    """The PID a process has inside its own PID namespace (a container's view), when that is not ours."""
    nspids = status.get("NSpid", "").split()
    return int(nspids[-1]) if len(nspids) > 1 else None


def signal_names(mask: int) -> list[str]:
    """A /proc signal mask (bit N-1 set = signal N pending) as names: a pending SIGKILL is the mark of an unkillable task."""
    names = []
    for number in range(1, 65):
        if mask & (1 << (number - 1)):
            try:
                names.append(signal.Signals(number).name)
            except ValueError:
                names.append(f"SIG{number}")
    return names


def survivor_details(reader: ProcReader, pid: int) -> dict:
    """Why a process may still be there: state (D = uninterruptible), kernel wait channel, pending signals."""
    details = {"wchan": reader.wchan(pid)}
    try:
        status = reader.status(pid)
    except (ProcessGone, PermissionError):
        return details
    pending = int(status.get("SigPnd", "0") or "0", 16) | int(status.get("ShdPnd", "0") or "0", 16)
    details["signals_pending"] = signal_names(pending)
    details["threads"] = int(status.get("Threads", "0") or 0)
    return details
