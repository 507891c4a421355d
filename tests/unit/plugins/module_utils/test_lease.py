"""The lease's edges (_node/lease.py) on real files and flocks, with an injected boot clock: what it reports, when a
lease has expired, how long a wait sleeps, who may give it back - the cases its mutants showed untested."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput, LockTimeout
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import LeaseRequest, LeaseStore, take


class Clocks:
    """The boot clock the lease records and the monotonic clock its wait measures, moved together by its sleeps."""

    def __init__(self, monkeypatch):
        self.boot = 100.0
        self.monotonic = 0.0
        self.slept: list[float] = []
        monkeypatch.setattr(time, "monotonic", lambda: self.monotonic)

    def __call__(self) -> float:
        return self.boot

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.boot += seconds
        self.monotonic += seconds


@pytest.fixture
def clocks(monkeypatch):
    return Clocks(monkeypatch)


@pytest.fixture
def leases(tmp_path, clocks):
    return LeaseStore("switch_engine", str(tmp_path), clock=clocks, sleep=clocks.sleep)


def test_held_says_how_old_the_lease_is_and_when_it_expires(leases, clocks):
    leases.acquire("run-a", 600, 0)
    clocks.boot += 250
    assert leases.held() == {"owner": "run-a", "age": 250.0, "expires_in": 350.0}
    assert leases.acquire("run-a", 60, 0).holder == {"owner": "run-a", "age": 250.0, "expires_in": 60.0}, "a renewal keeps its age"


def test_a_lease_expires_at_its_expiry_not_a_moment_after(leases, clocks):
    leases.acquire("run-a", 30, 0)
    clocks.boot += 29.9
    assert not leases.acquire("run-b", 60, 0).taken
    clocks.boot += 0.1  # exactly its expiry
    taken = leases.acquire("run-b", 60, 0)
    assert taken.taken and taken.recovered == {"owner": "run-a", "broken": False}
    clocks.boot += 600  # long past it
    assert leases.acquire("run-c", 60, 0).recovered == {"owner": "run-b", "broken": False}


def test_a_lease_of_another_boot_is_expired_whatever_its_clock_says(leases):
    """The boot clock starts again at a reboot: a record of an earlier boot names an owner that cannot be running."""
    for earlier_boot in ("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"):
        leases.acquire("run-a", 600, 0)
        record = json.loads(Path(leases.path).read_text(encoding="utf-8"))
        with open(leases.path, "w", encoding="utf-8") as handle:
            json.dump(dict(record, boot_id=earlier_boot), handle)
        taken = leases.acquire("run-b", 60, 0)
        assert taken.taken and taken.recovered == {"owner": "run-a", "broken": False}, earlier_boot
        assert leases.release("run-b")


def test_the_boot_is_unknown_where_the_kernel_does_not_say(monkeypatch):
    def unreadable(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(lease, "open", unreadable, raising=False)
    assert lease.boot_id() == "unknown"
    monkeypatch.undo()
    assert lease.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()


def test_a_lease_file_that_cannot_be_opened_is_named_with_the_kernels_reason(leases):
    os.mkdir(leases.path)  # something in the way of the record: a directory
    assert leases.held() == {"owner": None, "age": None, "expires_in": None,
                             "unreadable": f"{leases.path} cannot be read: Is a directory"}


def test_the_lock_file_is_readable_by_all_and_written_by_its_owner(leases):
    """An operator (not root) can see which lock a run waits on; only root changes it."""
    old = os.umask(0o022)
    try:
        leases.acquire("run-a", 60, 0)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(leases.path + ".lock").st_mode) == 0o644


def test_a_dead_owner_is_broken_whatever_its_name_sorts_beside_ours(leases):
    leases.acquire("zz-interrupted-run", 600, 0)
    assert not leases.acquire("next-run", 60, 0, break_owner="aa-other-run").taken, "only the owner named dead"
    taken = leases.acquire("next-run", 60, 0, break_owner="zz-interrupted-run")
    assert taken.taken and taken.recovered == {"owner": "zz-interrupted-run", "broken": True}


def test_a_wait_never_sleeps_past_its_deadline(leases, clocks):
    leases.acquire("run-a", 600, 0)
    outcome = leases.acquire("run-b", 60, wait_timeout=1.2)
    assert not outcome.taken and outcome.holder["owner"] == "run-a"
    assert clocks.slept == pytest.approx([0.5, 0.5, 0.2]), "retries every 0.5 s, the last sleep cut to the deadline"


def test_only_its_owner_gives_a_lease_back_whatever_the_names(leases):
    leases.acquire("run-m", 600, 0)
    assert not leases.release("a-stranger") and not leases.release("z-stranger")
    assert leases.held()["owner"] == "run-m"
    assert leases.release(json.loads('"run-m"')), "the owner's name as read from its arguments: equal, not the same object"
    assert leases.held()["owner"] is None


REQUEST = {"name": "switch_engine", "owner": "run-a", "state": "acquired", "lease_seconds": 60, "wait_timeout": 0, "break_owner": None}


@pytest.mark.parametrize(("option", "value", "error"), [
    ("lease_seconds", -5, "lease_seconds must be greater than 0, got -5"),
    ("lease_seconds", 0, "lease_seconds must be greater than 0, got 0"),
    ("wait_timeout", -0.5, "wait_timeout must be at least 0, got -0.5"),
])
def test_a_request_out_of_range_is_refused_naming_the_option(option, value, error):
    with pytest.raises(InvalidInput, match=error):
        LeaseRequest.from_params(dict(REQUEST, **{option: value}))


def test_the_smallest_valid_request_is_taken_as_given():
    request = LeaseRequest.from_params(dict(REQUEST, lease_seconds=0.5, wait_timeout=0))
    assert (request.lease_seconds, request.wait_timeout) == (0.5, 0)


def test_take_reports_how_long_it_waited_and_renews_its_own_lease(leases, clocks):
    leases.acquire("zz-holder", 600, 0)
    ticks = iter([3.0, 10.0])  # 7 s: neither a ratio nor a remainder of the two readings
    with pytest.raises(LockTimeout, match=r"switch_engine is held by zz-holder \(taken 0s ago, expires in 600s\); waited 7s") as raised:
        take(LeaseRequest.from_params(dict(REQUEST, owner="aa-run")), leases, False, still_wanted=lambda: True, clock=lambda: next(ticks))
    assert raised.value.context["waited"] == 7.0
    assert leases.release("zz-holder")
    ticks = iter([2.0, 4.5])
    first = take(LeaseRequest.from_params(REQUEST), leases, False, still_wanted=lambda: True, clock=lambda: next(ticks))
    assert first["changed"] and first["waited"] == 2.5
    renewal = take(LeaseRequest.from_params(dict(REQUEST, owner=json.loads('"run-a"'))), leases, False, still_wanted=lambda: True)
    assert not renewal["changed"] and renewal["holder"]["owner"] == "run-a", "its owner, read from arguments: equal, not the same object"
