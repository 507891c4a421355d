# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters of switch_engine.yml's rollout: its batches, its failure gate, and its runs' lease owners (plugins/plugin_utils/_rollout.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _rollout


def rollout_batches(value) -> list:
    try:
        return _rollout.rollout_batches(value)
    except _rollout.RolloutError as error:
        raise AnsibleFilterError(str(error)) from None


def rollout_gate(reports: dict, max_fail_percentage) -> dict:
    try:
        return _rollout.rollout_gate(reports, max_fail_percentage)
    except _rollout.RolloutError as error:
        raise AnsibleFilterError(str(error)) from None


def lease_wait(holder, run_id, seconds, working=None):
    """How a run waits for the node's lease another run holds (plugin_utils/_rollout.py: lease_wait)."""
    try:
        return _rollout.lease_wait(holder, run_id, seconds, working)
    except _rollout.RolloutError as error:
        raise AnsibleFilterError(str(error)) from None


class FilterModule:
    def filters(self):
        return {"rollout_batches": rollout_batches, "rollout_gate": rollout_gate, "run_owner": _rollout.run_owner,
                "run_owner_gone": _rollout.run_owner_gone, "lease_wait": lease_wait}
