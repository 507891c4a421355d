# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Every path the collection keeps on a node, and the name of the node's one lease: the modules' defaults, the
planner's answers and the roles (through the filter gpufleet.serving.node_path) read them here."""

from __future__ import annotations

STATE_DIR = "/var/lib/gpufleet-serving"
# the node's record of its parked engine, and what each engine's last park on the node left
PARKED_RECORD = f"{STATE_DIR}/parked.json"
PARK_HISTORY = f"{STATE_DIR}/park_history.json"
# while a file named as a unit is here, systemd does not start it (the engine units' ConditionPathExists=!); /run: a
# reboot clears it
PARK_HOLD_DIR = "/run/gpufleet-serving/parked"
# the node's record of its last cutover (engine_observe reads it back for the next run's report)
LAST_CUTOVER = f"{STATE_DIR}/last_cutover.json"
# the engines' golden answers, one record per engine, model, version and command
ANSWERS_DIR = f"{STATE_DIR}/answers"
# what the node's metrics count between runs (the .prom file is rendered from it)
METRICS_STATE = f"{STATE_DIR}/metrics.json"
METRICS_DIR = "/var/lib/prometheus/node-exporter"
# every signal the collection sends, before it is sent and with its outcome
SIGNAL_JOURNAL = "/var/log/gpufleet-serving/signals.jsonl"
# the node's one lease, shared by a switch and a cleanup: they never work on a node at once
LEASE_NAME = "switch_engine"

NODE_PATHS = {"parked_record": PARKED_RECORD, "park_history": PARK_HISTORY, "park_hold_dir": PARK_HOLD_DIR, "last_cutover": LAST_CUTOVER,
              "answers_dir": ANSWERS_DIR, "metrics_state": METRICS_STATE, "metrics_dir": METRICS_DIR, "signal_journal": SIGNAL_JOURNAL,
              "lease_name": LEASE_NAME}
