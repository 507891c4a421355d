# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A unit's control group on whichever hierarchy the host mounts (v2, hybrid or v1): its processes read, and every one
of them SIGKILLed - through cgroup.kill where the kernel has it (atomic, forks included), otherwise by re-reading the
group and killing by pidfd until it stays empty."""

from __future__ import annotations

import errno
import os
import signal

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcessIdentity, ProcReader, describe
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller


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
