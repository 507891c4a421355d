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

import hashlib
import itertools
import os
import shutil
import subprocess
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


def allocate(root: Path, gpu: int, mib: int, holders: list[int], reported_pid: int | None = None, kind: str = "compute",
             linger_ms: int = 0, leak: bool = False, unknown_used: bool = False) -> Path:
    """Record memory on GPU `gpu` kept alive by `holders`, listed by NVML under reported_pid (default: first holder).

    linger_ms: memory stays used that long after the last holder exits (slow driver release).
    leak: memory stays used with no holder at all, until the allocation file is removed.
    unknown_used: NVML lists the process's memory as NVML_VALUE_NOT_AVAILABLE (2**64 - 1), as broken drivers do.
    """
    reported = reported_pid if reported_pid is not None else (holders[0] if holders else 0)
    holder_words = " ".join(f"holder={pid}:{process_start_time(pid)}" for pid in holders)
    holder_words += f" linger_ms={linger_ms}" if linger_ms else ""
    holder_words += " leak=1" if leak else ""
    holder_words += " unknown_used=1" if unknown_used else ""
    name = f"{os.getpid()}-{next(_serial)}"
    path = Path(root) / "alloc" / name
    partial = path.with_name(f".{name}.partial")  # dot files are ignored by the library
    partial.write_text(f"gpu={gpu} mib={mib} pid={reported} kind={kind} {holder_words}\n", encoding="ascii")
    partial.rename(path)
    return path


def resize(path: Path, mib: int) -> None:
    """Change an allocation's memory in place (an engine that parks keeps its context and gives the rest back)."""
    path = Path(path)
    words = [f"mib={mib}" if word.startswith("mib=") else word for word in path.read_text(encoding="ascii").split()]
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(" ".join(words) + "\n", encoding="ascii")
    partial.rename(path)
