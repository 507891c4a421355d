"""The signal journal on its own: what each line says, where it goes, and how a journal that cannot be written refuses."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._processes import journal as journals
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal, JournalUnwritable, new_run_id, read
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_run_id_names_the_module_the_host_and_the_process(monkeypatch):
    monkeypatch.setattr(journals.time, "time", lambda: 1765100000.9)
    assert new_run_id("gpu_holders_kill") == f"gpu_holders_kill-{socket.gethostname()}-{os.getpid()}-1765100000"


def test_the_default_path_is_the_nodes_journal():
    assert journals.DEFAULT_PATH == "/var/log/gpufleet-serving/signals.jsonl"


def test_intent_and_outcome_say_whom_which_signal_and_when_one_line_each(tmp_path, sleeper):
    path = tmp_path / "log" / "signals.jsonl"
    times = iter([100.1234567, 101.7654321])
    journal = Journal(str(path), "run-1", "gpu_holders_kill", wall=lambda: next(times))
    start = ProcReader().start_time(sleeper.pid)
    record = journal.intent(sleeper.pid, start, "SIGTERM", "pidfd")
    done = journal.outcome(record, "sent")
    subject = {"pid": sleeper.pid, "start_time": start, "comm": ProcReader().stat(sleeper.pid).comm, "exe": os.path.realpath(sys.executable),
               "cgroup": ProcReader().cgroup(sleeper.pid), "uid": os.getuid()}
    expected = {"time": 100.123457, "run_id": "run-1", "module": "gpu_holders_kill", **subject, "signal": "SIGTERM", "via": "pidfd"}
    assert record == expected
    assert done == dict(expected, result="sent", outcome_time=101.765432)
    assert journal.entries == [done]
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [dict(expected, phase="intent"), dict(done, phase="outcome")]
    assert lines[0] == json.dumps(dict(expected, phase="intent"), sort_keys=True), "one sorted JSON object per line"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and stat.S_IMODE(path.parent.stat().st_mode) == 0o750


def test_a_process_is_read_once_however_many_signals_it_gets(tmp_path, sleeper):
    class CountingReader(ProcReader):
        reads = 0

        def stat(self, pid):
            CountingReader.reads += 1
            return super().stat(pid)

    journal = Journal(None, "run-1", "m", reader=CountingReader())
    start = ProcReader().start_time(sleeper.pid)
    first = journal.intent(sleeper.pid, start, "SIGTERM", "kill")
    second = journal.intent(sleeper.pid, start, "SIGKILL", "kill")
    assert CountingReader.reads == 1 and first["exe"] == second["exe"] and first["exe"] is not None
    journal.intent(sleeper.pid, start + 1, "SIGKILL", "kill")  # another process under the same pid is read again
    assert CountingReader.reads == 2


def test_a_process_gone_before_its_intent_is_named_by_pid_only(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    record = Journal(None, "run-1", "m").intent(proc.pid, 5, "SIGTERM", "kill")
    assert (record["pid"], record["start_time"]) == (proc.pid, 5)
    assert {key: record[key] for key in ("exe", "cgroup", "uid", "comm")} == dict.fromkeys(("exe", "cgroup", "uid", "comm"))


def test_without_a_path_the_records_stay_in_the_result_only(tmp_path):
    journal = Journal(None, "run-1", "m").open()
    journal.outcome(journal.intent(os.getpid(), 1, "SIGTERM", "kill"), "sent")
    assert [entry["result"] for entry in journal.entries] == ["sent"] and list(tmp_path.iterdir()) == []


def test_a_journal_that_cannot_be_opened_refuses_before_anything_is_signalled(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    journal = Journal(str(blocker / "signals.jsonl"), "run-1", "m")
    with pytest.raises(JournalUnwritable) as refused:
        journal.open()
    assert refused.value.msg == (f"the signal journal {blocker}/signals.jsonl cannot be written (File exists): nothing was signalled. "
                                 "Give a writable journal_path")
    assert refused.value.context == {"journal_path": str(blocker / "signals.jsonl")}


def test_an_intent_that_cannot_be_written_stops_before_the_signal_and_an_outcome_that_cannot_is_noted(tmp_path):
    path = tmp_path / "signals.jsonl"
    journal = Journal(str(path), "run-1", "m").open()
    record = journal.intent(os.getpid(), 1, "SIGTERM", "kill")
    os.close(journal._fd)
    journal._fd = os.open(os.devnull, os.O_RDONLY)  # the same descriptor number, no longer writable
    done = journal.outcome(record, "sent")
    assert done["result"] == "sent" and done["journal_error"].startswith(f"the signal journal {path} could not be written (Bad file descriptor)")
    assert journal.entries == [done]
    with pytest.raises(JournalUnwritable, match="stopped before sending SIGKILL to pid 4242"):
        journal.intent(4242, 1, "SIGKILL", "kill")
    journal.close()
    assert journal._fd is None
    journal.close()  # twice is harmless


def test_open_twice_keeps_one_descriptor_and_a_file_ending_mid_line_is_ended_first(tmp_path):
    path = tmp_path / "signals.jsonl"
    path.write_text('{"run_id": "cut", "sig')
    journal = Journal(str(path), "run-1", "m").open()
    descriptor = journal._fd
    assert journal.open()._fd == descriptor
    journal.intent(os.getpid(), 1, "SIGTERM", "kill")
    journal.intent(os.getpid(), 1, "SIGKILL", "kill")
    text = path.read_text()
    assert text.startswith('{"run_id": "cut", "sig\n{') and text.count("\n") == 3, text
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    Journal(str(empty), "run-1", "m").intent(os.getpid(), 1, "SIGTERM", "kill")
    assert empty.read_text().startswith("{"), "an empty file is not a cut line"


def test_read_gives_one_runs_lines_skips_a_cut_one_and_a_missing_file_has_none(tmp_path):
    path = tmp_path / "signals.jsonl"
    lines = [{"run_id": "a", "n": 1}, {"run_id": "b", "n": 2}, {"n": 3}, {"run_id": "a", "n": 4}]
    path.write_text("\n".join(json.dumps(line) for line in lines[:2]) + '\n{"run_id": "a", "n"\n' + "\n".join(json.dumps(line) for line in lines[2:]) + "\n")
    assert read(str(path)) == lines
    assert read(str(path), "a") == [lines[0], lines[3]]
    assert read(str(tmp_path / "none.jsonl")) == []


@pytest.mark.parametrize("ending", ["x", '{"run_id": "cut", "sig', "}\x00\x00"], ids=["one-byte", "mid-line", "zero-filled"])
def test_a_file_whose_last_byte_is_not_a_line_end_was_cut(tmp_path, ending):
    """A crash mid-write leaves part of a line, or (some file systems, after a power loss) a tail of zero bytes."""
    path = tmp_path / "signals.jsonl"
    path.write_text(ending)
    Journal(str(path), "after", "m").intent(os.getpid(), 1, "SIGTERM", "kill")
    assert path.read_text().startswith(ending + "\n{"), path.read_text()


def test_a_file_ending_in_a_whole_line_is_appended_to_directly(tmp_path):
    path = tmp_path / "signals.jsonl"
    for before in ["\n", '{"n": 10}\n', '{"run_id": "before"}\n']:  # odd and even sizes
        path.write_text(before)
        Journal(str(path), "after", "m").intent(os.getpid(), 1, "SIGTERM", "kill")
        assert path.read_text().startswith(before + "{"), "no blank line between"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a process three different user ids")
def test_the_user_recorded_is_the_real_one_of_a_process_whose_ids_differ():
    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setresuid(1, 2, 3); print('up', flush=True); time.sleep(1e6)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        record = Journal(None, "run-1", "m").intent(child.pid, ProcReader().start_time(child.pid), "SIGTERM", "kill")
        assert record["uid"] == 1
    finally:
        child.kill()
        child.wait()
