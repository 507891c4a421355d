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

import os
import pwd
import subprocess
import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _holders_kill as holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils import _preflight as preflight
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._procfs import ProcReader, pid_directories

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

ARGUMENT_SPEC = dict(
    engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
    checks=dict(type="list", elements="str", default=["executable", "model", "gpus", "port"],
                choices=["executable", "model", "gpus", "port", "disk", "holders"]),
    version_argv=dict(type="list", elements="str"),
    version=dict(type="str"),
    model=dict(type="str", required=True),
    draft_model=dict(type="str"),
    user=dict(type="str", default="root"),
    gpus_needed=dict(type="int", default=1),
    visible_devices=dict(type="str"),
    port=dict(type="int", required=True),
    port_owners=dict(type="list", elements="str", default=[]),
    install_dir=dict(type="str"),
    install_min_free_mib=dict(type="int", default=20480),
    nvml_timeout=dict(type="float", default=10),
    version_timeout=dict(type="float", default=120),
    units=dict(type="list", elements="str", default=[]),
    owners=dict(type="list", elements="str", default=[]),
    outside_units=dict(type="str", choices=["kill", "report", "fail"], default="fail"),
    gpus=dict(type="list", elements="str", default=[]),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
)


class NodeProbe:
    """Everything the checks observe on the node: the one seam tests replace."""

    def __init__(self, proc_root: str = "/proc"):
        self.proc_root = proc_root

    def version(self, argv: list, timeout: float) -> tuple:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return None, f"{argv[0]} does not exist"
        except PermissionError:
            return None, f"{argv[0]} is not executable"
        except subprocess.TimeoutExpired:
            return None, f"did not finish within {timeout:g}s"
        return done.returncode, (done.stdout if done.returncode == 0 else done.stderr or done.stdout)

    def model(self, user: str, path: str) -> preflight.ModelListing:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return preflight.ModelListing(path, "no_user")  # the engine role creates it before the engine starts
        return preflight.as_user(user, preflight.list_model, path)

    def gpus(self, timeout: float) -> list:
        if pynvml is None:
            raise Error("nvidia-ml-py is not installed")
        with NvmlClient(lambda: pynvml, timeout) as nvml:
            return nvml.inventory()["gpus"]

    def port_holders(self, port: int) -> list:
        inodes = set()
        for table in ("tcp", "tcp6"):
            try:
                with open(f"{self.proc_root}/net/{table}") as source:
                    inodes |= preflight.listening_inodes(source.read(), port)
            except FileNotFoundError:
                continue
        if not inodes:
            return []
        wanted, holders, reader = {f"socket:[{inode}]" for inode in inodes}, [], ProcReader(self.proc_root)
        for pid in pid_directories(self.proc_root):
            try:
                links = {os.readlink(f"{self.proc_root}/{pid}/fd/{fd}") for fd in os.listdir(f"{self.proc_root}/{pid}/fd")}
            except OSError:
                continue
            found = links & wanted
            if found:
                holders.append((pid, reader.unit(pid)))
                wanted -= found
        return holders + [(None, None)] * len(wanted)

    def holders(self, request: preflight.Request) -> tuple:
        """Other users' GPU holders and the engines' own outside their units, as the teardown would see them."""
        reader = ProcReader(self.proc_root)
        kill = holders_kill.KillRequest.from_params(dict(
            gpus=request.holder_gpus or None, device_paths=request.device_paths, sources=None, protected=[], protected_pids=[], term_timeout=0, kill_timeout=0,
            max_targets=1, ambiguous="report", nvml_timeout=request.nvml_timeout, lock_timeout=0, units=request.units,
            outside_units="report", owners=request.owners), reader)
        plan = holders_kill.observe(kill, lambda timeout: NvmlClient(lambda: pynvml, timeout), reader)
        escaped = [target for target in plan.targets if target["placement"] != "listed_unit"]
        return plan.foreign, escaped

    def free_bytes(self, path: str) -> int | None:
        try:
            stats = os.statvfs(path)
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize


def run_checks(request: preflight.Request, probe: NodeProbe) -> tuple:
    """The selected checks, in order, the GPUs seen and the GPU holders found outside the engines' units."""
    checks, gpus, holders = [], [], {}
    if "executable" in request.checks:
        checks.append(preflight.check_executable(request, *probe.version(request.version_argv, request.version_timeout)))
    if "model" in request.checks:
        for label, path in request.models:
            listing = probe.model(request.user, path) if os.path.isabs(path) else preflight.ModelListing(path, "hub")
            checks.append(preflight.check_model(label, listing, request.user))
    if "gpus" in request.checks:
        try:
            gpus = probe.gpus(request.nvml_timeout)
            checks.append(preflight.check_gpus(request, len(gpus)))
        except Error as exc:
            checks.append(preflight.check_gpus(request, None, exc.msg))
    if "port" in request.checks:
        checks.append(preflight.check_port(request, probe.port_holders(request.port)))
    if "holders" in request.checks:
        try:
            foreign, escaped = probe.holders(request)
        except Error as exc:
            checks.append(preflight.Check("holders", False, f"GPU holders cannot be read: {exc.msg}"))
        else:
            checks.append(preflight.check_holders(request, foreign, escaped, holders_kill.describe_holders))
            holders = {"foreign": [holder_summary(h) for h in foreign], "escaped": [holder_summary(h) for h in escaped]}
    if "disk" in request.checks and request.install_dir:
        where = preflight.existing_parent(request.install_dir)
        checks.append(preflight.check_disk(request, probe.free_bytes(where), where))
    return checks, gpus, holders


def holder_summary(holder: dict) -> dict:
    return {key: holder.get(key) for key in ("pid", "user", "comm", "unit", "placement", "gpus")}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        request = preflight.Request.from_params(module.params)
        checks, gpus, holders = run_checks(request, NodeProbe())
    except Error as exc:
        module.fail_json(msg=exc.msg, passed=False, checks=[], failures=[exc.msg], gpus=[], holders={}, **exc.context)
    failures = preflight.failures(checks)
    result = dict(changed=False, passed=not failures, failures=failures, checks=[check.as_dict() for check in checks],
                  gpus=[{"index": gpu["index"], "used_mib": gpu.get("used_mib"), "total_mib": gpu.get("total_mib")} for gpu in gpus],
                  holders=holders)
    if failures:
        module.fail_json(msg="preflight: " + "; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
