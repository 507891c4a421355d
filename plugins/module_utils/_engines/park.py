# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Parking an engine: its weights moved to host memory and its GPU memory given back while its process (and its CUDA
context) stays, so that switching back to it is a wake instead of a cold start.

What an engine can do (from the command its unit runs), the HTTP calls that park and wake it, whether the host and
the GPUs have room (numbers in every refusal). Pure. The node's record of the engine it keeps parked: _node.parked.
"""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._engines.demand import demand_fraction
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

MODES = ("off", "auto", "required")
MIB = 1 << 20

# (method, path, JSON body or None) of each engine's park and wake calls: vLLM's sleep mode (level 1 keeps the weights in
# host memory; level 2 drops them, which is no park), SGLang's memory saver (weights kept only with their CPU backup)
CALLS = {
    "vllm": {"park": ("POST", "/sleep?level=1", None), "wake": ("POST", "/wake_up", None)},
    "sglang": {"park": ("POST", "/release_memory_occupation", {}), "wake": ("POST", "/resume_memory_occupation", {})},
}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InvalidInput(f"switch_engine_park_previous: {mode!r} is not one of {', '.join(MODES)}")
    return mode


def why_not_parkable(engine: str, argv: list[str], version: str | None) -> str | None:
    """Why the engine running ``argv`` cannot be parked, or None when it can. Read from the command its unit runs: a
    setting added since it started only takes effect at its next start."""
    if engine == "vllm":
        if version and "cpu" in (version.partition("+")[2] or "").lower():
            return f"vLLM {version} is a CPU build: it has no sleep mode"
        if "--enable-sleep-mode" not in argv:
            return "vllm runs without --enable-sleep-mode (vllm_sleep_mode: true takes effect at its next start)"
        return None
    if engine == "sglang":
        missing = [flag for flag in ("--enable-memory-saver", "--enable-weights-cpu-backup") if flag not in argv]
        if missing:
            return (f"sglang runs without {' and '.join(missing)} (without the CPU backup its weights are discarded, not parked; "
                    "sglang_memory_saver: true takes effect at its next start)")
        return None
    return f"{engine} cannot be parked"


def host_room(available_bytes: int | None, weights_bytes: int | None, margin_mib: int) -> str | None:
    """Why the host cannot keep the parked weights (with the margin), or None when it can."""
    if available_bytes is None:
        return "the host's available memory could not be read"
    if weights_bytes is None:
        return "the parked engine's weights could not be sized (its model is not a local directory)"
    needed = weights_bytes + margin_mib * MIB
    if needed > available_bytes:
        return (f"host memory: {weights_bytes / 2**30:.1f} GiB of weights + {margin_mib} MiB margin > "
                f"{available_bytes / 2**30:.1f} GiB available")
    return None


def gpu_room(gpus: list[dict], leftover_mib: dict, fraction: float | None, target: str | None = None) -> list[str]:
    """Per GPU: the target's demand (its memory fraction of the GPU, else its engine's own default) plus what the parked
    engine keeps there, within the GPU. ``gpus``: [{index, total_mib}]; ``leftover_mib``: {index: MiB} (keys may be
    strings, as JSON has them)."""
    if not fraction and target is None:
        return []
    problems = []
    for gpu in gpus:
        left = int(leftover_mib.get(gpu["index"], leftover_mib.get(str(gpu["index"]), 0)) or 0)
        total = int(gpu.get("total_mib") or 0)
        share = fraction or (demand_fraction(target, None, total)[0] if total else 0)
        if left and total and share * total + left > total:
            problems.append(f"GPU {gpu['index']}: the target's {share:g} x {total} MiB + {left} MiB kept by the parked engine > {total} MiB")
    return problems


def room_by_history(history: dict, engine: str, fraction: float | None, target: str | None = None) -> str | None:
    """Why the target would not fit beside ``engine`` parked, from what its last park on this node left, or None."""
    last = history.get(engine) or {}
    problems = gpu_room(last.get("gpus") or [], last.get("leftover_mib") or {}, fraction, target)
    if problems:
        return f"{'; '.join(problems)} (what {engine}'s last park on this node left)"
    return None
