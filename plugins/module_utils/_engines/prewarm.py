# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Reading a model's weight files into the page cache before the engine that loads them starts.

A cold load reads every weight byte from disk while the node serves nothing; read before the drain, the same bytes
come from memory. The plan is pure (``plan``): which files, how many bytes, and whether they fit in the memory
available minus a margin (reading more than fits would evict what was read first, and press on what serves now).
"""

from __future__ import annotations

import os
import posixpath
import time
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
BLOCK = 8 << 20
MIB = 1 << 20


@dataclass
class Plan:
    files: list = field(default_factory=list)  # (path, bytes)
    total: int = 0
    skipped: str | None = None


def weight_files(path: str) -> list:
    """(path, bytes) of the weight files of a model directory (or a .gguf file); a hub name has none here."""
    if not posixpath.isabs(path):
        return []
    if os.path.isfile(path):
        return [(path, os.path.getsize(path))] if path.endswith(WEIGHT_SUFFIXES) else []
    if not os.path.isdir(path):
        raise InvalidInput(f"{path} is not a model directory")
    return [(posixpath.join(path, name), os.path.getsize(posixpath.join(path, name)))
            for name in sorted(os.listdir(path)) if name.endswith(WEIGHT_SUFFIXES) and os.path.isfile(posixpath.join(path, name))]


def plan(files: list, available_bytes: int, margin_bytes: int) -> Plan:
    total = sum(size for _path, size in files)
    if not files:
        return Plan([], 0, "no local weight files (a hub name, or none found)")
    budget = available_bytes - margin_bytes
    if total > budget:
        return Plan(files, total, f"{total / 2**30:.1f} GiB of weights do not fit in the {available_bytes / 2**30:.1f} GiB available "
                                  f"minus the {margin_bytes / 2**30:.1f} GiB margin")
    return Plan(files, total)


def available_bytes(meminfo: str) -> int:
    """MemAvailable from /proc/meminfo."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise InvalidInput("/proc/meminfo has no MemAvailable")


def read_into_cache(files: list, timeout: float, clock=time.monotonic) -> tuple:
    """Read the files once, in order, until done or the time limit. Returns (bytes read, seconds, finished)."""
    started = clock()
    buffer = bytearray(BLOCK)
    done = 0
    for path, _size in files:
        with open(path, "rb", buffering=0) as source:
            while True:
                if clock() - started >= timeout:
                    return done, clock() - started, False
                count = source.readinto(buffer)
                if not count:
                    break
                done += count
    return done, clock() - started, True


def warm(paths: list, timeout: float, margin_mib: int, dry_run: bool = False) -> dict:
    """Plan and read: the prewarm's record (bytes, total_bytes, files, seconds, finished, skipped_reason). Raises
    InvalidInput or OSError when the files or the memory cannot be read; a plan that does not fit is skipped, not raised."""
    if timeout < 0 or margin_mib < 0:
        raise InvalidInput("timeout and margin_mib must be at least 0")
    files = [found for path in paths for found in weight_files(path)]
    with open("/proc/meminfo", encoding="utf-8") as meminfo:
        planned = plan(files, available_bytes(meminfo.read()), margin_mib * MIB)
    record = {"bytes": 0, "total_bytes": planned.total, "files": len(planned.files), "seconds": 0.0, "finished": False,
              "skipped_reason": planned.skipped}
    if planned.skipped or dry_run:
        record["skipped_reason"] = planned.skipped or "check mode: nothing read"
        return record
    done, seconds, finished = read_into_cache(planned.files, timeout)
    record.update(bytes=done, seconds=round(seconds, 3), finished=finished)
    return record
