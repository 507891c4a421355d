#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_memory_assert
short_description: Assert that every selected GPU is free, polling until a deadline
version_added: 0.1.0
description:
  - Reads every GPU through NVML (nvidia-ml-py) and passes when each selected GPU uses at most O(max_used_mib) MiB
    (and, when set, runs at most O(max_processes) processes). Polls every O(interval) seconds until O(timeout), because
    freeing GPU memory takes from a fraction of a second to tens of seconds after a process exits.
  - Uses NVML's v2 memory query, which reports the driver's reserved memory apart from C(used). Only when v2 is missing
    does it fall back to v1, whose C(used) includes that reserve, and subtract O(v1_reserve_mib).
  - Fails at once, without waiting out the deadline, when NVML sees another number of GPUs than O(expected_count), or
    reports a GPU lost or in need of a reset.
  - The failure message names each dirty GPU, its used memory, its holders found in C(/proc) and listed by NVML (stale
    NVML PIDs marked), and a classification - C(holder_present), C(no_holder_found) (memory leaked; a GPU reset may be
    needed), C(gpu_lost), C(reset_required), C(nvml_error) or C(nvml_hung).
  - Read-only. NVML runs in a worker process with a per-call timeout, so a hung driver cannot hang the task. No CUDA
    context is created.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The module is read-only and measures the same way in check mode.
options:
  gpus:
    description:
      - GPUs to check, as NVML indexes or UUIDs (V(GPU-...)). Default is every GPU NVML sees.
      - NVML ignores C(CUDA_VISIBLE_DEVICES); indexes are NVML's order.
    type: list
    elements: str
  expected_count:
    description: Fail when NVML sees a different number of GPUs.
    type: int
  max_used_mib:
    description:
      - Highest used memory, in MiB, a clean GPU may show (NVML v2 C(used), which excludes the driver reserve).
      - V(512) when neither this nor O(max_used_percent) is set; with both, a clean GPU stays under both.
    type: int
  max_used_percent:
    description:
      - Highest used memory as a share, V(0) to V(100), of each GPU's own total (for fleets of mixed GPU sizes).
    type: float
    version_added: 0.5.0
  max_processes:
    description: Highest number of processes NVML may list on a clean GPU. Not checked when unset.
    type: int
  timeout:
    description: Seconds to keep polling for the GPUs to become clean. V(0) checks once.
    type: float
    default: 60
  interval:
    description: Seconds between two readings.
    type: float
    default: 0.5
  nvml_timeout:
    description: Seconds one NVML reading may take before the module fails with C(nvml_hung).
    type: float
    default: 10
  left_pids:
    description:
      - Processes left running on purpose - the foreign holders that M(gpufleet.serving.gpu_holders_kill) reported and
        left with O(gpufleet.serving.gpu_holders_kill#module:outside_units=report), its RV(gpufleet.serving.gpu_holders_kill#module:outside).
        The memory NVML lists for them on a GPU is not counted against the thresholds (nor they against O(max_processes)),
        so the assertion judges what the engine released. RV(gpus[].left_mib) says how much was not counted.
      - A left process whose memory NVML does not report (null in its process list) cannot be discounted - the GPU is
        judged on all it uses.
    type: list
    elements: int
    default: []
  v1_reserve_mib:
    description:
      - MiB subtracted from C(used) when only NVML's v1 memory query exists, since v1 counts the driver reserve as used
        (615 MiB on an idle H200, up to about 1 GiB on other GPUs).
    type: int
    default: 1024
  device_paths:
    description: Globs of device files scanned in C(/proc) to name the holders of a dirty GPU.
    type: list
    elements: str
    default: ['/dev/nvidia*', '/dev/nvidia-caps/*']
requirements:
  - nvidia-ml-py on the managed node
  - the NVIDIA driver (libnvidia-ml.so.1)
notes:
  - The task can take up to O(timeout) plus O(nvml_timeout) seconds, and ends (failed) at its next poll once its
    controller is gone (interrupted, or its SSH connection dropped) - nothing keeps polling a node for no one.
  - MIG instances are not checked separately; the parent GPU's memory is asserted.
seealso:
  - module: gpufleet.serving.gpu_holders_kill
  - module: gpufleet.serving.systemd_stop_hard
"""

EXAMPLES = r"""
---
- name: Assert all 8 GPUs are free, waiting up to two minutes for memory to be released
  gpufleet.serving.gpu_memory_assert:
    expected_count: 8
    max_used_mib: 512
    timeout: 120
  become: true

- name: Assert GPU 7 is free and no process runs on it
  gpufleet.serving.gpu_memory_assert:
    gpus: [7]
    max_processes: 0
    timeout: 30
  register: gpu7
"""

RETURN = r"""
gpus:
  description: One entry per selected GPU, from the last reading.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML index.
      type: int
      sample: 0
    uuid:
      description: GPU UUID.
      type: str
      sample: GPU-4f1e7c2a-83d9-4b1e-9f0e-5c2d7a8b9e10
    name:
      description: Product name.
      type: str
      sample: NVIDIA H200
    bus_id:
      description: PCI bus id.
      type: str
      sample: "00000000:18:00.0"
    minor:
      description: Device minor number (the N of /dev/nvidiaN); not the index.
      type: int
      sample: 3
    status:
      description: V(ok), V(lost), V(reset_required) or V(error).
      type: str
    total_mib:
      description: Total memory in MiB.
      type: int
      sample: 143771
    used_mib:
      description: Used memory as NVML reports it.
      type: int
      sample: 0
    reserved_mib:
      description: Driver-reserved memory (v2 only; null with v1).
      type: int
      sample: 615
    memory_api:
      description: V(v2), or V(v1) when the v2 query is missing.
      type: str
    compared_used_mib:
      description: The used figure compared with O(max_used_mib) - less the memory of O(left_pids) on this GPU.
      type: int
    left_mib:
      description: MiB NVML lists on this GPU for the processes of O(left_pids), not counted; null when none of them is on it.
      type: int
    processes:
      description: Processes NVML lists (pid, used_mib, type).
      type: list
      elements: dict
    clean:
      description: Whether the GPU passed.
      type: bool
    problems:
      description: Why the GPU did not pass.
      type: list
      elements: str
dirty:
  description: Indexes of the selected GPUs that did not pass.
  returned: always
  type: list
  elements: int
  sample: []
passed:
  description: Whether every selected GPU passed.
  returned: always
  type: bool
attempts:
  description: Number of NVML readings taken.
  returned: always
  type: int
elapsed:
  description: Seconds from the first reading to the verdict.
  returned: always
  type: float
driver_version:
  description: NVIDIA driver version NVML reports.
  returned: when NVML answered
  type: str
details:
  description: For each dirty GPU (keyed by index), its /proc holders, NVML processes and classification.
  returned: on failure
  type: dict
"""

import os
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _memory as memory
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import abandoning_clock

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str"),
    expected_count=dict(type="int"),
    max_used_mib=dict(type="int"),
    max_used_percent=dict(type="float"),
    max_processes=dict(type="int"),
    timeout=dict(type="float", default=60),
    interval=dict(type="float", default=0.5),
    nvml_timeout=dict(type="float", default=10),
    v1_reserve_mib=dict(type="int", default=1024),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    left_pids=dict(type="list", elements="int", default=[]),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    started = time.monotonic()
    try:
        # a poll for a controller that was interrupted ends at its next sleep
        result = memory.assert_free(memory.MemoryRequest.from_params(module.params), lambda: pynvml, abandoning_clock(parent=os.getppid()))
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"passed": False, "elapsed": time.monotonic() - started}, **exc.context))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
