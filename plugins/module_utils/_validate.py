# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Numeric option checks with messages that name the option (Ansible has already converted the type)."""

from __future__ import annotations

import math

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

# Waits beyond a day are a typo, not a plan; they would also overflow poll() timeouts.
MAX_SECONDS = 86400.0


def non_negative(name: str, value: float, minimum_exclusive: bool = False) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidInput(f"{name}: {value!r} is not a number of seconds")
    if value < 0 or (minimum_exclusive and value == 0):
        raise InvalidInput(f"{name}: must be {'greater than' if minimum_exclusive else 'at least'} 0, got {value:g}")
    if value > MAX_SECONDS:
        raise InvalidInput(f"{name}: {value:g} seconds is more than a day ({MAX_SECONDS:g})")
    return float(value)


def positive_int(name: str, value: int) -> int:
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name}: must be a whole number of at least 1, got {value!r}")
    return value


def non_negative_int(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{name}: must be a whole number of at least 0, got {value!r}")
    return value
