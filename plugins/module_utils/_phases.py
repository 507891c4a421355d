# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The one description of a switch's phases: their order, which of them the node-local cutover runs, and which of
those it can take over from the controller's own tasks. The planner (plugin_utils/_switch_plan) decides where each runs, the cutover
(_switch/cutover) enters them in this order, and the report (plugin_utils/_reports) keys each node's durations by them."""

from __future__ import annotations

# every phase of a switch, in order (plan: check mode only)
SWITCH = ("lease", "discover", "preflight", "backup", "stage", "prewarm", "plan", "leave_rotation", "cutover", "drain", "park",
          "teardown", "replace", "bring_up", "answer_check", "restart", "verify", "rollback", "join_rotation", "soak", "boot")
# the phases the cutover's one module run enters, in order
CUTOVER = ("preflight", "stage", "prewarm", "drain", "park", "teardown", "replace", "bring_up", "answer_check", "restart", "soak",
           "rollback")
# of those, the ones a task of the role runs instead when the cutover cannot (a balancer between them, check mode, ...)
MOVABLE = ("preflight", "stage", "prewarm", "soak")
# the node serves no one from leaving rotation to the end of joining it again: its downtime, in these parts
DOWNTIME = ("leave_rotation", "cutover", "drain", "park", "teardown", "replace", "bring_up", "answer_check", "restart", "verify", "rollback", "join_rotation")
# where a phase runs, in a plan
CONTROLLER, IN_CUTOVER, SKIPPED = "controller", "cutover", "skip"
