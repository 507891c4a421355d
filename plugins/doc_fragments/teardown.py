# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The teardown's options, shared by the modules that run one (node_teardown, engine_cutover): one set in
    module_utils/_teardown/options.py, documented once here."""

    DOCUMENTATION = r"""
options:
  kill_timeout:
    description:
      - Seconds to wait after SIGKILL - for a unit's control group to empty, and for the GPU holders to go (where
        the module has no C(holders_kill_timeout) of its own, or it is not given).
    type: float
    default: 30
  term_timeout:
    description:
      - Seconds a GPU holder still running after the units stopped gets between its SIGTERM (and SIGCONT) and its SIGKILL.
    type: float
    default: 30
  gpus:
    description:
      - The GPUs to free and check, as NVML indexes or UUIDs (as in M(gpufleet.serving.gpu_holders_kill)); default all.
    type: list
    elements: str
    default: []
  device_paths:
    description:
      - Globs of the device files whose holders are found.
    type: list
    elements: str
    default: ['/dev/nvidia*', '/dev/nvidia-caps/*']
  protected:
    description:
      - Process names never signalled, added to M(gpufleet.serving.gpu_holders_kill)'s built-in set.
    type: list
    elements: str
    default: []
  max_targets:
    description:
      - The most GPU holders signalled; a run that would signal more is refused before anything is stopped.
    type: int
    default: 64
  outside_units:
    description:
      - What to do with another user's GPU holder - outside O(units) and not run by one of O(owners) - as
        M(gpufleet.serving.gpu_holders_kill)'s option. V(fail) refuses before anything is stopped (a switch finds one in
        its preflight, before the drain; the way back reports and leaves one that came during the cutover), V(kill)
        kills it, V(report) leaves it running and reported, its memory not counted.
    type: str
    choices: [kill, report, fail]
    default: fail
  incomplete_scan:
    description:
      - What to do when the holder scan cannot see every process's open files (the module runs without
        C(CAP_SYS_PTRACE), or a process's files could not be read), as M(gpufleet.serving.gpu_holders_kill)'s option.
        V(fail) refuses before anything is stopped, V(warn) goes on with a warning.
    type: str
    choices: [fail, warn]
    default: fail
  owners:
    description:
      - The engines' users. Their GPU holders outside O(units) are the engines' escaped workers, killed with the units'
        processes.
    type: list
    elements: str
    default: []
  max_used_mib:
    description:
      - The most memory (MiB) a GPU may still hold to count as free.
    type: int
    default: 512
  memory_timeout:
    description:
      - Seconds to wait for every GPU to be free once the holders are gone.
    type: float
    default: 60
  expected_gpu_count:
    description:
      - Fail unless NVML sees exactly this many GPUs.
    type: int
  settle:
    description:
      - Seconds to wait after a unit is down before its control group is read again (nothing started it again).
    type: float
    default: 0.25
  metrics_dir:
    description:
      - Where node_exporter's textfile collector reads (Debian's and Ubuntu's C(prometheus-node-exporter) read
        C(/var/lib/prometheus/node-exporter)); C(gpufleet_serving.prom) is written there after the run, from the node's
        metrics state - the engines left, the last run, counters that never go backwards (docs/metrics.md). Unset,
        nothing is written. A failure to write is RV(metrics_warnings), never a failure of the run.
    type: str
  metrics_state_path:
    description:
      - The node's metrics state (its counters among them), kept across runs and reboots.
    type: str
    default: /var/lib/gpufleet-serving/metrics.json
"""
