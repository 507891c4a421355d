#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: display_text
short_description: Print text on the controller as it is written, lines and columns kept
version_added: 0.2.0
description:
  - Prints O(text) on the controller's output as plain lines, whatever the stdout callback and its result format
    (C(ansible.builtin.debug) shows a multi-line message as one JSON-quoted string, or a list of quoted lines).
  - The playbooks print their report tables with it.
  - An action that runs on the controller only; nothing is sent to the host.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Prints in check mode too.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: all
options:
  text:
    description: The text to print.
    type: str
    required: true
seealso:
  - module: ansible.builtin.debug
"""

EXAMPLES = r"""
---
- name: Show a table
  gpufleet.serving.display_text:
    text: "{{ report | gpufleet.serving.switch_table }}"
"""

RETURN = r"""
lines:
  description: How many lines were printed.
  returned: always
  type: int
"""
