# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The preflight on the node: what its checks observe (``NodeProbe``, the seam tests replace) and the checks run in
order. engine_preflight runs them as a task of their own; engine_cutover runs them first, before it writes or stops
anything, when the switch has nothing to do between them and its drain.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader, pid_directories
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import preflight

# engine_preflight's options (documented there); engine_cutover's preflight option takes the same keys
OPTIONS = dict(
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
    memory_fraction=dict(type="float"),
    previous=dict(type="dict", options=dict(engine=dict(type="str", choices=["vllm", "sglang"]), memory_fraction=dict(type="float"),
                                            gpus_needed=dict(type="int", default=1), visible_devices=dict(type="str"))),
    model_dir=dict(type="path"),
    tokenizer=dict(type="str", no_log=False),  # a model name, not a secret
    python=dict(type="str"),
    tokenizer_dir=dict(type="path", no_log=False),
    draft_model_dir=dict(type="path"),
)


class NodeProbe:
    """Everything the checks observe on the node: the one seam tests replace."""

    def __init__(self, load_nvml, proc_root: str = "/proc", restart_policy=None):
        self.load_nvml = load_nvml  # returns nvidia-ml-py's module; raises Error when it cannot be imported
        self.proc_root = proc_root
        # a service's (Restart=, main PID), as gpu_holders_kill reads it: ("", 0) where systemd does not run
        self.restart_policy = restart_policy or (lambda _unit: ("", 0))

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

    def compilers(self, executable: str, names: tuple) -> dict:
        """Where each compiler is on the engine's PATH: its executable's directory (a virtualenv's bin), then a
        service's default PATH; None where it is not."""
        path = os.pathsep.join((os.path.dirname(executable),) + preflight.SERVICE_PATH)
        return {name: shutil.which(name, path=path) for name in names}

    def python_headers(self, python: str, timeout: float) -> tuple | None:
        """(the Python.h of ``python``'s headers, whether it exists); None where the interpreter does not say."""
        returncode, output = self.version([python, "-c", preflight.PYTHON_HEADERS_PROBE], timeout)
        lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
        if returncode != 0 or not lines:
            return None
        return lines[-1], os.path.isfile(lines[-1])

    def model(self, user: str, path: str) -> preflight.ModelListing:
        try:
            pwd.getpwnam(user)
        except KeyError:
            return preflight.ModelListing(path, "no_user")  # the engine role creates it before the engine starts
        return preflight.as_user(user, preflight.list_model, path)

    def gpus(self, timeout: float) -> list:
        with NvmlClient(self.load_nvml, timeout) as nvml:
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
        """As the teardown would see them: other users' GPU holders, the engines' own outside their units, the memory
        the foreign ones hold per GPU, and the holders the teardown would refuse to kill alone (a service systemd restarts)."""
        reader = ProcReader(self.proc_root)
        kill = holders_kill.KillRequest.from_params(dict(
            gpus=request.holder_gpus or None, device_paths=request.device_paths, sources=None, protected=[], protected_pids=[], term_timeout=0, kill_timeout=0,
            max_targets=1, ambiguous="report", nvml_timeout=request.nvml_timeout, lock_timeout=0, units=request.units,
            outside_units=request.outside_units, owners=request.owners), reader)
        plan = holders_kill.observe(kill, lambda timeout: NvmlClient(self.load_nvml, timeout), reader, restart_policy=self.restart_policy)
        escaped = [target for target in plan.targets if target["placement"] != "listed_unit" and not target["foreign"]]
        return (plan.foreign, escaped, foreign_memory(plan.inventory, {holder["pid"] for holder in plan.foreign}), plan.restarting,
                holders_kill.incomplete_scan_reasons(plan))

    def interpreter(self, executable: str) -> str | None:
        """The Python an entry-point script runs in: its #! line."""
        try:
            with open(executable, "rb") as script:
                first = script.readline(4096).decode(errors="replace").strip()
        except OSError:
            return None
        return first[2:].split()[0] if first.startswith("#!") and first[2:].strip() else None

    def gguf_loader(self, python: str, timeout: float) -> tuple:
        """What the engine's interpreter can import for a GGUF: ({gguf, in_tree, plugin}, None) or (None, why not)."""
        returncode, output = self.version([python, "-c", preflight.GGUF_LOADER_PROBE], timeout)
        if returncode != 0:
            return None, output.strip().splitlines()[-1] if output and output.strip() else f"exited {returncode}"
        try:
            return json.loads(output.strip().splitlines()[-1]), None
        except (ValueError, IndexError):
            return None, f"answered {output.strip()[:200]!r}"

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
        returncode, output = probe.version(request.version_argv, request.version_timeout)
        checks.append(preflight.check_executable(request, returncode, output))
        version = ([line.strip() for line in (output or "").splitlines() if line.strip()] or [""])[-1]
        needed = preflight.compilers_needed(request.engine, version) if returncode == 0 else ()
        if needed:
            python = request.python or probe.interpreter(request.version_argv[0])
            headers = probe.python_headers(python, request.version_timeout) if needed == preflight.CPU_BUILD_COMPILERS and python else None
            checks.append(preflight.check_compiler(request.engine, version, probe.compilers(request.version_argv[0], needed), headers))
    if "model" in request.checks:
        for label, path in request.models:
            if label in request.staged and not os.path.isabs(path):
                staged = request.staged[label]
                checks.append(preflight.check_staged_model(label, path, probe.model(request.user, staged), request.user))
                continue
            listing = probe.model(request.user, path) if os.path.isabs(path) else preflight.ModelListing(path, "hub")
            if label == "tokenizer" and os.path.isabs(path):
                checks.append(preflight.check_tokenizer(label, listing, request.user))
                continue
            checks.append(preflight.check_model(label, listing, request.user))
    served = [request.staged.get(label, path) for label, path in request.models if label == "model"]
    gguf_model = request.engine == "vllm" and any(path.lower().endswith(".gguf") for path in served)
    if "model" in request.checks and gguf_model and request.version_argv:
        python = request.python or probe.interpreter(request.version_argv[0])
        found, error = probe.gguf_loader(python, request.version_timeout) if python else (None, f"{request.version_argv[0]} names no interpreter")
        checks.append(preflight.check_gguf_loader(python or request.version_argv[0], found, error))
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
            foreign, escaped, memory_by_gpu, restarting, incomplete = probe.holders(request)
        except Error as exc:
            checks.append(preflight.Check("holders", False, f"GPU holders cannot be read: {exc.msg}"))
        else:
            checks.append(preflight.check_holders(request, foreign, escaped, holders_kill.describe_holders, restarting, incomplete))
            fit = preflight.check_fit(request, memory_by_gpu)
            if fit is not None:
                checks.append(fit)
            holders = {"foreign": [holder_summary(h) for h in foreign], "escaped": [holder_summary(h) for h in escaped]}
    if "disk" in request.checks and request.install_dir:
        where = preflight.existing_parent(request.install_dir)
        checks.append(preflight.check_disk(request, probe.free_bytes(where), where))
    return checks, gpus, holders


def foreign_memory(inventory: dict | None, foreign_pids: set[int]) -> list[dict]:
    """Per GPU: its total and the memory NVML lists for the foreign holders on it."""
    gpus = []
    for gpu in (inventory or {}).get("gpus", []):
        mine = [process for process in gpu.get("processes", []) if process["pid"] in foreign_pids]
        gpus.append({"index": gpu["index"], "uuid": gpu.get("uuid"), "total_mib": gpu.get("total_mib"),
                     "foreign_mib": sum(process.get("used_mib") or 0 for process in mine), "foreign_pids": sorted(p["pid"] for p in mine)})
    return gpus


def holder_summary(holder: dict) -> dict:
    return {key: holder.get(key) for key in ("pid", "user", "comm", "unit", "placement", "gpus")}


def outcome(checks: list, gpus: list, holders: dict) -> dict:
    """What engine_preflight returns (and engine_cutover as its preflight): the checks, their failures, GPUs, holders."""
    failures = preflight.failures(checks)
    return dict(passed=not failures, failures=failures, checks=[check.as_dict() for check in checks],
                gpus=[{"index": gpu["index"], "used_mib": gpu.get("used_mib"), "total_mib": gpu.get("total_mib")} for gpu in gpus],
                holders=holders)
