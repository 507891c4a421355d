# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""NVML through nvidia-ml-py, in a worker process so that a hung call cannot hang the task.

NVML can block in the kernel after Xid errors, so every query is a request to a forked worker
answered within `call_timeout`; a worker that misses it is killed and NvmlHung raised. Only
NVML is used: no CUDA context is ever created on the GPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
import traceback

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput, NvmlHung, NvmlUnavailable

# the modules import nvidia-ml-py from here (re-exported: one import for all of them)
try:
    import pynvml  # pylint: disable=unused-import
except ImportError:  # a module that needs it fails naming it (missing_required_lib), with this traceback
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
GPU_STATUS_BY_ERROR = {NVML_ERROR_GPU_IS_LOST: "lost", NVML_ERROR_RESET_REQUIRED: "reset_required"}
MIB = 1024 * 1024
UNKNOWN_MEMORY = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE, also returned as garbage by some drivers


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_inventory(nvml) -> dict:
    """Every GPU NVML sees, with memory and process lists. Runs inside the worker."""
    inventory = {"driver_version": _text(nvml.nvmlSystemGetDriverVersion()), "gpus": []}
    for index in range(nvml.nvmlDeviceGetCount()):
        gpu = {"index": index, "status": "ok", "processes": []}
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu["uuid"] = _text(nvml.nvmlDeviceGetUUID(handle))
            gpu["name"] = _text(nvml.nvmlDeviceGetName(handle))
            gpu["bus_id"] = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            gpu["minor"] = nvml.nvmlDeviceGetMinorNumber(handle)
            gpu.update(_memory(nvml, handle))
            gpu["processes"] = _processes(nvml, handle)
        except nvml.NVMLError as exc:
            gpu["status"] = GPU_STATUS_BY_ERROR.get(exc.value, "error")
            gpu["error"] = str(exc)
        inventory["gpus"].append(gpu)
    return inventory


def _memory(nvml, handle) -> dict:
    """v2 reports the driver reserve apart from `used`; v1 counts it as used (615 MiB on an idle H200)."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return {"memory_api": "v2", "total_mib": info.total // MIB, "used_mib": info.used // MIB, "reserved_mib": info.reserved // MIB}
    except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported, nvml.NVMLError_ArgumentVersionMismatch):
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {"memory_api": "v1", "total_mib": info.total // MIB, "used_mib": info.used // MIB, "reserved_mib": None}


def _processes(nvml, handle) -> list[dict]:
    listed = []
    queries = (("compute", nvml.nvmlDeviceGetComputeRunningProcesses), ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
               ("mps", nvml.nvmlDeviceGetMPSComputeRunningProcesses))
    for kind, query in queries:
        try:
            entries = query(handle)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            continue
        for entry in entries:
            used = entry.usedGpuMemory
            listed.append({"pid": int(entry.pid), "used_mib": None if used in (None, UNKNOWN_MEMORY) else used // MIB, "type": kind})
    return listed


def _worker_main(nvml_loader, requests: int, responses: int) -> None:
    """Answer one JSON line per request line until the parent closes the pipe."""
    nvml = None
    with os.fdopen(requests, "rb") as inbox, os.fdopen(responses, "wb", buffering=0) as outbox:
        for _request in inbox:
            try:
                if nvml is None:
                    nvml = nvml_loader()
                    nvml.nvmlInit()
                reply = {"inventory": read_inventory(nvml)}
            except Exception as exc:  # noqa: BLE001 - every failure must reach the parent as data
                reply = {"error": {"code": getattr(exc, "value", None), "message": str(exc) or type(exc).__name__}}
            outbox.write(json.dumps(reply).encode() + b"\n")


class NvmlClient:
    """Parent side of the worker. Use as a context manager; inventory() may raise NvmlHung/NvmlUnavailable."""

    def __init__(self, nvml_loader, call_timeout: float):
        self.nvml_loader = nvml_loader
        self.call_timeout = call_timeout
        self.pid: int | None = None
        self._to_worker = self._from_worker = None
        self._buffer = b""

    def __enter__(self) -> NvmlClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self) -> None:
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # worker: never returns into the module
            code = 0
            try:
                os.close(request_write)
                os.close(response_read)
                devnull = os.open(os.devnull, os.O_RDWR)
                # stdout carries the module's JSON result; a worker left hung in the driver must hold neither it nor
                # stderr open, or whoever reads them (Ansible over SSH) waits for it
                for descriptor in (0, 1, 2):
                    os.dup2(devnull, descriptor)
                _worker_main(self.nvml_loader, request_read, response_write)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(request_read)
        os.close(response_write)
        self.pid, self._to_worker, self._from_worker = pid, request_write, response_read

    def inventory(self) -> dict:
        if self.pid is None:
            self._start()
        os.write(self._to_worker, b"inventory\n")
        reply = json.loads(self._read_line())
        if "error" in reply:
            raise _unavailable(reply["error"])
        return reply["inventory"]

    def _read_line(self) -> bytes:
        deadline = time.monotonic() + self.call_timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            ready = select.select([self._from_worker], [], [], max(0.0, remaining))[0] if remaining > 0 else []
            if not ready:
                self._abandon()
                raise NvmlHung(f"an NVML call did not return within nvml_timeout={self.call_timeout:g}s (driver hung?)", nvml_hung=True)
            chunk = os.read(self._from_worker, 65536)
            if not chunk:
                self._abandon()
                raise NvmlUnavailable("the NVML worker process died (NVML library crashed?)")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _abandon(self) -> None:
        """Kill a worker that stopped answering; one stuck in the kernel is left, never waited for."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._reap(timeout=0.5)
        self._close_pipes()

    def close(self) -> None:
        if self.pid is not None:
            self._close_pipes()  # EOF ends the worker's loop
            if not self._reap(timeout=2.0):
                self._abandon()

    def _close_pipes(self) -> None:
        for fd in (self._to_worker, self._from_worker):
            if fd is not None:
                os.close(fd)
        self._to_worker = self._from_worker = None

    def _reap(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, _status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid = self.pid
            if pid:
                self.pid = None
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def _unavailable(error: dict) -> NvmlUnavailable:
    code = error.get("code")
    hints = {
        NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed on this host?",
        NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        NVML_ERROR_NO_PERMISSION: "NVML refused access: run the task as root (become: true)",
    }
    message = hints.get(code, "NVML failed")
    return NvmlUnavailable(f"{message} ({error.get('message')})", nvml_error=error.get("message"), nvml_error_code=code)


def select_gpus(selectors: list[str] | None, inventory: dict) -> list[int]:
    """NVML indexes for `gpus` (indexes or UUIDs); all GPUs when no selector is given."""
    gpus = inventory["gpus"]
    if not selectors:
        return [gpu["index"] for gpu in gpus]
    by_uuid = {gpu.get("uuid"): gpu["index"] for gpu in gpus if gpu.get("uuid")}
    selected = []
    for selector in selectors:
        text = str(selector).strip()
        if text.isdigit():
            index = int(text)
            if index >= len(gpus):
                raise InvalidInput(f"gpus: GPU index {index} does not exist: NVML sees {len(gpus)} GPU(s)"
                                   + (f" (indexes 0-{len(gpus) - 1})" if gpus else ""))
        elif text in by_uuid:
            index = by_uuid[text]
        else:
            raise InvalidInput(f"gpus: no GPU has UUID {text!r}; known UUIDs: {', '.join(sorted(by_uuid)) or 'none'}")
        if index not in selected:
            selected.append(index)
    return selected


def validate_gpu_selectors(selectors: list[str] | None) -> None:
    """Syntax only (existence needs NVML): a non-negative index or a GPU-/MIG- UUID."""
    for selector in selectors or []:
        text = str(selector).strip()
        if not (text.isdigit() or (text.startswith(("GPU-", "MIG-")) and len(text) > 4 and text.isprintable() and " " not in text)):
            raise InvalidInput(f"gpus: {selector!r} is neither a GPU index (0, 1, ...) nor a UUID (GPU-...)")
