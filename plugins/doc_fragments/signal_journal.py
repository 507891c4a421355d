# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The options of the modules that send signals: where each signal is journalled, and under which run."""

    DOCUMENTATION = r"""
options:
  journal_path:
    description:
      - The node-local file every signal is appended to, one JSON line before it is sent (C(phase=intent)) and one with
        its outcome (C(phase=outcome)) - pid, process start time, exe, cgroup, uid, signal, how it was sent, result and
        O(run_id). Each line is on the node once written, so a module killed between two signals, or a controller
        lost mid-run, leaves the record of what was signalled.
      - A journal that cannot be written refuses the run before the first signal. An empty value keeps the records in
        the result only.
    type: str
    default: /var/log/gpufleet-serving/signals.jsonl
  run_id:
    description:
      - Names the run in every journal line (the switch and the cleanup give theirs). Default - the module's name, the
        node's host name, its pid and the time.
    type: str
"""
