# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The teardown's options, one set for every module that runs a teardown (node_teardown, engine_cutover); documented
once, in the doc fragment gpufleet.serving.teardown."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths

TEARDOWN_OPTIONS = dict(
    kill_timeout=dict(type="float", default=30),
    term_timeout=dict(type="float", default=30),
    gpus=dict(type="list", elements="str", default=[]),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    protected=dict(type="list", elements="str", default=[]),
    max_targets=dict(type="int", default=64),
    outside_units=dict(type="str", choices=["kill", "report", "fail"], default="fail"),
    incomplete_scan=dict(type="str", choices=["fail", "warn"], default="fail"),
    owners=dict(type="list", elements="str", default=[]),
    max_used_mib=dict(type="int", default=512),
    memory_timeout=dict(type="float", default=60),
    expected_gpu_count=dict(type="int"),
    settle=dict(type="float", default=0.25),
    metrics_dir=dict(type="str"),
    metrics_state_path=dict(type="str", default=paths.METRICS_STATE),
)
