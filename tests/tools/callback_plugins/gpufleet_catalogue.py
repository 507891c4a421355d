# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Records how each Molecule task named for catalogue cases ended ("S19 | Freeze a running unit"), so that the
catalogue map counts a case covered only where its task ran and passed (tests/tools/catalogue_map.py --run); and how
long each slow task took, so that a gate over its time says where the time went (tests/tools/run_molecule.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_catalogue
type: aggregate
short_description: records the outcomes of tasks named for reliability catalogue cases
description:
  - Appends one JSON line per task result whose name starts with catalogue case ids before a C(|) to
    C($GPUFLEET_CATALOGUE_DIR/molecule.jsonl); does nothing where that variable is not set.
  - Appends one JSON line per task that took 5 seconds or more, from its start to the next task's, to
    C($GPUFLEET_CATALOGUE_DIR/timings.jsonl).
requirements:
  - the GPUFLEET_CATALOGUE_DIR environment variable
"""

import json
import os
import re
import time

from ansible.plugins.callback import CallbackBase

CASE = re.compile(r"\b[SGME]\d+\b")
SLOW_TASK_SECONDS = 5.0


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_catalogue"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        directory = os.environ.get("GPUFLEET_CATALOGUE_DIR")
        self.path = os.path.join(directory, "molecule.jsonl") if directory else None
        self.timings = os.path.join(directory, "timings.jsonl") if directory else None
        self.playbook = ""
        self.task: tuple[str, float] | None = None

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.relpath(playbook._file_name, os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd()))

    def _task_ended(self) -> None:
        if self.task is None or not self.timings:
            return
        name, started = self.task
        self.task = None
        seconds = time.monotonic() - started
        if seconds < SLOW_TASK_SECONDS:
            return
        os.makedirs(os.path.dirname(self.timings), exist_ok=True)
        line = {"scenario": os.environ.get("MOLECULE_SCENARIO_NAME", ""), "playbook": self.playbook, "task": name, "seconds": round(seconds, 1)}
        with open(self.timings, "a", encoding="utf-8") as journal:
            journal.write(json.dumps(line) + "\n")

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._task_ended()
        self.task = (task.get_name(), time.monotonic())

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats):
        self._task_ended()

    def _record(self, result, outcome: str) -> None:
        name = result.task_name or result._task.get_name()
        cases = CASE.findall(name.split("|")[0]) if "|" in name else []
        if not self.path or not cases:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        line = {"cases": cases, "task": name, "playbook": self.playbook, "host": result._host.get_name(), "outcome": outcome,
                "scenario": os.environ.get("MOLECULE_SCENARIO_NAME", "")}
        with open(self.path, "a", encoding="utf-8") as journal:
            journal.write(json.dumps(line) + "\n")

    def v2_runner_on_ok(self, result):
        self._record(result, "passed")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, "ignored failure" if ignore_errors else "failed")

    def v2_runner_on_skipped(self, result):
        self._record(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._record(result, "failed")
