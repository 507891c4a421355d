#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_wait
short_description: Wait for background jobs of a host, printing each one's progress
version_added: 0.2.0
description:
  - Waits, in one task, for the C(async) jobs started on the host (their registered results), asking
    M(ansible.builtin.async_status) for each every O(interval) seconds.
  - While a job runs, prints one line for it every O(report_every) seconds - the bytes done of the total and the rate,
    read from the job's progress file on the node (M(gpufleet.serving.model_stage) writes C(<dest>.progress)) - instead
    of an C(until) loop's C(FAILED - RETRYING) lines.
  - A job that failed fails the task with the job's own message; RV(results) are the jobs' results, in order.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: none
    details: There is no background job in check mode.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
options:
  jobs:
    description:
      - The jobs, each C(jid) (its C(ansible_job_id)), C(label) (for the lines) and C(progress) (the path of its
        progress file on the node, optional).
    type: list
    elements: dict
    required: true
  timeout:
    description: Seconds to wait for all of them; a job still running then fails the task, named.
    type: float
    default: 3600
  interval:
    description: Seconds between two status reads.
    type: float
    default: 2
  report_every:
    description: Seconds between two progress lines of a job.
    type: float
    default: 10
seealso:
  - module: ansible.builtin.async_status
  - module: gpufleet.serving.model_stage
"""

EXAMPLES = r"""
---
- name: Download in the background
  gpufleet.serving.model_stage:
    source: org/model
    dest: /var/lib/gpufleet-models/org--model
  async: 7200
  poll: 0
  register: stage_job

- name: Wait for it, a progress line every 10 s
  gpufleet.serving.job_wait:
    jobs:
      - jid: "{{ stage_job.ansible_job_id }}"
        label: org/model
        progress: /var/lib/gpufleet-models/org--model.progress
    timeout: 7200
"""

RETURN = r"""
results:
  description: Each job's result as M(ansible.builtin.async_status) returned it when it finished, in the order of O(jobs).
  returned: always
  type: list
  elements: dict
elapsed:
  description: Seconds waited.
  returned: always
  type: float
"""
