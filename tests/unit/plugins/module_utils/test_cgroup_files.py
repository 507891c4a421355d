"""How _systemd/cgroup.py reads a control group's files - laid out in a directory as the kernel shows them, with real
processes - where they are missing, vanish, refuse or change between two reads: the cases its mutants showed untested
(the real hierarchies: tests/functional/test_cgroups.py)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest
from conftest import alive, wait_for

from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Deadline
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.journal import Journal
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.signals import Signaller
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.cgroup import Cgroup


def group_dir(path, procs=None, events=None):
    path.mkdir(parents=True, exist_ok=True)
    if procs is not None:
        (path / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in procs))
    if events is not None:
        (path / "cgroup.events").write_text(f"populated {events}\nfrozen 0\n")
    return path


@pytest.fixture
def sleepers():
    started = []

    def start():
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))
        return started[-1].pid
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_sub_groups_are_read_even_where_a_level_lists_no_processes(tmp_path):
    """Delegate=yes: the unit's own level may hold no cgroup.procs of its own (a hierarchy that lists only leaves)."""
    top = group_dir(tmp_path / "engine.service")
    group_dir(top / "payload", procs=[41, 42])
    group_dir(top / "z-other", procs=[43])
    assert Cgroup(str(top), ProcReader()).pids() == [41, 42, 43]


class ThreadedGroup(Cgroup):
    """cgroup.procs refuses with ``refusal`` (a threaded group: EOPNOTSUPP); cgroup.threads lists ``tids``."""

    def __init__(self, directory, reader, refusal, tids):
        super().__init__(directory, reader)
        self.refusal, self.tids = refusal, tids

    def _read_ids(self, directory, name):
        if name == "cgroup.procs":
            raise OSError(self.refusal, os.strerror(self.refusal))
        return list(self.tids)


class Tgids(ProcReader):
    """Each listed thread's Tgid; a thread gone, unreadable or without a Tgid line as named."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers

    def status(self, pid):
        answer = self.answers[pid]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_threaded_group_is_read_by_its_threads_thread_groups_skipping_those_that_cannot_be_read(tmp_path):
    group = group_dir(tmp_path / "engine.service", procs=[])
    reader = Tgids({101: ProcessGone(101), 102: {"Tgid": "100"}, 103: {"Name": "no tgid"}, 104: PermissionError(13, "denied"),
                    105: {"Tgid": "200"}, 106: {"Tgid": "not a number"}, 107: {"Tgid": "200"}})
    assert ThreadedGroup(str(group), reader, errno.EOPNOTSUPP, [101, 102, 103, 104, 105, 106, 107]).pids() == [100, 200]


@pytest.mark.parametrize("refusal", [errno.EACCES, errno.EIO, errno.EHOSTDOWN])
def test_any_other_refusal_to_list_the_group_is_raised_not_taken_for_empty(tmp_path, refusal):
    group = group_dir(tmp_path / "engine.service", procs=[])
    with pytest.raises(OSError) as raised:
        ThreadedGroup(str(group), Tgids({}), refusal, [1]).pids()
    assert raised.value.errno == refusal


class Describes(ProcReader):
    """stat() of some pids fails as a process that left, or one /proc will not show."""

    def __init__(self, failing):
        super().__init__()
        self.failing = failing

    def stat(self, pid):
        if pid in self.failing:
            raise self.failing[pid]
        return super().stat(pid)


def test_members_skip_processes_that_left_or_cannot_be_read_and_describe_the_rest(tmp_path, sleepers):
    first, gone, hidden, last = sleepers(), sleepers(), sleepers(), sleepers()
    group = group_dir(tmp_path / "engine.service", procs=sorted([first, gone, hidden, last]))
    reader = Describes({gone: ProcessGone(gone), hidden: PermissionError(13, "denied")})
    assert sorted(member["pid"] for member in Cgroup(str(group), reader).members()) == sorted([first, last])


def test_a_group_that_is_not_there_is_empty(tmp_path):
    assert Cgroup(None, ProcReader()).empty() is True
    assert Cgroup(str(tmp_path / "removed.service"), ProcReader()).empty() is True


class Rereads(Cgroup):
    """cgroup.events read twice: the first answer, then the second (the last process leaving between them)."""

    def __init__(self, directory, reader, answers):
        super().__init__(directory, reader)
        self.answers = list(answers)

    def populated(self):
        return self.answers.pop(0)


def test_a_populated_group_whose_last_process_left_between_two_reads_is_empty_and_one_listing_a_process_is_not(tmp_path):
    unlisted = group_dir(tmp_path / "a.service", procs=[], events="1")
    assert Rereads(str(unlisted), ProcReader(), [True, False]).empty() is True
    assert Rereads(str(unlisted), ProcReader(), [True, True]).empty() is False
    listed = group_dir(tmp_path / "b.service", procs=[os.getpid()], events="1")
    assert Rereads(str(listed), ProcReader(), [True, False]).empty() is False, "a process is listed: not empty, whatever a re-read says"


def test_a_cgroup_kill_the_kernel_refuses_is_journalled_as_failed_and_the_loop_kills_instead(tmp_path, sleepers):
    member = sleepers()
    group = group_dir(tmp_path / "engine.service", procs=[member])
    (group / "cgroup.kill").mkdir()  # present, and refusing the write (EISDIR), as a kernel that does not allow it
    journal = Journal(None, "run-1", "systemd_stop_hard", ProcReader())
    method = Cgroup(str(group), ProcReader()).kill_all(Signaller(ProcReader(), journal=journal), Deadline(0.2))
    assert method == "signal loop (cgroup.kill failed: Is a directory)"
    by_cgroup_kill = [entry for entry in journal.entries if entry.get("via") == "cgroup.kill"]
    assert [(entry["pid"], entry["result"]) for entry in by_cgroup_kill] == [(member, "failed: Is a directory")]
    assert any(entry["pid"] == member and entry["signal"] == "SIGKILL" and entry.get("via") != "cgroup.kill" for entry in journal.entries)
    wait_for(lambda: not alive(member), f"pid {member} survived the loop's SIGKILL")


def test_an_unreadable_kill_error_is_named_by_its_exception_when_it_has_no_message(tmp_path, sleepers, monkeypatch):
    member = sleepers()
    group = group_dir(tmp_path / "engine.service", procs=[member])
    (group / "cgroup.kill").write_text("")
    real_open = open

    def refusing(path, *args, **kwargs):
        if str(path).endswith("cgroup.kill"):
            raise OSError("no strerror")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", refusing)
    journal = Journal(None, "run-1", "systemd_stop_hard", ProcReader())
    method = Cgroup(str(group), ProcReader()).kill_all(Signaller(ProcReader(), journal=journal), Deadline(0.2))
    monkeypatch.undo()
    assert method == "signal loop (cgroup.kill failed: no strerror)"
    assert [entry["result"] for entry in journal.entries if entry.get("via") == "cgroup.kill"] == ["failed: no strerror"]
    os.kill(member, signal.SIGKILL)


def test_systemds_root_is_the_hosts_where_pid_1s_groups_cannot_be_read_and_the_containers_where_they_can(tmp_path):
    from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.cgroup import _systemd_root

    assert _systemd_root(ProcReader(str(tmp_path / "no-proc"))) == ""
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/machine.slice/libpod-abc.scope/init.scope\n")
    assert _systemd_root(ProcReader(str(tmp_path / "proc"))) == "/machine.slice/libpod-abc.scope"
