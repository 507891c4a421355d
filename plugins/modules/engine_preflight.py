#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_preflight
short_description: Check, before a node is disrupted, that a vLLM or SGLang engine can start there
version_added: 0.2.0
description:
  - Runs on the GPU node before its engine is drained and stopped, so that a switch that cannot succeed leaves the node
    serving as it was. Each selected check reports passed, failed or skipped, with one line saying why.
  - C(executable) runs the command that prints the engine's version (O(version_argv)); with O(version) it must print
    exactly that version.
  - C(model) looks at O(model) (and O(draft_model)) as O(user) sees them - in a child process with that user's uid, gid
    and groups, so that modes, ACLs and directory search bits all count - and wants a directory holding C(config.json)
    and weight files (C(*.safetensors), C(*.bin), C(*.pt)) it can read, or a C(.gguf) file - and a whole checkpoint
    (every shard its index names, every safetensors file as long as its own header says, every part of a split GGUF),
    so that a download that stopped halfway is found before the drain, not by the engine after it. A path that is not
    absolute is a hub name the engine downloads, and is skipped.
  - C(gpus) wants O(gpus_needed) (tensor x data parallel) GPUs among those NVML sees, or among O(visible_devices).
  - C(port) wants O(port) free, or held only by processes of O(port_owners) (the engines the switch stops).
  - C(disk) wants O(install_min_free_mib) free where O(install_dir) is (or would be) created.
  - C(holders) looks for GPU holders of other users - outside O(units) and not run by one of O(owners) (a colleague's
    notebook, an SSH session's job, a container's process). With O(outside_units=fail) (the default) any of them fails
    the check, naming each one's pid, user, command and unit, so that a switch stops before it disrupts the node. The
    engines' own holders outside their units (escaped workers) are listed in RV(holders) and do not fail it.
  - Fails with every failed check's line in the message when any check fails.
author:
  - gpufleet.serving contributors (@gpufleet)
requirements:
  - nvidia-ml-py (for the C(gpus) check)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; the checks run in check mode too (they are the plan's preflight).
options:
  engine:
    description: The engine about to be started.
    type: str
    required: true
    choices: [vllm, sglang]
  checks:
    description: The checks to run.
    type: list
    elements: str
    default: [executable, model, gpus, port]
    choices: [executable, model, gpus, port, disk, holders]
  version_argv:
    description: The command that prints the engine's version on its last line (C(vllm --version); for SGLang its Python with
      C(-c "import sglang; print(sglang.__version__)")). Required by the C(executable) check.
    type: list
    elements: str
  version:
    description: The version the engine must report (a pinned install); empty accepts any.
    type: str
  model:
    description: Model directory (or C(.gguf) file, or hub name) the engine serves.
    type: str
    required: true
  model_dir:
    description:
      - Where the hub model O(model) is staged on the node. The C(model) check then checks that directory, as a model
        directory is, and says so; a directory not there yet passes, named (the switch's stage step downloads and
        verifies it before the drain).
    type: path
  draft_model_dir:
    description: Where the hub draft model O(draft_model) is staged on the node, checked like O(model_dir).
    type: path
  draft_model:
    description: Draft model (EAGLE-3 head) directory, checked like O(model).
    type: str
  user:
    description: The user the engine's unit runs as.
    type: str
    default: root
  gpus_needed:
    description: GPUs the engine uses (tensor parallel x data parallel).
    type: int
    default: 1
  visible_devices:
    description: The unit's C(CUDA_VISIBLE_DEVICES), when it sets one (comma-separated NVML indexes).
    type: str
  port:
    description: TCP port the engine listens on.
    type: int
    required: true
  port_owners:
    description: Units whose processes may hold O(port) now (the engines to be stopped).
    type: list
    elements: str
    default: []
  units:
    description: For the C(holders) check - the engine units the switch stops; their processes are the expected GPU holders.
    type: list
    elements: str
    default: []
  owners:
    description:
      - For the C(holders) check - the engines' users. Their holders outside O(units) are the engines' own (escaped
        workers, killed by the teardown), not another user's. As M(gpufleet.serving.gpu_holders_kill)'s option.
    type: list
    elements: str
    default: []
  outside_units:
    description:
      - For the C(holders) check - what the teardown will do with other users' holders, as
        M(gpufleet.serving.gpu_holders_kill)'s option. V(fail) fails the check when there is any; V(kill) and V(report)
        only name them.
    type: str
    choices: [kill, report, fail]
    default: fail
  gpus:
    description: For the C(holders) check - the GPUs the teardown frees (indexes or UUIDs); empty for all.
    type: list
    elements: str
    default: []
  device_paths:
    description: For the C(holders) check - the GPU device files whose holders are found, as M(gpufleet.serving.gpu_holders_kill)'s option.
    type: list
    elements: str
    default: [/dev/nvidia*, /dev/nvidia-caps/*]
  memory_fraction:
    description:
      - For the C(holders) check with O(outside_units=report) - the share of each GPU's memory the engine takes (vLLM's
        C(--gpu-memory-utilization), SGLang's C(--mem-fraction-static)). On each GPU the engine will use (O(visible_devices),
        else the first O(gpus_needed)), that share of the total must fit beside what the other users' processes left
        running hold, or a C(fit) check fails naming the GPU and the figures.
      - Default - vLLM's own default, 0.92; SGLang sizes its share itself, and the fit is then not checked.
    type: float
  install_dir:
    description: Where an install would go (a virtualenv); used by the C(disk) check.
    type: str
  install_min_free_mib:
    description: MiB that must be free for the install.
    type: int
    default: 20480
  nvml_timeout:
    description: Seconds any one NVML call may take.
    type: float
    default: 10
  version_timeout:
    description: Seconds the version command may take.
    type: float
    default: 120
seealso:
  - module: gpufleet.serving.engine_ready
  - module: gpufleet.serving.engine_drain
  - module: gpufleet.serving.gpu_holders_kill
"""

EXAMPLES = r"""
---
- name: Can SGLang start here? (before draining vLLM)
  gpufleet.serving.engine_preflight:
    engine: sglang
    version_argv: [/usr/bin/python3, -c, "import sglang; print(sglang.__version__)"]
    model: /models/Llama-3.3-70B-Instruct
    draft_model: /models/EAGLE3-LLaMA3.3-70B
    gpus_needed: 8
    port: 30000
    port_owners: [vllm.service]
"""

RETURN = r"""
passed:
  description: Whether every selected check passed (or was skipped).
  returned: always
  type: bool
checks:
  description: Each check run, in order, with C(name), C(passed), C(skipped) and C(detail) (the line that says why).
  returned: always
  type: list
  elements: dict
  sample: [{name: model, passed: false, skipped: false, detail: "model /models/llama does not exist"}]
failures:
  description: The lines of the failed checks.
  returned: always
  type: list
  elements: str
gpus:
  description: The GPUs NVML sees (C(index), C(used_mib), C(total_mib)), when the C(gpus) check ran.
  returned: always
  type: list
  elements: dict
holders:
  description:
    - When the C(holders) check ran - C(foreign), other users' GPU holders outside O(units), and C(escaped), the
      O(owners)' holders outside O(units); each with C(pid), C(user), C(comm), C(unit), C(placement) and C(gpus).
  returned: always
  type: dict
  sample: {foreign: [{pid: 5120, user: alice, comm: python3, unit: session-4.scope, placement: session, gpus: [7]}], escaped: []}
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _preflight as preflight
from ansible_collections.gpufleet.serving.plugins.module_utils import _preflight_node as preflight_node
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import Systemctl, restart_policy_reader, systemd_runs

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None


ARGUMENT_SPEC = preflight_node.OPTIONS


def load_nvml():
    if pynvml is None:
        raise Error("nvidia-ml-py is not installed")
    return pynvml


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        request = preflight.Request.from_params(module.params)
        # a holder the teardown would refuse to kill alone (a service systemd restarts) is named here, before any drain
        systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if systemd_runs() else None
        probe = preflight_node.NodeProbe(load_nvml, restart_policy=restart_policy_reader(systemctl))
        result = preflight_node.outcome(*preflight_node.run_checks(request, probe))
    except Error as exc:
        module.fail_json(msg=exc.msg, passed=False, checks=[], failures=[exc.msg], gpus=[], holders={}, **exc.context)
    if result["failures"]:
        module.fail_json(msg="preflight: " + "; ".join(result["failures"]), changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
