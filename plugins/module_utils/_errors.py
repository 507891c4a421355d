# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Errors raised by the pure logic; each carries structured context for fail_json."""

from __future__ import annotations


class Error(Exception):
    """Base error: `context` becomes extra keys of the module's failure result."""

    def __init__(self, msg: str, **context):
        super().__init__(msg)
        self.msg = msg
        self.context = context


class InvalidInput(Error):
    """An option value is unusable; raised before anything is executed."""


class CommandFailed(Error):
    """An external command returned a non-zero status."""


class Refused(Error):
    """The request would touch something this collection never touches."""


class NvmlUnavailable(Error):
    """NVML (library, driver or permission) cannot be used on this host."""


class NvmlHung(Error):
    """An NVML call did not return within its timeout."""


class LockTimeout(Error):
    """Another run holds the host lock for longer than we may wait."""


class EngineExited(Error):
    """The engine's unit stopped (failed or inactive) while it was awaited."""


class CheckFailed(Error):
    """What the task verifies does not hold (an engine's speculative-decoding acceptance under its floor, requests
    still running at the drain's deadline)."""


class RequesterGone(Error):
    """Whoever asked for a wait (a lease, readiness, free memory) is gone (its controller was interrupted): the wait ended, taking nothing."""
