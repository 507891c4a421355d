# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Engine command lines from role variables, and systemd's quoting of them.

One configuration shape for both engines; each engine's spelling follows its 0.33.0 / 0.5.23 parser
(`vllm serve MODEL` with the model first, since --api-key and --served-model-name take nargs='+').
The API key is never part of the argv: vLLM reads VLLM_API_KEY, SGLang gets ${SGLANG_API_KEY} from
its environment file.
"""

from __future__ import annotations

import json

ENGINES = ("vllm", "sglang")
SGLANG_API_KEY_REFERENCE = "${SGLANG_API_KEY}"


class EngineArgsError(ValueError):
    pass


def _number(config: dict, key: str, kind=int, minimum=None):
    value = config.get(key)
    if value is None or value == "":
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise EngineArgsError(f"{key}: {value!r} is not a {'whole number' if kind is int else 'number'}") from None
    if minimum is not None and number < minimum:
        raise EngineArgsError(f"{key}: must be at least {minimum}, got {value!r}")
    return number


def _common(config: dict) -> dict:
    if not config.get("model"):
        raise EngineArgsError("model: the model path or name is required")
    fraction = _number(config, "memory_fraction", float)
    if fraction is not None and not 0 < fraction <= 1:
        raise EngineArgsError(f"memory_fraction: must be in (0, 1], got {fraction}")
    extra = config.get("extra_args") or []
    if isinstance(extra, str) or not all(isinstance(arg, (str, int, float)) for arg in extra):
        raise EngineArgsError("extra_args: give a list of separate arguments, e.g. ['--seed', '7']")
    return {
        "tp": _number(config, "tensor_parallel_size", minimum=1), "dp": _number(config, "data_parallel_size", minimum=1),
        "port": _number(config, "port", minimum=1), "fraction": fraction, "max_len": _number(config, "max_model_len", minimum=1),
        "max_running": _number(config, "max_running_requests", minimum=1), "extra": [str(arg) for arg in extra],
    }


def _speculative(config: dict) -> dict | None:
    spec = config.get("speculative")
    if not spec:
        return None
    if not isinstance(spec, dict) or not spec.get("draft_model"):
        raise EngineArgsError("speculative: give at least draft_model (the EAGLE-3 draft head)")
    method = str(spec.get("method", "eagle3")).lower()
    if method != "eagle3":
        raise EngineArgsError(f"speculative.method: only eagle3 is supported, got {method!r}")
    return {
        "draft_model": str(spec["draft_model"]),
        "num_speculative_tokens": _number(spec, "num_speculative_tokens", minimum=1) or 3,
        "eagle_topk": _number(spec, "eagle_topk", minimum=1),
        "num_draft_tokens": _number(spec, "num_draft_tokens", minimum=1),
    }


def vllm_argv(config: dict) -> list[str]:
    """Arguments after `vllm serve` (the model comes first)."""
    common = _common(config)
    argv = [str(config["model"])]
    if config.get("served_model_name"):
        argv += ["--served-model-name", str(config["served_model_name"])]
    argv += ["--host", str(config.get("host") or "127.0.0.1"), "--port", str(common["port"] or 8000)]
    for flag, value in (("--tensor-parallel-size", common["tp"]), ("--data-parallel-size", common["dp"]),
                        ("--max-model-len", common["max_len"]), ("--gpu-memory-utilization", common["fraction"]),
                        ("--max-num-seqs", common["max_running"]), ("--quantization", config.get("quantization")),
                        ("--kv-cache-dtype", config.get("kv_cache_dtype")),
                        ("--shutdown-timeout", _number(config, "shutdown_timeout", minimum=0))):
        if value is not None and value != "":
            argv += [flag, str(value)]
    if config.get("expert_parallel"):
        argv.append("--enable-expert-parallel")
    spec = _speculative(config)
    if spec:
        argv += ["--speculative-config", json.dumps({"method": "eagle3", "model": spec["draft_model"],
                                                     "num_speculative_tokens": spec["num_speculative_tokens"]}, separators=(",", ":"))]
    return argv + common["extra"]


def sglang_argv(config: dict) -> list[str]:
    """Arguments after `python -m sglang.launch_server` (or `sglang serve`)."""
    common = _common(config)
    argv = ["--model-path", str(config["model"])]
    if config.get("served_model_name"):
        argv += ["--served-model-name", str(config["served_model_name"])]
    argv += ["--host", str(config.get("host") or "127.0.0.1"), "--port", str(common["port"] or 30000), "--enable-metrics"]
    ep = config.get("expert_parallel")
    for flag, value in (("--tp-size", common["tp"]), ("--dp-size", common["dp"]), ("--context-length", common["max_len"]),
                        ("--mem-fraction-static", common["fraction"]), ("--max-running-requests", common["max_running"]),
                        ("--quantization", config.get("quantization")), ("--kv-cache-dtype", config.get("kv_cache_dtype")),
                        ("--ep-size", common["tp"] if ep is True else (ep or None))):
        if value is not None and value != "":
            argv += [flag, str(value)]
    if config.get("api_key"):
        argv += ["--api-key", SGLANG_API_KEY_REFERENCE]  # systemd expands it from the environment file
    spec = _speculative(config)
    if spec:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", spec["draft_model"],
                 "--speculative-num-steps", str(spec["num_speculative_tokens"])]
        if spec["eagle_topk"]:
            argv += ["--speculative-eagle-topk", str(spec["eagle_topk"])]
        if spec["num_draft_tokens"]:
            argv += ["--speculative-num-draft-tokens", str(spec["num_draft_tokens"])]
    return argv + common["extra"]


def engine_argv(config: dict, engine: str) -> list[str]:
    if engine not in ENGINES:
        raise EngineArgsError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    return vllm_argv(config) if engine == "vllm" else sglang_argv(config)


def systemd_quote(argv: list[str]) -> str:
    """ExecStart= words: each double-quoted; `$` and `%` doubled so systemd neither expands nor substitutes them.

    A literal ${SGLANG_API_KEY} is left for systemd to expand from the unit's environment.
    """
    words = []
    for arg in argv:
        text = str(arg).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
        if arg != SGLANG_API_KEY_REFERENCE:
            text = text.replace("$", "$$")
        words.append(f'"{text}"')
    return " ".join(words)
