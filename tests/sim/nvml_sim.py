"""Driver for the simulated libnvidia-ml.so.1 (tests/sim/nvml/sim_nvml.c).

The library re-reads its state on every NVML call, so tests, and the engine doubles of the
simulated lab, change what NVML reports by writing files under one root directory:

    <root>/state      driver_version=..., one "gpu ..." line per GPU, "fault ..." lines
    <root>/alloc/*    one line per allocation:
                      gpu=<index> mib=<n> pid=<pid NVML reports> kind=compute holder=<pid>:<start time> ...

An allocation counts as used memory while any of its holders is alive (a zombie leader with
live threads is alive), which is how the driver keeps a context while any process holds its
file descriptors. `pid` may name a process that is already dead: that is NVML's stale PID.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml") / "sim_nvml.c"
LIBRARY_NAME = "libnvidia-ml.so.1"
ROOT_ENV = "GPUFLEET_SIM_NVML_ROOT"

# NVML error codes the simulation can inject (nvml.h values).
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16


def build_library(out_dir: Path) -> Path:
    """Compile the library into out_dir/<source hash>/, once per source version."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    target = Path(out_dir) / digest / LIBRARY_NAME
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        compiler = os.environ.get("CC", "cc")
        subprocess.run([compiler, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)], check=True)
        partial.rename(target)
    return target


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: clock ticks since boot, the kernel's process identity."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
        after_comm = stat.read().rsplit(")", 1)[1].split()
    return int(after_comm[19])


@dataclass
class SimGpu:
    index: int
    minor: int
    uuid: str
    bus_id: str
    name: str = "NVIDIA H200"
    total_mib: int = 143771
    reserved_mib: int = 615
    leaked_mib: int = 0
    status: str = "ok"  # ok | lost | reset_required

    def line(self) -> str:
        return (
            f"gpu minor={self.minor} uuid={self.uuid} bus_id={self.bus_id} total_mib={self.total_mib} "
            f"reserved_mib={self.reserved_mib} leaked_mib={self.leaked_mib} status={self.status} name={self.name}"
        )


def default_gpus(count: int, minors: list[int] | None = None) -> list[SimGpu]:
    """count GPUs with distinct UUIDs and bus ids; minors may be permuted against the NVML index."""
    minors = minors if minors is not None else list(range(count))
    return [
        SimGpu(index=i, minor=minors[i], uuid=f"GPU-5afe0000-0000-4000-8000-{i:012x}", bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0")
        for i in range(count)
    ]


@dataclass
class SimNvml:
    root: Path
    gpus: list[SimGpu] = field(default_factory=list)
    faults: dict[str, str] = field(default_factory=dict)
    driver_version: str = "580.159.04"

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self._allocation_directory()
        self.write()

    def _allocation_directory(self) -> None:
        # engines run as their own users: like /tmp, anyone may add an allocation, only its owner remove it
        (self.root / "alloc").mkdir(parents=True, exist_ok=True)
        (self.root / "alloc").chmod(0o1777)

    @property
    def env(self) -> dict[str, str]:
        return {ROOT_ENV: str(self.root)}

    def write(self) -> None:
        lines = [f"driver_version={self.driver_version}"]
        lines += [gpu.line() for gpu in self.gpus]
        lines += [f"fault function={function} result={result}" for function, result in self.faults.items()]
        partial = self.root / "state.partial"
        partial.write_text("\n".join(lines) + "\n", encoding="ascii")
        partial.rename(self.root / "state")

    def set_gpus(self, gpus: list[SimGpu]) -> None:
        self.gpus = gpus
        self.write()

    def fault(self, function: str, result: str | int) -> None:
        """Make an NVML function hang ("hang"), answer late ("slow:<ms>") or return an NVML error code."""
        self.faults[function] = str(result)
        self.write()

    def clear_faults(self) -> None:
        self.faults.clear()
        self.write()

    def allocate(self, gpu: int, mib: int, holders: list[int], reported_pid: int | None = None, kind: str = "compute",
                 linger_ms: int = 0, leak: bool = False, unknown_used: bool = False) -> Path:
        return allocate(self.root, gpu, mib, holders, reported_pid, kind, linger_ms, leak, unknown_used)

    def release_all(self) -> None:
        shutil.rmtree(self.root / "alloc")
        self._allocation_directory()


_serial = itertools.count()


class OutOfMemory(RuntimeError):
    """An allocation beyond what the GPU has left, refused as a real GPU's cudaMalloc refuses it."""


def _holder_alive(word: str) -> bool:
    pid, _colon, start = word.partition(":")
    try:
        return process_start_time(int(pid)) == int(start)
    except (OSError, ValueError, IndexError):
        return False


def used_mib(root: Path, gpu: int) -> tuple[int, int]:
    """(used, total) MiB of one GPU as the library counts them: the reserved and leaked memory, and each allocation
    while a holder lives, while it lingers after the last one, or forever when leaked."""
    root = Path(root)
    total = reserved = 0
    try:
        gpu_lines = [line for line in (root / "state").read_text(encoding="ascii").splitlines() if line.startswith("gpu ")]
    except FileNotFoundError:
        return 0, 0  # no GPUs described: nothing to hold an allocation against
    if 0 <= gpu < len(gpu_lines):  # listed in NVML index order
        words = dict(word.split("=", 1) for word in gpu_lines[gpu].split() if "=" in word)
        total = int(words.get("total_mib", 0))
        reserved = int(words.get("reserved_mib", 0)) + int(words.get("leaked_mib", 0))
    used = reserved
    for path in (root / "alloc").iterdir():
        if path.name.startswith("."):
            continue
        try:
            words = path.read_text(encoding="ascii").split()
        except (FileNotFoundError, PermissionError, UnicodeDecodeError):
            continue  # gone, or written by an older lab without read access: the library skips it too
        fields = dict(word.split("=", 1) for word in words if "=" in word)
        if int(fields.get("gpu", -1)) != gpu:
            continue
        holders = [word[len("holder="):] for word in words if word.startswith("holder=")]
        lingering = path.with_name(f".{path.name}.gone")
        if (fields.get("leak") == "1" or any(_holder_alive(holder) for holder in holders)
                or (int(fields.get("linger_ms", 0)) and not lingering.exists())
                or (lingering.exists() and _lingers(lingering, int(fields.get("linger_ms", 0))))):
            used += int(fields.get("mib", 0))
    return used, total


def _lingers(marker: Path, linger_ms: int) -> bool:
    try:
        gone_ms = int(marker.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return time.time() * 1000 - gone_ms < linger_ms


class _CapacityLock:
    """One allocation at a time decides against the GPU's capacity (engines run as their own users: any may lock)."""

    def __init__(self, root: Path):
        self.path = Path(root) / "alloc" / ".capacity.lock"

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            if os.fstat(self.fd).st_uid == os.geteuid():
                os.fchmod(self.fd, 0o666)
        except PermissionError:
            self.fd = os.open(self.path, os.O_RDONLY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *_exc):
        os.close(self.fd)


def allocate(root: Path, gpu: int, mib: int, holders: list[int], reported_pid: int | None = None, kind: str = "compute",
             linger_ms: int = 0, leak: bool = False, unknown_used: bool = False) -> Path:
    """Record memory on GPU `gpu` kept alive by `holders`, listed by NVML under reported_pid (default: first holder).

    linger_ms: memory stays used that long after the last holder exits (slow driver release).
    leak: memory stays used with no holder at all, until the allocation file is removed.
    unknown_used: NVML lists the process's memory as NVML_VALUE_NOT_AVAILABLE (2**64 - 1), as broken drivers do.
    """
    with _CapacityLock(root):
        used, total = used_mib(root, gpu)
        if total and used + mib > total:
            raise OutOfMemory(f"CUDA out of memory: tried to allocate {mib} MiB on GPU {gpu}, which has {total} MiB in all "
                              f"and {max(total - used, 0)} MiB free")
        return _write_allocation(root, gpu, mib, holders, reported_pid, kind, linger_ms, leak, unknown_used)


def _write_allocation(root, gpu, mib, holders, reported_pid, kind, linger_ms, leak, unknown_used) -> Path:
    reported = reported_pid if reported_pid is not None else (holders[0] if holders else 0)
    holder_words = " ".join(f"holder={pid}:{process_start_time(pid)}" for pid in holders)
    holder_words += f" linger_ms={linger_ms}" if linger_ms else ""
    holder_words += " leak=1" if leak else ""
    holder_words += " unknown_used=1" if unknown_used else ""
    name = f"{os.getpid()}-{next(_serial)}"
    path = Path(root) / "alloc" / name
    partial = path.with_name(f".{name}.partial")  # dot files are ignored by the library
    partial.write_text(f"gpu={gpu} mib={mib} pid={reported} kind={kind} {holder_words}\n", encoding="ascii")
    partial.chmod(0o644)  # every process reads every allocation, as the driver sees every context (engines run with UMask=0027)
    partial.rename(path)
    return path


def resize(path: Path, mib: int) -> None:
    """Change an allocation's memory in place (an engine that parks keeps its context and gives the rest back)."""
    path = Path(path)
    old = path.read_text(encoding="ascii").split()
    fields = dict(word.split("=", 1) for word in old if "=" in word)
    if mib > int(fields["mib"]):  # a wake takes its memory back: only what is free
        with _CapacityLock(path.parent.parent):
            used, total = used_mib(path.parent.parent, int(fields["gpu"]))
            if total and used - int(fields["mib"]) + mib > total:
                raise OutOfMemory(f"CUDA out of memory: tried to allocate {mib - int(fields['mib'])} MiB on GPU {fields['gpu']}, "
                                  f"which has {max(total - used, 0)} MiB free")
            return _rewrite(path, mib)
    return _rewrite(path, mib)


def _rewrite(path: Path, mib: int) -> None:
    words = [f"mib={mib}" if word.startswith("mib=") else word for word in path.read_text(encoding="ascii").split()]
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(" ".join(words) + "\n", encoding="ascii")
    partial.chmod(0o644)
    partial.rename(path)
