# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Monotonic deadlines and a bounded poll loop; the clock and sleep are injectable for tests."""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass, field
from typing import Callable

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import RequesterGone


@dataclass
class Clock:
    """time.monotonic/time.sleep behind one object so tests can drive time."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def requester_gone(fd: int = 1, parent: int | None = None) -> bool:
    """Whether whoever asked for this module run is gone: the far end of our output closed (the controller's SSH session or
    its worker ended), or we were reparented away from the process that started us."""
    poller = select.poll()
    poller.register(fd, 0)  # errors and hang-ups are always reported
    if any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0)):
        return True
    return parent is not None and os.getppid() != parent


def abandoning_clock(parent: int | None = None, fd: int = 1, clock: Clock | None = None) -> Clock:
    """A clock whose every sleep ends the wait (RequesterGone) once whoever asked for it is gone: a module that only
    waits (readiness, a soak, GPU memory) must not keep polling a node for a controller that was interrupted. Work that
    must reach a safe end (the cutover) keeps the plain clock."""
    base = clock or Clock()

    def sleep(seconds: float) -> None:
        base.sleep(seconds)
        if requester_gone(fd, parent):
            raise RequesterGone("stopped waiting: whoever asked for this wait is gone (its controller was interrupted or lost the node)")

    return Clock(monotonic=base.monotonic, sleep=sleep)


@dataclass
class Deadline:
    """A point on the monotonic clock; wall-clock steps (NTP) cannot move it."""

    seconds: float
    clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        self.started = self.clock.monotonic()
        self.at = self.started + self.seconds

    def remaining(self) -> float:
        return max(0.0, self.at - self.clock.monotonic())

    def expired(self) -> bool:
        return self.clock.monotonic() >= self.at

    def elapsed(self) -> float:
        return self.clock.monotonic() - self.started


@dataclass
class PollOutcome:
    satisfied: bool
    value: object
    attempts: int
    elapsed: float


def poll_until(probe: Callable[[], object], done: Callable[[object], bool], timeout: float, interval: float,
               clock: Clock | None = None, stop_early: Callable[[object], bool] | None = None) -> PollOutcome:
    """Call probe() until done(value), stop_early(value) or the deadline; the probe always runs at least once.

    The last sleep is cut to the time left, so the loop never overruns its deadline by an interval.
    """
    clock = clock or Clock()
    deadline = Deadline(timeout, clock)
    attempts = 0
    while True:
        value = probe()
        attempts += 1
        if done(value):
            return PollOutcome(True, value, attempts, deadline.elapsed())
        if (stop_early and stop_early(value)) or deadline.expired():
            return PollOutcome(False, value, attempts, deadline.elapsed())
        clock.sleep(min(interval, deadline.remaining()))
