# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters building the teardown and switch reports (see plugins/plugin_utils/_reports.py), and report_html: a
report as one self-contained HTML page (plugins/plugin_utils/_html_report.py).

The documents they build are described key by key in docs/reports.md.
"""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report, _reports


def _clear_errors(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except _reports.ReportError as error:
            raise AnsibleFilterError(str(error)) from None
    return wrapper


class FilterModule:
    def filters(self):
        return {name: _clear_errors(getattr(_reports, name)) for name in (
            "teardown_host_report", "teardown_run_report", "teardown_table", "teardown_run_steps",
            "switch_host_report", "switch_failed", "switch_run_report", "switch_table", "merge_run_reports", "not_reached_report", "failure_reason",
            "stage_record")} | {
            "report_html": _html_report.page}
