# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Monotonic deadlines and a bounded poll loop; the clock and sleep are injectable for tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Clock:
    """time.monotonic/time.sleep behind one object so tests can drive time."""

    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


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
