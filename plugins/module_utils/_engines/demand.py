# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The share of each GPU an engine takes: its setting, else the pinned release's own default (cited below).

The preflight's fit beside other users' GPU processes and the park's room beside a parked engine both judge by it.
"""

from __future__ import annotations

# vLLM 0.33.0's default --gpu-memory-utilization (vllm/config/cache.py); vLLM refuses to start when less than that share
# of the GPU is free (vllm 50135: "Free memory on device ... less than desired GPU memory utilization").
VLLM_DEFAULT_FRACTION = 0.92
# SGLang without --mem-fraction-static derives it at start (python/sglang/srt/server_args.py,
# ServerArgs._handle_gpu_memory_settings): (total - reserved) / total, where reserved covers metadata (512 MiB), a
# prefill's activations (1.5 x max(chunked prefill, 2048)), CUDA graphs, parallelism and a drafter, and is at least
# 10 GiB on a GPU of more than 60 GiB; a multimodal model's adjustment only lowers it. The least it can reserve gives the
# most it can take: a bound, not a guess, and the check refuses only what even that share cannot be sure of.
SGLANG_LEAST_RESERVED_MIB = 512 + 2048 * 3 // 2 + 128
SGLANG_LEAST_RESERVED_LARGE_MIB = 10 * 1024
SGLANG_LARGE_GPU_MIB = 60 * 1024
DEMAND_BASIS = {"vllm": "vLLM's default --gpu-memory-utilization", "sglang": "at most, by SGLang's own derivation at start"}


def demand_fraction(engine: str, fraction: float | None, total_mib: int) -> tuple[float, str]:
    """The share of a GPU of total_mib an engine takes, and how it is known (its setting, or its own default)."""
    if fraction is not None:
        return fraction, "as configured"
    if engine == "vllm":
        return VLLM_DEFAULT_FRACTION, DEMAND_BASIS["vllm"]
    reserved = SGLANG_LEAST_RESERVED_LARGE_MIB if total_mib > SGLANG_LARGE_GPU_MIB else SGLANG_LEAST_RESERVED_MIB
    return round((total_mib - reserved) / total_mib, 3), DEMAND_BASIS["sglang"]
