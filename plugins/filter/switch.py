# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters of the switch_engine role around engine_cutover (plugins/plugin_utils/_switch.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch


def _wrapped(function):
    def filter_function(*args):
        try:
            return function(*args)
        except _switch.SwitchError as error:
            raise AnsibleFilterError(str(error)) from None
    filter_function.__doc__ = function.__doc__
    return filter_function


class FilterModule:
    def filters(self):
        return {"cutover_engine": _wrapped(_switch.cutover_engine), "switch_steps": _wrapped(_switch.switch_steps),
                "switch_opening": _wrapped(_switch.switch_opening), "switch_finish": _wrapped(_switch.switch_finish),
                "cutover_record": _wrapped(_switch.cutover_record), "rollback_record": _wrapped(_switch.rollback_record),
                "lost_during": _wrapped(_switch.lost_during),
                "cutover_inputs": _wrapped(_switch.cutover_inputs),
                "observe_requests": _wrapped(_switch.observe_requests),
                "observed": _wrapped(_switch.observed),
                "staged_model_dir": _wrapped(_switch.staged_model_dir), "stage_jobs": _wrapped(_switch.stage_jobs),
                "stage_request": _wrapped(_switch.stage_request)}
