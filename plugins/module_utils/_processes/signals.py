# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Signalling processes by identity, never by a bare PID that may have been reused.

A target is (pid, start time). Where the kernel has pidfds, the pidfd is opened first and the
start time re-read after: if it still matches, the pidfd is bound to the process we classified
and every signal goes through it, so a recycled PID can never be hit. Without pidfds the start
time is re-checked just before each kill(); the window left is documented in the modules.
"""

from __future__ import annotations

import errno
import os
import select
import signal
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessIdentity, ProcReader, survivor_details

FALLBACK_POLL_SECONDS = 0.02
# pidfd_open errors meaning "this PID is not a live process" (an exiting task can give EINVAL, sglang #26964).
GONE_ERRNOS = (errno.ESRCH, errno.EINVAL, errno.ENOENT)


def pidfds_supported() -> bool:
    """Probe the running kernel (and seccomp policy) rather than trusting version numbers."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


@dataclass
class ProcessHandle:
    identity: ProcessIdentity
    fd: int | None = None

    @property
    def pid(self) -> int:
        return self.identity.pid


@dataclass
class SignalOutcome:
    terminated: list[ProcessIdentity] = field(default_factory=list)  # exited after SIGTERM
    killed: list[ProcessIdentity] = field(default_factory=list)  # needed SIGKILL
    survivors: list[ProcessIdentity] = field(default_factory=list)
    not_signalled: list[dict] = field(default_factory=list)  # exited or reused before the first signal
    signals: list[dict] = field(default_factory=list)  # audit trail: every signal sent and its result


class Signaller:
    """The only place that sends signals; tests may subclass it to inject races."""

    def __init__(self, reader: ProcReader | None = None, use_pidfd: bool | None = None, clock: Clock | None = None,
                 journal: Journal | None = None):
        self.reader = reader or ProcReader()
        self.use_pidfd = pidfds_supported() if use_pidfd is None else use_pidfd
        self.clock = clock or Clock()
        # every signal is recorded before it is sent and again with its outcome
        self.journal = journal or Journal(None, "-", "-", self.reader)

    def open(self, identity: ProcessIdentity) -> tuple[str, ProcessHandle | None]:
        """('open', handle), ('gone', None) or ('reused', None)."""
        if identity.pid <= 1:
            raise ValueError(f"refusing to signal PID {identity.pid}")
        fd = None
        if self.use_pidfd:
            try:
                fd = os.pidfd_open(identity.pid)
            except OSError as exc:
                if exc.errno in GONE_ERRNOS:
                    return "gone", None
                fd = None  # EMFILE, EPERM: degrade to the start-time check for this process
        current = self.reader.start_time(identity.pid)
        if current != identity.start_time:
            if fd is not None:
                os.close(fd)
            return ("gone" if current is None else "reused"), None
        return "open", ProcessHandle(identity, fd)

    def send(self, handle: ProcessHandle, signum: int) -> str:
        """'sent', 'gone' (already exited, nothing signalled) or 'denied' (EPERM), journalled before and after."""
        record = self.journal.intent(handle.pid, handle.identity.start_time, signal.Signals(signum).name,
                                     "pidfd" if handle.fd is not None else "kill")
        return self.journal.outcome(record, self._send(handle, signum))["result"]

    def _send(self, handle: ProcessHandle, signum: int) -> str:
        try:
            if handle.fd is not None:
                signal.pidfd_send_signal(handle.fd, signum)
            else:
                if self.reader.start_time(handle.pid) != handle.identity.start_time:
                    return "gone"
                os.kill(handle.pid, signum)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "denied"
        return "sent"

    def alive(self, handle: ProcessHandle) -> bool:
        if handle.fd is not None:
            readable = select.select([handle.fd], [], [], 0)[0]
            return not readable
        return self.reader.thread_group_alive(handle.pid, handle.identity.start_time)

    def wait(self, handles: list[ProcessHandle], deadline: Deadline) -> list[ProcessHandle]:
        """Wait until every handle's whole thread group has exited, or the deadline; return the living."""
        living = [handle for handle in handles if self.alive(handle)]
        while living and not deadline.expired():
            with_fd = [handle for handle in living if handle.fd is not None]
            if with_fd and len(with_fd) == len(living):
                poller = select.poll()
                for handle in with_fd:
                    poller.register(handle.fd, select.POLLIN)
                poller.poll(max(1, int(deadline.remaining() * 1000)))
            else:
                self.clock.sleep(min(FALLBACK_POLL_SECONDS, deadline.remaining()))
            living = [handle for handle in living if self.alive(handle)]
        return living

    def close(self, handles: list[ProcessHandle]) -> None:
        for handle in handles:
            if handle.fd is not None:
                os.close(handle.fd)
                handle.fd = None


def terminate_then_kill(signaller: Signaller, targets: list[ProcessIdentity], term_timeout: float, kill_timeout: float) -> SignalOutcome:
    """SIGTERM (+SIGCONT, so stopped processes act on it), wait, SIGKILL the rest, wait; all bounded."""
    outcome = SignalOutcome()
    handles = []
    for identity in targets:
        result, handle = signaller.open(identity)
        if handle is None:
            outcome.not_signalled.append({"pid": identity.pid, "start_time": identity.start_time,
                                          "reason": "exited before signal" if result == "gone" else "pid reused by another process"})
        else:
            handles.append(handle)
    try:
        term_sent = _send_all(signaller, handles, signal.SIGTERM, outcome)
        for handle in term_sent:
            _record(outcome, handle, signal.SIGCONT, signaller.send(handle, signal.SIGCONT))
        living = signaller.wait(term_sent, Deadline(term_timeout, signaller.clock))
        outcome.terminated = [handle.identity for handle in term_sent if handle not in living]
        living += [handle for handle in handles if handle not in term_sent and signaller.alive(handle)]
        kill_sent = _send_all(signaller, living, signal.SIGKILL, outcome)
        still_living = signaller.wait(kill_sent, Deadline(kill_timeout, signaller.clock))
        outcome.killed = [handle.identity for handle in kill_sent if handle not in still_living]
        not_reached = [handle for handle in living if handle not in kill_sent]
        denied = [handle for handle in not_reached if signaller.alive(handle)]
        # exited on its own between the SIGTERM deadline and our SIGKILL: SIGTERM did it
        outcome.terminated += [handle.identity for handle in not_reached if handle not in denied]
        outcome.survivors = [handle.identity for handle in still_living + denied]
    finally:
        signaller.close(handles)
    return outcome


def _send_all(signaller: Signaller, handles: list[ProcessHandle], signum: int, outcome: SignalOutcome) -> list[ProcessHandle]:
    """Signal each handle; return those the signal reached (a process found gone is simply done)."""
    reached = []
    for handle in handles:
        result = signaller.send(handle, signum)
        _record(outcome, handle, signum, result)
        if result == "sent":
            reached.append(handle)
        elif result == "gone" and signum == signal.SIGTERM:
            outcome.not_signalled.append({"pid": handle.pid, "start_time": handle.identity.start_time, "reason": "exited before signal"})
    return reached


def _record(outcome: SignalOutcome, handle: ProcessHandle, signum: int, result: str) -> None:
    outcome.signals.append({"pid": handle.pid, "start_time": handle.identity.start_time,
                            "signal": signal.Signals(signum).name, "result": result})


def survivor_report(reader: ProcReader, identity: ProcessIdentity, base: dict | None = None) -> dict:
    report = dict(base or {"pid": identity.pid, "start_time": identity.start_time})
    try:
        report["state"] = reader.stat(identity.pid).state
    except Exception:  # noqa: BLE001 - a survivor may vanish while we describe it
        report["state"] = None
    report.update(survivor_details(reader, identity.pid))
    return report
