# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Preflight of an engine about to replace another: what must hold before the node is disrupted.

Each check is a pure function of what was observed (``Observed``) and returns a ``Check``: its name, whether it
passed or was skipped, and one line that says why. The observing is done on the node by ``_preflight_node.NodeProbe``.
"""

from __future__ import annotations

import os
import posixpath
import pwd
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._engines.demand import DEMAND_BASIS, demand_fraction
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._models import staging
from ansible_collections.gpufleet.serving.plugins.module_utils._versions import matches_pin

CHECKS = ("executable", "model", "gpus", "port", "disk", "holders")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
LISTEN = "0A"  # TCP state in /proc/net/tcp{,6}
MIB = 1 << 20


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    skipped: bool = False

    def as_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "skipped": self.skipped, "detail": self.detail}


@dataclass
class ModelListing:
    """A model path as the engine's user sees it."""

    path: str
    kind: str  # "directory", "file", "missing", "unreadable", "no_user" (the user does not exist yet)
    config: bool = False
    weights: list = field(default_factory=list)  # (name, bytes)
    unreadable: list = field(default_factory=list)  # names the user cannot read
    incomplete: list = field(default_factory=list)  # why the checkpoint is not whole (a missing shard, a short file)
    names: list = field(default_factory=list)  # every file name in a directory


@dataclass
class Request:
    engine: str
    checks: tuple
    version_argv: list
    version: str | None
    models: list  # [(label, path)]
    staged: dict  # {label: the directory a hub model is staged into on the node}
    user: str
    gpus_needed: int
    visible_devices: list | None
    port: int
    port_owners: list  # units allowed to hold the port (the engines being replaced)
    install_dir: str | None
    install_min_free_mib: int
    nvml_timeout: float = 10
    version_timeout: float = 120
    # the holders check: the units the switch stops, the engines' users, and what becomes of anyone else's holders
    units: list = field(default_factory=list)
    owners: list = field(default_factory=list)
    outside_units: str = "fail"
    holder_gpus: list = field(default_factory=list)  # a selection of GPUs (indexes or UUIDs); empty: all
    # the share of each GPU's memory the target takes (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static);
    # None: the engine's default where it has a fixed one
    memory_fraction: float | None = None
    python: str | None = None  # the engine's interpreter (else read from its executable's #! line)
    device_paths: list = field(default_factory=list)  # the device files whose holders count; empty: the driver's
    # the engine serving now, when it is another: its way back must fit beside the holders report mode leaves
    previous: EngineDemand | None = None

    @classmethod
    def from_params(cls, params: dict) -> Request:
        unknown = sorted(set(params["checks"]) - set(CHECKS))
        if unknown:
            raise InvalidInput(f"checks: unknown {', '.join(unknown)}; known: {', '.join(CHECKS)}")
        if params["gpus_needed"] < 1 or not 1 <= params["port"] <= 65535 or params["install_min_free_mib"] < 0:
            raise InvalidInput("gpus_needed must be at least 1, port 1-65535 and install_min_free_mib at least 0")
        if params["nvml_timeout"] <= 0 or params["version_timeout"] <= 0:
            raise InvalidInput("nvml_timeout and version_timeout must be greater than 0")
        if "executable" in params["checks"] and not params["version_argv"]:
            raise InvalidInput("version_argv: the command that prints the engine's version is required by the executable check")
        visible = params["visible_devices"]
        models = ([("model", params["model"])] + ([("draft model", params["draft_model"])] if params["draft_model"] else [])
                  + ([("tokenizer", params["tokenizer"])] if params.get("tokenizer") else []))
        # where a hub model is staged on the node (the stage step downloads and verifies it before the drain)
        staged = {label: directory for label, directory in (("model", params.get("model_dir")), ("draft model", params.get("draft_model_dir")),
                                                            ("tokenizer", params.get("tokenizer_dir"))) if directory}
        for label, directory in staged.items():
            if not posixpath.isabs(directory):
                raise InvalidInput(f"{label.replace(' ', '_')}_dir: give the absolute directory it is staged into, got {directory!r}")
        return cls(engine=params["engine"], checks=tuple(params["checks"]), version_argv=list(params["version_argv"] or []),
                   version=params["version"] or None, models=models, staged=staged, user=params["user"], gpus_needed=params["gpus_needed"],
                   visible_devices=[d.strip() for d in visible.split(",") if d.strip()] if visible else None,
                   port=params["port"], port_owners=list(params["port_owners"] or []), install_dir=params["install_dir"] or None,
                   install_min_free_mib=params["install_min_free_mib"], nvml_timeout=params["nvml_timeout"],
                   version_timeout=params["version_timeout"], units=list(params.get("units") or []),
                   owners=list(params.get("owners") or []), outside_units=params.get("outside_units") or "fail",
                   holder_gpus=list(params.get("gpus") or []), device_paths=list(params.get("device_paths") or []),
                   memory_fraction=memory_fraction(params.get("memory_fraction")),
                   python=params.get("python") or None,
                   previous=EngineDemand.from_params(params.get("previous"), params["engine"]))


@dataclass(frozen=True)
class EngineDemand:
    """What an engine takes of each GPU it uses: its configured share (None: the engine's own default) and where it runs."""

    engine: str
    fraction: float | None = None
    gpus_needed: int = 1
    visible_devices: list | None = None

    @classmethod
    def from_params(cls, value: dict | None, target: str) -> EngineDemand | None:
        """The previous engine's demand; none when there is none, or when it is the target (a change in place: its way
        back is the configuration it replaces, whose share is not known here)."""
        if not value or not value.get("engine") or value["engine"] == target:
            return None
        if value["engine"] not in DEMAND_BASIS:
            raise InvalidInput(f"previous.engine: {value['engine']!r} is not one of {', '.join(DEMAND_BASIS)}")
        visible = value.get("visible_devices")
        return cls(engine=value["engine"], fraction=memory_fraction(value.get("memory_fraction"), "previous.memory_fraction"),
                   gpus_needed=int(value.get("gpus_needed") or 1),
                   visible_devices=[d.strip() for d in str(visible).split(",") if d.strip()] if visible else None)


def memory_fraction(value, name: str = "memory_fraction") -> float | None:
    if value is None or value == "":
        return None
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{name}: {value!r} is not a number") from None
    if not 0 < fraction <= 1:
        raise InvalidInput(f"{name}: must be more than 0 and at most 1, got {value!r}")
    return fraction


# --- the checks ------------------------------------------------------------------------------------------------------
def check_executable(request: Request, returncode: int | None, output: str) -> Check:
    command = " ".join(request.version_argv)
    if returncode is None:
        return Check("executable", False, f"{command}: {output or 'cannot be run'}")
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if returncode != 0:
        return Check("executable", False, f"{command} exited {returncode}: {lines[-1] if lines else 'no output'}")
    found = lines[-1] if lines else ""
    # a local build of the pin counts (vLLM's CPU build reports 0.32.0+cpu for the pin 0.32.0)
    if request.version and not matches_pin(found or None, request.version):
        return Check("executable", False, f"{command} reports {found or 'no version'}, the pinned version is {request.version}")
    return Check("executable", True, f"{request.engine} {found or '(no version printed)'}")


# A service's PATH where its unit sets none (systemd's default, merged-/usr Debian and RHEL alike)
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# What vLLM compiles with at run time, after it serves: its CPU build's torch.compile (Inductor) builds C++ kernels with
# g++; on GPUs, Triton builds each kernel's launcher with a C compiler (gcc or clang, as Triton looks them up)
CPU_BUILD_COMPILERS = ("g++",)
GPU_BUILD_COMPILERS = ("gcc", "clang")


def compilers_needed(engine: str, version: str) -> tuple[str, ...]:
    """The compilers an engine needs at run time (any one of them), by the version it reports; () where none."""
    if engine != "vllm":
        return ()
    return CPU_BUILD_COMPILERS if "cpu" in version else GPU_BUILD_COMPILERS


# what the CPU build's kernels include: its interpreter's Python.h (where sysconfig says its headers are)
PYTHON_HEADERS_PROBE = "import os, sysconfig; print(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"


def check_compiler(engine: str, version: str, found: dict, headers: tuple | None = None) -> Check | None:
    """vLLM compiles kernels the first time a request needs them (a sampler with logprobs, a new batch shape), long after
    it reported ready: without a compiler there its engine core dies on that request and answers 500 to every later
    one. ``found``: {compiler: its path or None}, looked up on the engine's PATH; ``headers``: (the Python.h its CPU
    build's kernels include, whether it exists), None where not read."""
    needed = compilers_needed(engine, version)
    if not needed:
        return None
    present = [f"{name} ({found[name]})" for name in needed if found.get(name)]
    cpu = needed == CPU_BUILD_COMPILERS
    consequence = ("at the first request that needs a new kernel; without it its engine core dies there and every later request "
                   "fails")
    if not present:
        build = "its CPU build compiles C++ kernels with torch.compile" if cpu else "Triton builds its kernels' launchers"
        return Check("compiler", False, f"{engine} {version} needs {' or '.join(needed)} on its PATH ({build} {consequence}): "
                                        f"install {'g++' if cpu else 'gcc'} on the node")
    if cpu and headers is not None and not headers[1]:
        return Check("compiler", False, f"{engine} {version} compiles C++ kernels that include {headers[0]}, which is not there "
                                        f"({consequence}): install its Python's development headers (python3-dev) on the node")
    return Check("compiler", True, f"{engine} {version} compiles kernels at run time with {present[0]}"
                                   + (f" and {headers[0]}" if cpu and headers else ""))


def check_staged_model(label: str, hub_name: str, listing: ModelListing, user: str) -> Check:
    """A hub model staged on the node: checked where it is, as a model directory is; not there yet, the stage step
    downloads and verifies it before the drain."""
    if listing.kind == "missing":
        return Check("model", True, f"{label} {hub_name}: not staged yet - the stage step downloads it into {listing.path} and verifies it "
                                    "before the drain", skipped=True)
    check = check_tokenizer if label == "tokenizer" else check_model
    return check(f"{label} {hub_name} staged at", listing, user)


def check_tokenizer(label: str, listing: ModelListing, user: str) -> Check:
    """A tokenizer directory (a GGUF's base model's): readable by the engine's user, holding a tokenizer file."""
    path = listing.path
    if listing.kind == "missing":
        return Check("model", False, f"{label} {path} does not exist")
    if listing.kind == "unreadable":
        return Check("model", False, f"{label} {path} cannot be read by {user}")
    if listing.kind != "directory":
        return Check("model", False, f"{label} {path} is not a directory")
    problem = staging.tokenizer_problem(listing.names)
    if problem:
        return Check("model", False, f"{label} {path}: {problem}")
    return Check("model", True, f"{label} {path}: {len(listing.names)} file(s), readable by {user}")


# run in the engine's own Python: what vLLM's GGUF loader needs (the gguf package; an in-tree loader or the plugin)
GGUF_LOADER_PROBE = """
import importlib.util, json
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:
        return False
print(json.dumps({"gguf": found("gguf"), "in_tree": found("vllm.model_executor.model_loader.gguf_loader"),
                  "plugin": found("vllm_gguf_plugin")}))
"""


def check_gguf_loader(python: str, found: dict | None, error: str | None = None) -> Check:
    """vLLM loads a GGUF with the gguf package, through its own loader or, in releases that moved it out of tree, the
    vllm-gguf-plugin package (vLLM's GGUF docs): both checked in the unit's own interpreter, before the drain."""
    if found is None:
        return Check("model", False, f"the engine's Python {python} could not be asked whether it loads GGUF: {error}")
    missing = ([] if found.get("gguf") else ["gguf (vLLM's GGUF loader imports it)"]) + (
        [] if found.get("in_tree") or found.get("plugin") else ["vllm-gguf-plugin (this vLLM has no GGUF loader of its own)"])
    if missing:
        return Check("model", False, f"the model is a GGUF and the engine's Python {python} lacks {' and '.join(missing)}: install it "
                                     "into the engine's environment (vllm_gguf_packages with vllm_install)")
    return Check("model", True, f"the engine's Python {python} loads GGUF (gguf, {'the in-tree loader' if found.get('in_tree') else 'vllm-gguf-plugin'})")


def check_model(label: str, listing: ModelListing, user: str) -> Check:
    path = listing.path
    if not posixpath.isabs(path):
        return Check("model", True, f"{label} {path}: a hub name, fetched by the engine when it starts (not staged, not checked here)",
                     skipped=True)
    if listing.kind == "no_user":
        return Check("model", True, f"{label} {path}: not checked, the user {user} does not exist yet (the engine role creates it "
                                    "before the engine starts)", skipped=True)
    if listing.kind == "missing":
        return Check("model", False, f"{label} {path} does not exist")
    if listing.kind == "unreadable":
        return Check("model", False, f"{label} {path} cannot be read by {user}")
    if listing.kind == "file":
        if not path.endswith(".gguf"):
            return Check("model", False, f"{label} {path} is a file, not a model directory")
    elif not listing.config:
        return Check("model", False, f"{label} {path} has no config.json")
    elif not listing.weights:
        return Check("model", False, f"{label} {path} has no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    if listing.incomplete:
        return Check("model", False, f"{label} {path} is incomplete: {'; '.join(listing.incomplete[:5])}"
                                     + (f" and {len(listing.incomplete) - 5} more" if len(listing.incomplete) > 5 else ""))
    if listing.unreadable:
        return Check("model", False, f"{label} {path}: {user} cannot read {', '.join(sorted(listing.unreadable)[:3])}"
                                     + (f" and {len(listing.unreadable) - 3} more" if len(listing.unreadable) > 3 else ""))
    size = sum(size for _name, size in listing.weights)
    return Check("model", True, f"{label} {path}: {len(listing.weights)} weight file(s), {size / 2**30:.2f} GiB, readable by {user}")


def check_holders(request: Request, foreign: list, escaped: list, describe, restarting: list | None = None,
                  incomplete: list | None = None) -> Check:
    """Another user's GPU holders stop the switch before anything is disrupted, unless it may kill them; so does a
    holder the teardown would refuse to kill alone (the main process of a service systemd restarts).

    foreign: holders outside the engines' units not run by their users; escaped: the engines' users' holders outside
    their units (killed by the teardown); restarting: holders the teardown would kill in a service with Restart=;
    describe(holders) names them (pid, user, command, unit); incomplete: why the scan could not see every process's
    open files (a capability missing, possible holders named), as the teardown would refuse it.
    """
    if incomplete:
        return Check("holders", False, f"the scan for GPU holders is incomplete: {'; '.join(incomplete)}. Nothing was touched: the "
                                       "teardown would refuse it too")
    if restarting:
        units = sorted({f"{holder['unit']} (Restart={holder.get('restart')})" for holder in restarting})
        return Check("holders", False, f"GPU holders run as the main process of {', '.join(units)}, which systemd would start again "
                                       f"({describe(restarting)}). Nothing was touched: stop that unit first, or add it to the units")
    escaped_line = f"; the engines' own outside their units, killed by the teardown: {describe(escaped)}" if escaped else ""
    if not foreign:
        return Check("holders", True, "no other user's process holds a GPU" + escaped_line)
    named = f"{len(foreign)} process(es) of other users hold GPUs: {describe(foreign)}"
    if request.outside_units == "fail":
        return Check("holders", False, f"{named}. Nothing was touched: stop them, or let the teardown kill them (outside_units: kill)"
                                       + escaped_line)
    fate = "killed by the teardown" if request.outside_units == "kill" else "left running (the memory they hold is not counted against the engine)"
    return Check("holders", True, f"{named}; {fate} (outside_units: {request.outside_units})" + escaped_line)


def target_gpus(request: Request, gpus: list[dict]) -> list[dict]:
    """The GPUs the target will use: those its visible devices name (index or UUID), else the first gpus_needed."""
    return engine_gpus(request.visible_devices, request.gpus_needed, gpus)


def engine_gpus(visible_devices: list | None, gpus_needed: int, gpus: list[dict]) -> list[dict]:
    if visible_devices:
        wanted = set(visible_devices)
        return [gpu for gpu in gpus if str(gpu["index"]) in wanted or gpu.get("uuid") in wanted]
    return sorted(gpus, key=lambda gpu: gpu["index"])[:gpus_needed]


def shortfalls(demand: EngineDemand, gpus: list[dict]) -> tuple[list[str], list[str]]:
    """On each GPU the engine uses that another user's process holds memory on: what the engine needs and what is left.
    Returns the GPUs where it does not fit and the shares it was judged by."""
    short, shares = [], []
    for gpu in engine_gpus(demand.visible_devices, demand.gpus_needed, gpus):
        if not gpu["foreign_mib"] or not gpu.get("total_mib"):
            continue
        fraction, basis = demand_fraction(demand.engine, demand.fraction, gpu["total_mib"])
        shares.append(f"{fraction:g} {basis}")
        needed = round(gpu["total_mib"] * fraction)
        left = gpu["total_mib"] - gpu["foreign_mib"]
        if needed > left:
            short.append(f"GPU {gpu['index']}: {demand.engine} needs {fraction:g} ({basis}) x {gpu['total_mib']} = {needed} MiB, "
                         f"{gpu['foreign_mib']} MiB held by pid(s) {', '.join(str(pid) for pid in gpu['foreign_pids'])} leave {left} MiB")
    return short, sorted(set(shares))


def check_fit(request: Request, gpus: list[dict]) -> Check | None:
    """outside_units=report: the target must fit beside the foreign holders it leaves running, on each of its GPUs, and so
    must the way back - the previous engine started again (a rollback) - or the node could end with no engine.

    gpus: [{index, total_mib, foreign_mib, foreign_pids}] from NVML. Each engine takes its share of each GPU's total
    (demand_fraction: its setting, else its own default); the switch refuses before the drain where either cannot.
    """
    if request.outside_units != "report" or not any(gpu["foreign_mib"] for gpu in gpus):
        return None
    target = EngineDemand(request.engine, request.memory_fraction, request.gpus_needed, request.visible_devices)
    short, shares = shortfalls(target, gpus)
    back, back_shares = shortfalls(request.previous, gpus) if request.previous else ([], [])
    way_back = (f"the way back does not fit either: {'; '.join(back)}" if back else
                f"the way back fits ({request.previous.engine} at {', '.join(back_shares) or 'its share'})" if request.previous else "")
    if short:
        return Check("fit", False, f"the target cannot fit beside the GPU processes outside_units=report leaves running: "
                                   f"{'; '.join(short)}{'; ' + way_back if way_back else ''}. Nothing was touched: "
                                   + ("set its memory fraction (SGLang's own default was judged at the most it can take)"
                                      if DEMAND_BASIS["sglang"] in " ".join(short) else "lower its memory fraction")
                                   + ", or free those GPUs")
    if back:
        return Check("fit", False, f"the way back cannot fit beside the GPU processes outside_units=report leaves running: should "
                                   f"{request.engine} fail to start, {request.previous.engine} could not start again - {'; '.join(back)}; the "
                                   f"target fits ({', '.join(shares)}). Nothing was touched: free those GPUs, or lower "
                                   f"{request.previous.engine}'s memory fraction first")
    fits = f"the target fits beside the GPU processes left running ({', '.join(shares) or 'on GPUs they do not hold'})"
    return Check("fit", True, fits + (f"; {way_back}" if way_back else ""))


def check_gpus(request: Request, nvml_count: int | None, error: str | None = None) -> Check:
    if nvml_count is None:
        return Check("gpus", False, f"NVML cannot be read: {error}")
    if request.visible_devices is not None:
        beyond = [d for d in request.visible_devices if not d.isdigit() or int(d) >= nvml_count]
        if beyond:
            return Check("gpus", False, f"CUDA_VISIBLE_DEVICES names {', '.join(beyond)}, but NVML sees GPUs 0-{nvml_count - 1}")
        available, where = len(request.visible_devices), "visible (CUDA_VISIBLE_DEVICES)"
    else:
        available, where = nvml_count, "seen by NVML"
    if request.gpus_needed > available:
        return Check("gpus", False, f"tensor x data parallel needs {request.gpus_needed} GPU(s), {available} {where}")
    return Check("gpus", True, f"needs {request.gpus_needed} GPU(s), {available} {where}")


def check_port(request: Request, holders: list) -> Check:
    """holders: [(pid, unit)] of the processes listening on the port (pid None: its owner was not found)."""
    foreign = [(pid, unit) for pid, unit in holders if unit not in request.port_owners]
    if foreign:
        named = ", ".join(f"pid {pid} ({unit or 'no unit'})" if pid else "a socket of no process found" for pid, unit in foreign[:3])
        return Check("port", False, f"port {request.port} is taken by {named}, not by the engine being replaced")
    if holders:
        return Check("port", True, f"port {request.port} is held by {', '.join(sorted({u for _p, u in holders}))}, which the switch stops")
    return Check("port", True, f"port {request.port} is free")


def check_disk(request: Request, free_bytes: int | None, where: str) -> Check:
    if free_bytes is None:
        return Check("disk", False, f"cannot read the free space of {where}")
    needed = request.install_min_free_mib * MIB
    if free_bytes < needed:
        return Check("disk", False, f"{where} has {free_bytes / 2**30:.1f} GiB free, the install needs {needed / 2**30:.1f} GiB")
    return Check("disk", True, f"{where} has {free_bytes / 2**30:.1f} GiB free for the install")


def failures(checks: list) -> list:
    return [check.detail for check in checks if not check.passed]


# --- parsing what was observed -----------------------------------------------------------------------------------------
def listening_inodes(table: str, port: int) -> set:
    """Socket inodes listening on `port` in a /proc/net/tcp or tcp6 table."""
    inodes = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        try:
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
        except (IndexError, ValueError):
            continue
        if local_port == port:
            inodes.add(fields[9])
    return inodes


def existing_parent(path: str) -> str:
    """The nearest existing directory of a path (an install directory may not exist yet)."""
    path = posixpath.normpath(path)
    while not os.path.isdir(path) and path != "/":
        path = posixpath.dirname(path)
    return path


# --- observing (the module's seam) -------------------------------------------------------------------------------------
def list_model(path: str) -> ModelListing:
    """What the current process sees of a model path; run as the engine's user (``as_user``)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return ModelListing(path, "missing")
    except OSError:  # a directory on the way this user cannot search
        return ModelListing(path, "unreadable")
    if os.path.isfile(path):
        readable = os.access(path, os.R_OK)
        return ModelListing(path, "file", weights=[(os.path.basename(path), os.path.getsize(path))] if readable else [],
                            unreadable=[] if readable else [os.path.basename(path)])
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return ModelListing(path, "unreadable")
    listing = ModelListing(path, "directory", config="config.json" in names, names=list(names))
    for name in names:
        full = posixpath.join(path, name)
        if name == "config.json" or name.endswith(WEIGHT_SUFFIXES):
            if not os.access(full, os.R_OK):
                listing.unreadable.append(name)
            elif name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(full):
                listing.weights.append((name, os.path.getsize(full)))
    if listing.config and listing.weights and not listing.unreadable:
        listing.incomplete = checkpoint_gaps(path, names)
    return listing


def checkpoint_gaps(path: str, names: list) -> list:
    """What the checkpoint's index names that is not there, safetensors files shorter or longer than their headers say,
    split GGUF parts missing (model_stage's checks), read as the current user."""
    files = {name: os.path.getsize(posixpath.join(path, name)) for name in names if os.path.isfile(posixpath.join(path, name))}

    def read_head(name: str, count: int) -> bytes:
        with open(posixpath.join(path, name), "rb") as source:
            return source.read(count)
    try:
        return staging.checkpoint_problems(staging.Listing(files, read_head))
    except OSError as exc:
        return [f"cannot be read: {exc}"]


def as_user(user: str, function, *args):
    """function(*args) in a child process running as `user` (its groups, gid, uid); returns what it returns.

    Access is decided by the kernel for that user, not guessed from modes: ACLs, groups and directory search bits count.
    """
    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return function(*args)
    import pickle

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            data = pickle.dumps(("ok", function(*args)))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            data = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
        os.write(write_end, data)
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    status, value = pickle.loads(b"".join(chunks))
    if status != "ok":
        raise InvalidInput(f"cannot check files as {user}: {value}")
    return value
