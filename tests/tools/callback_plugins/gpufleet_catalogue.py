# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Records how each Molecule task named for catalogue cases ended ("S19 | Freeze a running unit"), so that the
catalogue map counts a case covered only where its task ran and passed (tests/tools/catalogue_map.py --run)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_catalogue
type: aggregate
short_description: records the outcomes of tasks named for reliability catalogue cases
description:
  - Appends one JSON line per task result whose name starts with catalogue case ids before a C(|) to
    C($GPUFLEET_CATALOGUE_DIR/molecule.jsonl); does nothing where that variable is not set.
requirements:
  - the GPUFLEET_CATALOGUE_DIR environment variable
"""

import json
import os
import re

from ansible.plugins.callback import CallbackBase

CASE = re.compile(r"\b[SGME]\d+\b")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet_catalogue"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        directory = os.environ.get("GPUFLEET_CATALOGUE_DIR")
        self.path = os.path.join(directory, "molecule.jsonl") if directory else None
        self.playbook = ""

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.relpath(playbook._file_name, os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.getcwd()))

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
