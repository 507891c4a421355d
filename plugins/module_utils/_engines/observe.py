# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""What a node runs, read in one step and changing nothing: each engine's unit (loaded, running, enabled at boot, the
command it was started with), the version its executables run, whether it serves now, and which files exist.

The switch decides from this (the engine to drain and to roll back to, "unchanged", the versions in the report). The
reads go through one seam, NodeReader, which the module builds from the other module_utils and tests replace.
"""

from __future__ import annotations

import glob
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import DEFAULT_DEVICE_GLOBS, HolderScanner, device_nodes
from ansible_collections.gpufleet.serving.plugins.module_utils._node import parked
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader, pid_directories
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import exec_start_argv

# a unit in these states runs (or is about to): its engine is one the switch drains and stops
RUNNING_STATES = ("active", "activating", "reloading", "deactivating")
UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "UnitFileState", "ExecStart", "InvocationID")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True)
class EngineProbe:
    """An engine as the node is asked about it."""
    engine: str
    unit: str
    url: str | None = None
    model: str | None = None
    api_key: str | None = None
    executable: str | None = None  # its configured executable, whose version is read whether it runs or not
    completion: bool = False  # its readiness answer includes a one-token completion

    @classmethod
    def from_params(cls, index: int, params: dict) -> EngineProbe:
        if params.get("engine") not in ("vllm", "sglang"):
            raise InvalidInput(f"engines[{index}].engine: {params.get('engine')!r} is not vllm or sglang")
        if not params.get("unit"):
            raise InvalidInput(f"engines[{index}] ({params['engine']}): give its unit")
        executable = params.get("executable") or None
        if executable and not executable.startswith("/"):
            raise InvalidInput(f"engines[{index}].executable: give an absolute path, got {executable}")
        return cls(engine=params["engine"], unit=params["unit"], url=params.get("url") or None, model=params.get("model") or None,
                   api_key=params.get("api_key") or None, executable=executable, completion=bool(params.get("completion")))


class NodeReader:
    """The seam: every read of the node. The module implements it; tests replace it."""

    def units(self, units: list[str]) -> dict[str, dict[str, str]]:
        """UNIT_PROPERTIES of each unit, in one `systemctl show`."""
        raise NotImplementedError

    def version(self, engine: str, executable: str) -> tuple[str | None, str | None]:
        """(version, None) or (None, why not)."""
        raise NotImplementedError

    def serves(self, probe: EngineProbe) -> dict:
        """Its readiness answer now, with no wait: {ready, ...}; {ready: False, msg} when it cannot answer."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def user(self, name: str) -> dict:
        """{exists, home, shell, groups (supplementary, by name)}."""
        raise NotImplementedError

    def device(self, path: str) -> dict:
        """{exists, group, mode ('0660')}."""
        raise NotImplementedError


def observe(engines: list[EngineProbe], paths: list[str], reader: NodeReader, users: list[str] | None = None,
            devices: list[str] | None = None) -> dict:
    """Per engine: unit, load/active/unit-file state, running, enabled, installed, the argv it was started with, the
    versions of its running and configured executables (with why not), and - for a running engine with a URL -
    whether it serves now. Then which of ``paths`` exist, the ``users`` as they are (an engine's own user) and the
    ``devices``' group and mode (whether that user needs the devices' group)."""
    names = [probe.engine for probe in engines]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidInput(f"engines: {', '.join(twice)} given more than once")
    states = reader.units([probe.unit for probe in engines]) if engines else {}
    running = {probe.engine: (states.get(probe.unit) or {}).get("ActiveState") in RUNNING_STATES for probe in engines}
    argvs = {probe.engine: exec_start_argv((states.get(probe.unit) or {}).get("ExecStart")) if running[probe.engine] else [] for probe in engines}
    reads = list(dict.fromkeys((probe.engine, executable) for probe in engines
                               for executable in argvs[probe.engine][:1] + ([probe.executable] if probe.executable else [])))
    # each version read starts a Python of its own: they run side by side, and beside the readiness requests
    with ThreadPoolExecutor(max_workers=max(1, len(reads))) as pool:
        pending = {key: pool.submit(reader.version, *key) for key in reads}
        answers = {probe.engine: reader.serves(probe) if running[probe.engine] and probe.url else None for probe in engines}
        read = {key: future.result() for key, future in pending.items()}
    found: dict = {}
    for probe in engines:
        properties = states.get(probe.unit) or {}
        versions = {executable: version for (engine, executable), (version, _reason) in read.items() if engine == probe.engine}
        reasons = {executable: reason for (engine, executable), (_version, reason) in read.items() if engine == probe.engine and reason}
        answer = answers[probe.engine]
        found[probe.engine] = {
            "unit": probe.unit,
            "load_state": properties.get("LoadState"),
            "active_state": properties.get("ActiveState"),
            "unit_file_state": properties.get("UnitFileState"),
            "installed": properties.get("LoadState") == "loaded",
            "running": running[probe.engine],
            "enabled": properties.get("UnitFileState") == "enabled",
            "invocation_id": properties.get("InvocationID") or None,
            "argv": argvs[probe.engine],
            "versions": versions,
            "version_reasons": reasons,
            "serving": bool(answer and answer.get("ready")),
            "readiness": answer,
        }
    return {"engines": found, "paths": {path: reader.exists(path) for path in dict.fromkeys(paths)},
            "users": {name: reader.user(name) for name in dict.fromkeys(users or [])},
            "devices": {path: reader.device(path) for path in dict.fromkeys(devices or [])}}


def parked_engine(path: str | None, engines: dict) -> dict | None:
    """The node's parked engine as recorded, with whether it is still that engine's running invocation (alive) and,
    when not, why; None when no engine is parked."""
    record = parked.read_record(path)
    if not record:
        return None
    found = engines.get(record["engine"]) or {}
    if found.get("unit") != record["unit"]:
        return dict(record, alive=False, reason=f"the parked {record['engine']}'s unit {record['unit']} is not its unit now")
    alive, reason = parked.alive(record, {"ActiveState": found.get("active_state"), "InvocationID": found.get("invocation_id")})
    return dict(record, alive=alive, reason=reason)


def park_history(path: str | None) -> dict:
    """What each engine's last park on this node left (engine_cutover keeps it)."""
    return parked.read_history(path)


def answer_records(directory: str | None) -> list[dict]:
    """Each golden record's identity (engine, model, version, command, key) and when it was taken - not its answers."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))) if directory else []:
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("key"):
            found.append({key: record.get(key) for key in ("engine", "model", "version", "command", "key", "created")})
    return found


def host_memory(meminfo: str = "/proc/meminfo") -> dict:
    """The host's available and total memory in bytes (None where unreadable)."""
    values = {}
    try:
        with open(meminfo, encoding="ascii") as handle:
            for line in handle:
                name, rest = line.split(":", 1) if ":" in line else (line, "")
                if name in ("MemAvailable", "MemTotal"):
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"available_bytes": values.get("MemAvailable"), "total_bytes": values.get("MemTotal")}


def weights_bytes(path: str | None) -> int | None:
    """The size of a model directory's weight files (what a park keeps in host memory); None when it is not a directory."""
    if not path or not os.path.isdir(path):
        return None
    total = 0
    for entry in os.scandir(path):
        if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
            total += entry.stat().st_size
    return total


def last_cutover(path: str | None) -> dict | None:
    """The node's record of its last cutover (engine_cutover's record_path), or None: none yet, or unreadable."""
    record = files.read_json_object(path)
    return record if record and record.get("result") else None


def escaped_holders(owner_uids: dict[int, str], units: list[str], device_globs: tuple[str, ...] = DEFAULT_DEVICE_GLOBS,
                    reader: ProcReader | None = None) -> list[dict]:
    """The engines' escaped workers: processes of the engines' own users (``owner_uids``: uid -> name) that hold a GPU
    device outside every engine unit. A target serving as asked leaves them running unless the switch sweeps them;
    only their owners' processes are read (root is never an owner: the system's own processes are not the engines')."""
    nodes = device_nodes(list(device_globs))
    if not owner_uids or not nodes:
        return []
    reader = reader or ProcReader()
    owned = {}
    for pid in pid_directories(reader.root):
        try:
            uid = int(reader.status(pid).get("Uid", "-1").split()[0])
        except (ProcessGone, OSError, ValueError, IndexError):
            continue  # gone, or not ours to read: a process of an owner is readable by root
        if uid in owner_uids:
            owned[pid] = owner_uids[uid]
    found = []
    for pid, holding in sorted(HolderScanner(nodes, reader).scan(sorted(owned)).holdings.items()):
        unit = reader.unit(pid)
        if unit not in units:
            found.append({"pid": pid, "user": owned[pid], "unit": unit, "devices": sorted(holding.devices), "via": sorted(holding.via)})
    return found
