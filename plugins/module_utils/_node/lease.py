# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A lease that outlives the process taking it: an owner and an expiry, changed only under a flock."""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput, LockTimeout, RequesterGone
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import LOCK_DIRECTORY

RETRY_SECONDS = 0.5


def boot_clock() -> float:
    """Seconds since boot, suspend included: the same on every process of this boot, immune to NTP steps."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return "unknown"


@dataclass
class Acquired:
    taken: bool  # the lease changed hands (False when renewing our own, or when another owner still holds it)
    holder: dict
    recovered: dict | None
    abandoned: bool = False  # the wait ended because its requester was gone (nothing taken for it)
    working: str | None = None  # the pid of the previous holder's work (a cutover) still running when the wait ended


class LeaseStore:
    def __init__(self, name: str, directory: str = LOCK_DIRECTORY, clock=boot_clock, sleep=time.sleep):
        self.path = os.path.join(directory, f"gpufleet-serving.{name}.lease")
        # held by the work done under the lease (engine_cutover) for as long as it runs: the kernel drops it with its holder
        self.work_path = os.path.join(directory, f"gpufleet-serving.{name}.work.lock")
        self.clock = clock
        self.sleep = sleep

    def _locked(self):
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held only for a read-modify-write: microseconds
        return fd

    def _read(self) -> dict | None:
        """The record; None when there is none; {"unreadable": why} when the file is there but holds no lease record
        (damaged, edited by hand): no owner can be named, and it is taken over as an expired one is, said so."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return {"owner": None, "unreadable": f"{self.path} cannot be read: {exc.strerror or exc}"}
        try:
            record = json.loads(text)
        except ValueError as exc:
            return {"owner": None, "unreadable": f"{self.path} is not a lease record ({exc})"}
        if not isinstance(record, dict) or not isinstance(record.get("owner"), str) or not isinstance(record.get("expires"), (int, float)):
            return {"owner": None, "unreadable": f"{self.path} is not a lease record (no owner and expiry)"}
        return record

    def _write(self, record: dict) -> None:
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(partial, self.path)

    def work_holder(self) -> str | None:
        """The pid holding the work lock, or None when no work runs under this lease."""
        try:
            fd = os.open(self.work_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)  # closing drops our shared lock at once
        return None

    def _view(self, record: dict | None) -> dict:
        if record is None:  # given back, its work still running
            return {"owner": None, "age": None, "expires_in": None}
        if record.get("unreadable"):
            return {"owner": None, "age": None, "expires_in": None, "unreadable": record["unreadable"]}
        now = self.clock()
        return {"owner": record["owner"], "age": now - record["acquired"], "expires_in": record["expires"] - now}

    def held(self) -> dict:
        """Who holds the lease now: owner (None when none), age and expires_in in seconds."""
        return self._view(self._read())

    def _expired(self, record: dict) -> bool:
        return bool(record.get("unreadable")) or record.get("boot_id") != boot_id() or record["expires"] <= self.clock()

    def acquire(self, owner: str, lease_seconds: float, wait_timeout: float, dry_run: bool = False,
                break_owner: str | None = None, still_wanted=lambda: True) -> Acquired:
        """Take or renew the lease. ``break_owner``: a holder known to be dead, whose lease is taken over at once
        (only that exact owner: a lease that changed hands meanwhile is waited for like any other).
        ``still_wanted`` is asked before each retry: a wait whose requester is gone ends without taking the lease."""
        deadline = time.monotonic() + wait_timeout
        working = None
        while True:
            fd = self._locked()
            try:
                current = self._read()
                broken = bool(current and break_owner and current["owner"] == break_owner and break_owner != owner)
                free = current is None or current["owner"] == owner or self._expired(current) or broken
                # a lease changing hands waits for the work its last holder left running (an interrupted run's cutover),
                # also when that run gave the lease back without it (its controller lost the node during the cutover)
                working = self.work_holder() if free and (current is None or current["owner"] != owner) else None
                if free and not working:
                    recovered = current if current and current["owner"] != owner else None
                    now = self.clock()
                    record = {"owner": owner, "acquired": current["acquired"] if current and not recovered else now,
                              "expires": now + lease_seconds, "boot_id": boot_id()}
                    if not dry_run:
                        self._write(record)
                    taken = current is None or recovered is not None
                    return Acquired(taken, self._view(record), recovered and _recovered(recovered, broken))
            finally:
                os.close(fd)
            if time.monotonic() >= deadline:
                return Acquired(False, self._view(current), None, working=working)
            self.sleep(min(RETRY_SECONDS, max(0.0, deadline - time.monotonic())))
            # asked after the sleep, right before the retry: a requester gone during it takes nothing freed during it
            if not still_wanted():
                return Acquired(False, self._view(current), None, abandoned=True)

    def release(self, owner: str, dry_run: bool = False) -> bool:
        fd = self._locked()
        try:
            current = self._read()
            if current is None or current["owner"] != owner:
                return False
            if not dry_run:
                os.unlink(self.path)
            return True
        finally:
            os.close(fd)


def _recovered(record: dict, broken: bool) -> dict:
    """What a takeover says of the lease it took: its owner, whether it was broken, why it could not be read."""
    said = {"owner": record["owner"], "broken": broken}
    if record.get("unreadable"):
        said["unreadable"] = record["unreadable"]
    return said


NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass
class LeaseRequest:
    name: str
    owner: str
    state: str
    lease_seconds: float
    wait_timeout: float
    break_owner: str | None

    @classmethod
    def from_params(cls, params: dict) -> LeaseRequest:
        if not NAME.match(params["name"]):
            raise InvalidInput(f"name must be 1-64 letters, digits, '-', '_' or '.', got {params['name']!r}")
        if params["lease_seconds"] <= 0:
            raise InvalidInput(f"lease_seconds must be greater than 0, got {params['lease_seconds']:g}")
        if params["wait_timeout"] < 0:
            raise InvalidInput(f"wait_timeout must be at least 0, got {params['wait_timeout']:g}")
        return cls(params["name"], params["owner"], params["state"], params["lease_seconds"], params["wait_timeout"], params["break_owner"])


def take(request: LeaseRequest, store: LeaseStore, dry_run: bool, still_wanted, clock=time.monotonic) -> dict:
    """Take (or renew) the lease for the request's owner; the report. Raises RequesterGone or LockTimeout, taking nothing."""
    started = clock()
    outcome = store.acquire(request.owner, request.lease_seconds, request.wait_timeout, dry_run=dry_run,
                            break_owner=request.break_owner, still_wanted=still_wanted)
    waited = clock() - started
    if outcome.abandoned:
        raise RequesterGone(f"{request.name}: stopped waiting for {outcome.holder['owner']} after {waited:.0f}s - whoever asked for the "
                            "lease is gone (its controller was interrupted); nothing was taken", holder=outcome.holder, recovered=None, waited=waited)
    if outcome.working:
        whose = outcome.holder["owner"] or "a run that gave the lease back"
        raise LockTimeout(f"{request.name}: the work of {whose} still runs on this node (pid {outcome.working}: "
                          f"a switch whose controller was interrupted finishes its cutover); waited {waited:.0f}s",
                          holder=outcome.holder, recovered=None, waited=waited, working=outcome.working)
    if outcome.holder["owner"] != request.owner:
        raise LockTimeout(f"{request.name} is held by {outcome.holder['owner']} (taken {outcome.holder['age']:.0f}s ago, expires in "
                          f"{outcome.holder['expires_in']:.0f}s); waited {waited:.0f}s", holder=outcome.holder, recovered=None, waited=waited)
    return dict(changed=outcome.taken, holder=outcome.holder, recovered=outcome.recovered, waited=waited)
