"""The one place that sends signals (plugins/module_utils/_processes/signals.py), piece by piece, on real processes:
what open, send, alive, wait and close answer on each signal path, and what terminate_then_kill reports."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import alive, stop
from test_pure_logic import FakeClock

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes import signals
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessIdentity, ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, terminate_then_kill

PATHS = [True, False]  # pidfd, kill(2) after a start-time check


def start(ignore_term: bool = False) -> subprocess.Popen:
    code = ("import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "print('up', flush=True)\ntime.sleep(1e6)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


@pytest.fixture
def procs():
    started = []
    yield lambda **kw: started.append(start(**kw)) or started[-1]
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def identity(proc: subprocess.Popen) -> ProcessIdentity:
    return ProcessIdentity(proc.pid, ProcReader().start_time(proc.pid))


def exited(proc: subprocess.Popen, reap: bool = True) -> None:
    proc.kill()
    if reap:
        proc.wait()
    else:
        while ProcReader().stat(proc.pid).state != "Z":
            time.sleep(0.01)


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_open_binds_a_pidfd_only_on_the_pidfd_path(procs, use_pidfd):
    signaller = Signaller(use_pidfd=use_pidfd)
    target = identity(procs())
    result, handle = signaller.open(target)
    assert result == "open" and handle.identity == target and handle.pid == target.pid
    assert (handle.fd is not None) is use_pidfd
    signaller.close([handle])
    assert handle.fd is None
    signaller.close([handle])  # closing twice is harmless


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_open_tells_a_process_gone_from_a_pid_reused(procs, use_pidfd):
    signaller = Signaller(use_pidfd=use_pidfd)
    gone = procs()
    recorded = identity(gone)
    exited(gone)
    assert signaller.open(recorded) == ("gone", None)
    other = procs()
    assert signaller.open(ProcessIdentity(other.pid, identity(other).start_time - 1)) == ("reused", None)


def test_a_pidfd_opened_for_a_reused_pid_is_closed(procs, monkeypatch):
    opened = []
    real_open = os.pidfd_open
    monkeypatch.setattr(signals.os, "pidfd_open", lambda pid: opened.append(real_open(pid)) or opened[-1])
    other = procs()
    assert Signaller(use_pidfd=True).open(ProcessIdentity(other.pid, identity(other).start_time + 1)) == ("reused", None)
    with pytest.raises(OSError) as closed:
        os.fstat(opened[0])
    assert closed.value.errno == errno.EBADF


@pytest.mark.parametrize("refusal", [errno.EMFILE, errno.EPERM])
def test_a_pidfd_refused_for_another_reason_degrades_to_the_start_time_check(procs, monkeypatch, refusal):
    def refuse(pid):
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(signals.os, "pidfd_open", refuse)
    proc = procs()
    result, handle = Signaller(use_pidfd=True).open(identity(proc))
    assert result == "open" and handle.fd is None
    assert Signaller(use_pidfd=True).send(handle, signal.SIGKILL) == "sent"
    proc.wait()


@pytest.mark.parametrize("gone_errno", [errno.ESRCH, errno.EINVAL, errno.ENOENT])
def test_pidfd_open_saying_the_pid_is_no_process_is_gone(procs, monkeypatch, gone_errno):
    def gone(pid):
        raise OSError(gone_errno, os.strerror(gone_errno))

    monkeypatch.setattr(signals.os, "pidfd_open", gone)
    assert Signaller(use_pidfd=True).open(identity(procs())) == ("gone", None)


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_each_signal_is_journalled_by_the_path_it_takes(procs, tmp_path, use_pidfd):
    journal = Journal(str(tmp_path / "signals.jsonl"), "run-9", "gpu_holders_kill")
    signaller = Signaller(use_pidfd=use_pidfd, journal=journal)
    proc = procs()
    _result, handle = signaller.open(identity(proc))
    assert signaller.send(handle, signal.SIGTERM) == "sent"
    proc.wait()
    assert [(entry["signal"], entry["via"], entry["result"]) for entry in journal.entries] == [("SIGTERM", "pidfd" if use_pidfd else "kill", "sent")]
    assert signaller.send(handle, signal.SIGKILL) == "gone"
    assert [entry["result"] for entry in journal.entries] == ["sent", "gone"]
    signaller.close([handle])


def test_without_a_pidfd_a_pid_taken_over_meanwhile_is_never_signalled(procs):
    proc = procs()
    _result, handle = Signaller(use_pidfd=False).open(identity(proc))
    moved = signals.ProcessHandle(ProcessIdentity(proc.pid, handle.identity.start_time + 1))
    assert Signaller(use_pidfd=False).send(moved, signal.SIGKILL) == "gone"
    assert alive(proc.pid)


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_alive_until_the_process_exits_even_unreaped(procs, use_pidfd):
    signaller = Signaller(use_pidfd=use_pidfd)
    proc = procs()
    _result, handle = signaller.open(identity(proc))
    assert signaller.alive(handle)
    exited(proc, reap=False)
    assert not signaller.alive(handle)
    signaller.close([handle])


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_wait_returns_as_the_processes_exit_and_the_living_at_its_deadline(procs, use_pidfd):
    signaller = Signaller(use_pidfd=use_pidfd)
    quitter, stayer = procs(), procs()
    handles = [signaller.open(identity(proc))[1] for proc in (quitter, stayer)]
    exited(quitter, reap=False)
    assert signaller.wait(handles, Deadline(0.3)) == [handles[1]]
    assert signaller.wait(handles[:1], Deadline(60)) == []
    signaller.close(handles)


def test_a_wait_on_pidfds_sleeps_in_poll_not_on_the_clock(procs):
    clock = FakeClock()
    signaller = Signaller(use_pidfd=True, clock=clock)
    _result, handle = signaller.open(identity(procs()))
    started = time.monotonic()
    assert signaller.wait([handle], Deadline(0.2)) == [handle]
    assert clock.sleeps == [] and time.monotonic() - started >= 0.2
    signaller.close([handle])


def test_a_wait_with_some_handles_without_a_pidfd_polls_them_all(procs, monkeypatch):
    clock = FakeClock()
    signaller = Signaller(use_pidfd=True, clock=clock)
    with_fd = signaller.open(identity(procs()))[1]
    without = signals.ProcessHandle(identity(procs()))
    assert signaller.wait([with_fd, without], Deadline(0.05, clock)) == [with_fd, without]
    assert clock.sleeps and max(clock.sleeps) == pytest.approx(signals.FALLBACK_POLL_SECONDS)
    signaller.close([with_fd])


@pytest.mark.parametrize("use_pidfd", PATHS)
def test_terminate_then_kill_reports_every_signal_and_every_outcome(procs, use_pidfd):
    polite, stubborn, gone = procs(), procs(ignore_term=True), procs()
    targets = [identity(polite), identity(stubborn), identity(gone)]
    exited(gone)
    outcome = terminate_then_kill(Signaller(use_pidfd=use_pidfd), targets, 0.5, 5)
    assert outcome.terminated == [targets[0]] and outcome.killed == [targets[1]] and outcome.survivors == []
    assert outcome.not_signalled == [{"pid": gone.pid, "start_time": targets[2].start_time, "reason": "exited before signal"}]
    assert outcome.signals == [
        {"pid": polite.pid, "start_time": targets[0].start_time, "signal": "SIGTERM", "result": "sent"},
        {"pid": stubborn.pid, "start_time": targets[1].start_time, "signal": "SIGTERM", "result": "sent"},
        {"pid": polite.pid, "start_time": targets[0].start_time, "signal": "SIGCONT", "result": "sent"},
        {"pid": stubborn.pid, "start_time": targets[1].start_time, "signal": "SIGCONT", "result": "sent"},
        {"pid": stubborn.pid, "start_time": targets[1].start_time, "signal": "SIGKILL", "result": "sent"},
    ]


class GoneAtTerm(Signaller):
    """The process exits (and is reaped) between open and SIGTERM: the kill(2) path then finds it gone."""

    def __init__(self, proc, **kwargs):
        super().__init__(**kwargs)
        self.proc = proc

    def send(self, handle, signum):
        if signum == signal.SIGTERM:
            exited(self.proc)
        return super().send(handle, signum)


def test_a_process_gone_at_its_sigterm_is_not_signalled_and_gets_nothing_more(procs):
    proc = procs()
    recorded = identity(proc)
    outcome = terminate_then_kill(GoneAtTerm(proc, use_pidfd=False), [recorded], 0.2, 0.2)
    assert [(s["signal"], s["result"]) for s in outcome.signals] == [("SIGTERM", "gone")]
    assert outcome.not_signalled == [{"pid": proc.pid, "start_time": recorded.start_time, "reason": "exited before signal"}]
    assert outcome.terminated == outcome.killed == outcome.survivors == []


class LateExit(Signaller):
    """SIGKILL is never sent: the process exits on its own after the SIGTERM deadline (the SIGTERM did it)."""

    def __init__(self, proc, **kwargs):
        super().__init__(**kwargs)
        self.proc = proc

    def send(self, handle, signum):
        if signum == signal.SIGKILL:
            exited(self.proc, reap=False)
            return self.journal.outcome(self.journal.intent(handle.pid, handle.identity.start_time, "SIGKILL", "kill"), "gone")["result"]
        return super().send(handle, signum)


def test_a_process_that_exits_between_the_sigterm_deadline_and_sigkill_counts_as_terminated(procs):
    stubborn = procs(ignore_term=True)
    outcome = terminate_then_kill(LateExit(stubborn, use_pidfd=True), [identity(stubborn)], 0.2, 0.2)
    assert outcome.terminated == [identity(stubborn)] and outcome.killed == [] and outcome.survivors == []
    assert outcome.not_signalled == [], "it had its SIGTERM: gone at SIGKILL is no process exited before a signal"


class UnkillableSignaller(Signaller):
    """SIGKILL reported sent but the task lives on, as one in D state does until its kernel call returns."""

    def _send(self, handle, signum):
        return "sent" if signum == signal.SIGKILL else super()._send(handle, signum)


def test_a_process_sigkill_does_not_end_by_its_deadline_is_a_survivor(procs):
    stubborn = procs(ignore_term=True)
    outcome = terminate_then_kill(UnkillableSignaller(use_pidfd=True), [identity(stubborn)], 0.1, 0.1)
    assert outcome.survivors == [identity(stubborn)] and outcome.killed == [] and outcome.terminated == []
    assert [s["signal"] for s in outcome.signals] == ["SIGTERM", "SIGCONT", "SIGKILL"]


def test_a_survivor_report_says_its_state_wait_channel_and_pending_signals(procs):
    proc = procs()
    stop(proc)
    report = signals.survivor_report(ProcReader(), identity(proc))
    assert report["pid"] == proc.pid and report["start_time"] == identity(proc).start_time and report["state"] == "T"
    assert report["signals_pending"] == [] and report["threads"] == 1 and "wchan" in report
    based = signals.survivor_report(ProcReader(), identity(proc), {"pid": proc.pid, "unit": "vllm.service"})
    assert based["unit"] == "vllm.service" and "start_time" not in based
    gone = identity(proc)
    exited(proc)
    assert signals.survivor_report(ProcReader(), gone) == {"pid": gone.pid, "start_time": gone.start_time, "state": None, "wchan": None}


def test_a_wait_on_pidfds_sleeps_in_one_poll_to_its_deadline_not_a_busy_loop(procs, monkeypatch):
    """A node's kill wait costs no CPU: one poll(2) for the whole remaining time, in milliseconds, woken by an exit."""
    import select

    timeouts = []
    real_poll = select.poll

    class CountingPoll:
        def __init__(self):
            self.poller = real_poll()

        def register(self, fd, events):
            self.poller.register(fd, events)

        def poll(self, timeout):
            timeouts.append(timeout)
            return self.poller.poll(timeout)

    monkeypatch.setattr(signals.select, "poll", CountingPoll)
    signaller = Signaller(use_pidfd=True)
    _result, handle = signaller.open(identity(procs()))
    assert signaller.wait([handle], Deadline(0.3)) == [handle]
    # most of the 300 ms left (a busy machine may take a while to reach the poll), never a millisecond at a time
    assert 1 <= len(timeouts) <= 3 and 100 <= timeouts[0] <= 300, timeouts
    signaller.close([handle])
