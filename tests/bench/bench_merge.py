"""A split GGUF's merge against a plain copy of the same bytes, side by side on the same disk (issue 52's goal: the
merge within 1.2x of the copy).

    python tests/bench/bench_merge.py [--gib 2] [--parts 4] [--rounds 3] [--dir DIR]

The parts are written once by llama.cpp's own GGUF library (the gguf package) with 64 MiB tensors. Each round, in
alternating order, times (a) model_stage's merge (merge_parts: the header rebuilt, each part's data copied in 16 MiB
blocks, fsync, the header read back and verified, rename) and (b) a copy of the parts' bytes into one file with the same
block size and fsync - both read the parts from the page cache after the first round, and both write the same amount.
Prints JSON: each round's seconds and MiB/s, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))  # linked by make setup

import gguf  # noqa: E402
import numpy as np  # noqa: E402

from ansible_collections.gpufleet.serving.plugins.module_utils._models.stage_node import merge_parts  # noqa: E402

TENSOR_MIB = 64


def write_parts(directory: Path, gib: float, parts: int) -> list[Path]:
    tensors = max(parts, int(gib * 1024 / TENSOR_MIB))
    writer = gguf.GGUFWriter(str(directory / "bench.gguf"), "llama", split_max_tensors=-(-tensors // parts))
    block = np.arange(TENSOR_MIB * (1 << 20) // 4, dtype=np.float32)
    for index in range(tensors):
        writer.add_tensor(f"blk.{index}.weight", block + index)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(directory.glob("bench-*-of-*.gguf"))


def copy(parts: list[Path], target: Path) -> None:
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as source:
                shutil.copyfileobj(source, out, 16 << 20)
        out.flush()
        os.fsync(out.fileno())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        work = Path(work)
        parts = write_parts(work, args.gib, args.parts)
        total = sum(part.stat().st_size for part in parts)
        rounds = []
        for round_number in range(args.rounds):
            timings = {}
            order = ("merge", "copy") if round_number % 2 == 0 else ("copy", "merge")
            for kind in order:
                target = work / f"{kind}.gguf"
                started = time.monotonic()
                if kind == "merge":
                    merge_parts([str(part) for part in parts], str(target), "", "bench")
                else:
                    copy(parts, target)
                timings[kind] = time.monotonic() - started
                target.unlink()
            rounds.append({kind: {"seconds": round(seconds, 3), "mib_s": round(total / seconds / (1 << 20), 1)} for kind, seconds in timings.items()})
        merge = statistics.median(r["merge"]["seconds"] for r in rounds)
        plain = statistics.median(r["copy"]["seconds"] for r in rounds)
        print(json.dumps({"bytes": total, "parts": len(parts), "rounds": rounds, "median_merge_s": round(merge, 3),
                          "median_copy_s": round(plain, 3), "merge_over_copy": round(merge / plain, 3)}, indent=1))


if __name__ == "__main__":
    main()
