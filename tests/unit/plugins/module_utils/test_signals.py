"""Signalling by identity with real processes: PID reuse, exits before the signal, kernels without pidfds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import COLLECTIONS, alive, stop

from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessIdentity, ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, terminate_then_kill


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


@pytest.mark.covers('G10')
def test_reused_pid_is_never_signalled(procs, signal_path):
    """G10/G12 via psutil's technique: the recorded start time no longer matches the process at that PID."""
    proc = procs()
    tampered = ProcessIdentity(proc.pid, identity(proc).start_time + 100)
    outcome = terminate_then_kill(Signaller(use_pidfd=signal_path.use_pidfd), [tampered], 1, 1)
    assert outcome.not_signalled == [{"pid": proc.pid, "start_time": tampered.start_time, "reason": "pid reused by another process"}]
    assert outcome.signals == [] and alive(proc.pid)


@pytest.mark.covers('G30')
def test_term_then_kill_gives_the_same_results_with_and_without_pidfds(procs, signal_path):
    """G30: the fallback path (start-time re-check before kill) behaves the same on these cases."""
    polite, stubborn = procs(), procs(ignore_term=True)
    polite_id, stubborn_id = identity(polite), identity(stubborn)
    outcome = terminate_then_kill(Signaller(use_pidfd=signal_path.use_pidfd), [polite_id, stubborn_id], 0.5, 5)
    assert outcome.terminated == [polite_id]
    assert outcome.killed == [stubborn_id]
    assert outcome.survivors == []
    assert not alive(polite.pid) and not alive(stubborn.pid)


@pytest.mark.covers('G13', 'G31')
def test_process_that_exits_before_the_first_signal_is_reported_not_signalled(procs):
    """G13/G31: gone between the scan and the signal; pidfd_open's ESRCH/EINVAL mean 'exited', not an error."""
    proc = procs()
    recorded = identity(proc)
    proc.kill()
    proc.wait()
    outcome = terminate_then_kill(Signaller(), [recorded], 1, 1)
    assert outcome.not_signalled[0]["reason"] == "exited before signal" and outcome.signals == []


class RacingSignaller(Signaller):
    """Replaces the target with a new process right after the pidfd is opened (the G12 window)."""

    def __init__(self, on_open):
        super().__init__()
        self.on_open = on_open

    def open(self, identity):
        result = super().open(identity)
        self.on_open()
        return result


def test_pidfd_stays_bound_to_the_classified_process_when_it_exits_after_open(procs):
    """Once the pidfd is open, the signal can only reach that process: a later exit gives 'gone', never a stray kill."""
    proc = procs()
    racer = RacingSignaller(on_open=lambda: (proc.kill(), proc.wait()))
    outcome = terminate_then_kill(racer, [identity(proc)], 1, 1)
    assert [s["result"] for s in outcome.signals] == ["gone"]
    assert outcome.not_signalled[0]["reason"] == "exited before signal"


@pytest.mark.covers('G11')
@pytest.mark.parametrize("pid", [1, 0, -1])
def test_pid_one_and_below_are_refused_even_if_planned(pid, signal_path):
    """G11's last line: a plan that names PID 1 (init), 0 (our own process group) or -1 (every process we may signal)
    is refused by the one place that sends signals, before a pidfd or kill(2) is tried, on both signal paths."""
    with pytest.raises(ValueError, match=f"refusing to signal PID {pid}"):
        Signaller(use_pidfd=signal_path.use_pidfd).open(ProcessIdentity(pid, 1))


@pytest.mark.covers('G16')
def test_sigcont_follows_sigterm_for_stopped_processes(procs):
    """G16 at the signalling layer: a stopped process exits on SIGTERM only once continued."""
    proc = procs()
    stop(proc)
    outcome = terminate_then_kill(Signaller(), [identity(proc)], 5, 1)
    assert [s["signal"] for s in outcome.signals] == ["SIGTERM", "SIGCONT"]
    assert [p.pid for p in outcome.terminated] == [proc.pid]


@pytest.mark.covers('G32')
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a signaller that drops to an unprivileged user")
def test_signal_the_kernel_denies_is_reported_once_and_the_target_survives(procs, signal_path):
    """G32: a real EPERM (an unprivileged signaller, a root process): each signal is tried once and reported as
    denied, SIGCONT is not sent to what SIGTERM did not reach, and the target is a survivor, not a kill."""
    target = procs()
    start_time = ProcReader().start_time(target.pid)
    script = (
        "import json, os\n"
        "from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessIdentity\n"
        "from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller, terminate_then_kill\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)  # after the imports: the interpreter may live under /root\n"
        f"outcome = terminate_then_kill(Signaller(use_pidfd={signal_path.use_pidfd}), [ProcessIdentity({target.pid}, {start_time})], 0.2, 0.2)\n"
        "print(json.dumps({'signals': outcome.signals, 'survivors': [s.pid for s in outcome.survivors], 'not_signalled': outcome.not_signalled,\n"
        "                  'killed': len(outcome.killed), 'terminated': len(outcome.terminated)}))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd="/",
                         env={**os.environ, "PYTHONPATH": str(COLLECTIONS)}, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert [(s["signal"], s["result"]) for s in result["signals"]] == [("SIGTERM", "denied"), ("SIGKILL", "denied")]
    assert result["survivors"] == [target.pid] and result["killed"] == result["terminated"] == 0
    assert result["not_signalled"] == [], "denied is not exited"
    assert alive(target.pid)


class JournalWitness(Signaller):
    """Sends for real, but first reads the journal file as a crash at that instant would leave it."""

    def __init__(self, journal):
        super().__init__(journal=journal)
        self.seen_before_send: list[tuple[int, str, bool]] = []

    def _send(self, handle, signum):
        import signal as signals

        from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import read

        name = signals.Signals(signum).name
        on_disk = [(line["pid"], line["signal"], line["phase"]) for line in read(self.journal.path)]
        self.seen_before_send.append((handle.pid, name, (handle.pid, name, "intent") in on_disk))
        return super()._send(handle, signum)


@pytest.mark.covers("G33", "E9")
def test_each_signals_intent_is_on_disk_before_the_signal_is_sent(procs, tmp_path):
    """Rule 12: at the instant of every kill (the moment a crash would cut the run short) the journal file already
    holds that signal's intent line - whom, which signal, this run - and its outcome line follows."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal, read

    ignorer, quitter = procs(ignore_term=True), procs()
    journal = Journal(str(tmp_path / "log" / "signals.jsonl"), "run-42", "gpu_holders_kill")
    witness = JournalWitness(journal)
    outcome = terminate_then_kill(witness, [identity(ignorer), identity(quitter)], term_timeout=0.5, kill_timeout=5)
    assert outcome.survivors == [] and not alive(ignorer.pid) and not alive(quitter.pid)
    assert witness.seen_before_send and all(seen for _pid, _signal, seen in witness.seen_before_send), witness.seen_before_send
    assert "SIGKILL" in {name for _pid, name, _seen in witness.seen_before_send}
    lines = read(journal.path, "run-42")
    assert [line["phase"] for line in lines] == ["intent", "outcome"] * len(witness.seen_before_send)
    assert {line["pid"] for line in lines} == {ignorer.pid, quitter.pid} and {line["module"] for line in lines} == {"gpu_holders_kill"}


def test_a_line_a_full_disk_cut_short_is_taken_back_and_a_cut_line_is_never_glued_to(tmp_path):
    """Found by the fault campaign (seed 7400): the journal's disk full, an intent line was written in part and the
    signal refused - right - but the next run's intent line was glued to the half one, and no reader could parse it
    (the signal it stood for looked unjournalled). A short write is taken back; a line found cut is ended first."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal, read

    path = tmp_path / "signals.jsonl"
    path.write_text(json.dumps({"phase": "intent", "pid": 7, "signal": "SIGTERM", "run_id": "before"}) + "\n")
    size = path.stat().st_size
    # a file size limit is a full disk to write(2): the part that fits is written, the rest refused
    child = f"""
import os, resource, signal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal, JournalUnwritable
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 40}, {size + 40}))
try:
    Journal({str(path)!r}, "full", "gpu_holders_kill").intent(os.getpid(), 1, "SIGTERM", "kill")
except JournalUnwritable as exc:
    print(exc.msg)
"""
    refused = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(COLLECTIONS)})
    assert "(short write): stopped before sending SIGTERM" in refused.stdout, refused.stderr
    assert path.stat().st_size == size, "the part written was taken back"
    Journal(str(path), "after", "gpu_holders_kill").intent(os.getpid(), 1, "SIGTERM", "kill")
    assert [line["run_id"] for line in read(str(path))] == ["before", "after"]
    # a line cut by a crash mid-write (no room taken back): the next line starts on a line of its own
    with path.open("a") as journal_file:
        journal_file.write('{"phase": "intent", "pid": 9, "sig')
    Journal(str(path), "later", "gpu_holders_kill").intent(os.getpid(), 1, "SIGKILL", "kill")
    assert [line["run_id"] for line in read(str(path))] == ["before", "after", "later"]


def test_pidfds_are_probed_on_the_running_kernel(monkeypatch):
    """A kernel or seccomp policy that refuses pidfd_open (EPERM, ENOSYS) means the start-time check, not a failed run."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes import signals

    def refused(pid):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(signals.os, "pidfd_open", refused)
    assert signals.pidfds_supported() is False
    monkeypatch.delattr(signals.os, "pidfd_open")
    assert signals.pidfds_supported() is False


def test_without_pidfds_the_wait_polls_every_fallback_interval_to_its_deadline(procs):
    """The start-time check has no event to wait on: it reads /proc every 20 ms, on the signaller's clock."""
    from test_pure_logic import FakeClock

    from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Deadline

    clock = FakeClock()
    signaller = Signaller(use_pidfd=False, clock=clock)
    _result, handle = signaller.open(identity(procs()))
    assert signaller.wait([handle], Deadline(0.1, clock)) == [handle]
    assert max(clock.sleeps) == pytest.approx(0.02) and sum(clock.sleeps) == pytest.approx(0.1) and len(clock.sleeps) >= 5
