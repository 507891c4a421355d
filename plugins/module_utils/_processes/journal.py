# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The signal journal: a line before each signal is sent and a line with its outcome, appended to a node-local file.

Each line is one write(2) on a file opened O_APPEND, so it is on the node as soon as the call returns: a module
killed between two signals, or a controller gone mid-run, still leaves the record of every signal it began to send.
"""

from __future__ import annotations

import json
import os
import socket
import time

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader

DEFAULT_PATH = paths.SIGNAL_JOURNAL


class JournalUnwritable(Error):
    """The journal file cannot be written: nothing may be signalled without its record."""


def new_run_id(module: str) -> str:
    """A run id for a module run that was given none: unique on the node, and says where it came from."""
    return f"{module}-{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


class Journal:
    """Records every signal this run sends (``entries``, for the module result) and appends them to ``path``.

    ``path`` None keeps the records in the result only. ``open`` is called before the first signal, so that a
    journal that cannot be written refuses the run before anything is signalled.
    """

    def __init__(self, path: str | None, run_id: str, module: str, reader: ProcReader | None = None, wall=time.time):
        self.path = path
        self.run_id = run_id
        self.module = module
        self.reader = reader or ProcReader()
        self.wall = wall
        self.entries: list[dict] = []
        self._fd: int | None = None
        self._cut = False  # the file ends in a line cut short
        self._subjects: dict[tuple[int, int], dict] = {}

    def open(self) -> Journal:
        if self.path is None or self._fd is not None:
            return self
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
            size = os.fstat(self._fd).st_size
            # a line cut short before (a crash mid-write): the next one starts a line of its own, never glued to it
            self._cut = size > 0 and os.pread(self._fd, 1, size - 1) != b"\n"
        except OSError as exc:
            raise JournalUnwritable(f"the signal journal {self.path} cannot be written ({exc.strerror or exc}): nothing was signalled. "
                                    "Give a writable journal_path", journal_path=self.path) from None
        return self

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def subject(self, pid: int, start_time: int) -> dict:
        """Who is signalled: exe, cgroup and uid, read once per process (before its first signal)."""
        key = (pid, start_time)
        if key not in self._subjects:
            subject = {"exe": None, "cgroup": None, "uid": None, "comm": None}
            try:
                stat = self.reader.stat(pid)
                subject["comm"] = stat.comm
                subject["exe"] = self.reader.exe(pid)
                subject["cgroup"] = self.reader.cgroup(pid)
                uid = self.reader.status(pid).get("Uid", "").split()
                subject["uid"] = int(uid[0]) if uid else None
            except (ProcessGone, PermissionError, OSError):
                pass  # gone meanwhile: the signal's outcome says so
            self._subjects[key] = subject
        return self._subjects[key]

    def intent(self, pid: int, start_time: int, signal_name: str, via: str) -> dict:
        """Written before the signal is sent; returns the record that ``outcome`` completes."""
        record = {"time": round(self.wall(), 6), "run_id": self.run_id, "module": self.module, "pid": pid, "start_time": start_time,
                  **self.subject(pid, start_time), "signal": signal_name, "via": via}
        self._append(dict(record, phase="intent"))
        return record

    def outcome(self, record: dict, result: str) -> dict:
        """Written after the signal: the signal is sent, so a write that fails now is noted, never a reason to stop
        halfway through a group."""
        done = dict(record, result=result, outcome_time=round(self.wall(), 6))
        try:
            self._append(dict(done, phase="outcome"))
        except JournalUnwritable as exc:
            done["journal_error"] = exc.msg
        self.entries.append(done)
        return done

    def _append(self, line: dict) -> None:
        if self.path is None:
            return
        self.open()
        data = ("\n" if self._cut else "").encode() + (json.dumps(line, sort_keys=True) + "\n").encode()
        try:
            size = os.fstat(self._fd).st_size
            written = os.write(self._fd, data)
            if written != len(data):
                # a full disk takes part of a line: taken back, so that no later line is glued to the half one
                os.ftruncate(self._fd, size)
                raise OSError("short write")
            self._cut = False
        except OSError as exc:
            raise JournalUnwritable(f"the signal journal {self.path} could not be written ({exc.strerror or exc}): "
                                    f"stopped before sending {line['signal']} to pid {line['pid']}", journal_path=self.path) from None


def read(path: str, run_id: str | None = None) -> list[dict]:
    """The journal's lines (of one run); a line cut by a crash mid-write is skipped."""
    lines = []
    try:
        with open(path, encoding="utf-8") as handle:
            for text in handle:
                try:
                    line = json.loads(text)
                except ValueError:
                    continue
                if run_id is None or line.get("run_id") == run_id:
                    lines.append(line)
    except FileNotFoundError:
        pass
    return lines
