# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters shaping the teardown and switch reports (see plugins/plugin_utils/_reports.py)."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _reports


class FilterModule:
    def filters(self):
        return {
            "process_summary": _reports.process_summary,
            "teardown_unit_summary": _reports.unit_summary,
            "gpu_summary": _reports.gpu_summary,
            "teardown_table": _reports.teardown_table,
            "switch_table": _reports.switch_table,
        }
