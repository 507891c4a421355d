#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: report_files
short_description: Write a run's JSON report and its HTML page on the controller, or remove an earlier run's
version_added: 0.6.0
description:
  - Writes O(document) to O(path) as JSON (sorted keys, indented) and the same report as one self-contained HTML page
    beside it (the same name ending in C(.html), rendered as the C(gpufleet.serving.report_html) filter renders it).
    Each file is written beside its name and renamed over it, so that a reader never sees half a report; the directory
    is created when missing.
  - O(state=absent) removes both files, so that a run that is refused leaves no earlier run's report behind.
  - An action that runs on the controller only, in its own process (no module is sent anywhere), so that the
    playbooks' reports cost no module runs. C(changed) is always false - a report is a record of the run, not a change to the
    fleet - and the files are written in check mode too.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Writes the report in check mode too (the plan is the report).
  diff_mode:
    support: none
  platform:
    support: full
    platforms: all
options:
  path:
    description: The JSON report's absolute path on the controller, ending in C(.json).
    type: path
    required: true
  document:
    description: The report (O(state=present)).
    type: dict
  state:
    description: V(present) writes both files; V(absent) removes them.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: gpufleet.serving.display_text
"""

EXAMPLES = r"""
---
- name: Write the switch's report and its page
  gpufleet.serving.report_files:
    path: "{{ playbook_dir }}/reports/switch_engine.json"
    document: "{{ document }}"
"""

RETURN = r"""
json:
  description: The JSON report's path.
  returned: always
  type: str
html:
  description: The HTML page's path.
  returned: always
  type: str
removed:
  description: The files removed (O(state=absent)).
  returned: when O(state=absent)
  type: list
  elements: str
"""
