# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The results a node ends a run with - the words of the report's contract, the metrics' labels, the planner's and the
cutover's - in one place."""

from __future__ import annotations

# a switch, per node (would_switch: check mode's plan; preflight_failed: left serving as it was; not_reached: its batch
# did not run)
SWITCHED, UNCHANGED, WOULD_SWITCH, PREFLIGHT_FAILED, ROLLED_BACK, ROLLBACK_FAILED, FAILED, UNREACHABLE, NOT_REACHED = (
    "switched", "unchanged", "would_switch", "preflight_failed", "rolled_back", "rollback_failed", "failed", "unreachable", "not_reached")
SWITCH = (SWITCHED, UNCHANGED, WOULD_SWITCH, PREFLIGHT_FAILED, ROLLED_BACK, ROLLBACK_FAILED, FAILED, UNREACHABLE, NOT_REACHED)
SWITCH_SUCCESSES = (SWITCHED, UNCHANGED, WOULD_SWITCH)
# what the cutover's one module run ends with (preflight_failed and failed: stopped before the drain, nothing stopped)
CUTOVER = (SWITCHED, ROLLED_BACK, ROLLBACK_FAILED, PREFLIGHT_FAILED, FAILED)
# a check-mode run of the cutover's rollback alone (engine_cutover's rollback_reason): its plan
WOULD_ROLL_BACK = "would_roll_back"
# the cutover touched the engines
ACTED = (SWITCHED, ROLLED_BACK, ROLLBACK_FAILED)
# the node ended with an engine serving: the target, or the previous one again
SERVING = (SWITCHED, ROLLED_BACK)
# not what was asked
NOT_DONE = (FAILED, ROLLED_BACK, ROLLBACK_FAILED, UNREACHABLE, PREFLIGHT_FAILED)
# a cleanup, per node
OK = "ok"
TEARDOWN = (OK, FAILED, NOT_REACHED)
