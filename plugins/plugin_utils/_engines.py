# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""An engine's facts from its role's variables: the one place the vllm and sglang roles, and the switch, learn them.

The roles hand over their variables in one engine-neutral shape (``roles/<engine>/vars/main.yml``); this module
validates them, naming the role variable at fault, renders the command line in each engine's own spelling (vLLM
0.33.0 ``vllm serve MODEL ...`` with the model first, since --api-key and --served-model-name take nargs='+';
SGLang 0.5.23 ``--model-path ...``), and derives the rest: URL, secrets file, stop timeout, unit lines.

The API key is never part of the argv as written: vLLM reads VLLM_API_KEY, SGLang gets ``${SGLANG_API_KEY}``, which
systemd expands from the secrets file.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re

from ansible_collections.gpufleet.serving.plugins.module_utils._models.staging import GGUF_MODEL_FILE, hub_quant
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import exec_start_argv
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _systemd_escape

ENGINES = ("vllm", "sglang")
SECRETS_DIR = "/etc/gpufleet"
SECRET_VARIABLE = {"vllm": "VLLM_API_KEY", "sglang": "SGLANG_API_KEY"}
SGLANG_API_KEY_REFERENCE = "${SGLANG_API_KEY}"
# systemd SIGKILLs the control group this long after the engine's own drain time.
STOP_MARGIN_SECONDS = 30
# Where a role variable is not <engine>_<key>.
VARIABLE_NAMES = {
    "vllm": {"memory_fraction": "vllm_gpu_memory_utilization", "max_running_requests": "vllm_max_num_seqs", "parkable": "vllm_sleep_mode",
             "park_pin_threads": "vllm_sleep_pin_threads"},
    "sglang": {"memory_fraction": "sglang_mem_fraction_static", "max_model_len": "sglang_context_length", "parkable": "sglang_memory_saver"},
}
SPECULATIVE_KEYS = ("draft_model", "num_speculative_tokens", "eagle_topk", "num_draft_tokens", "method")
SPECULATIVE_DEFAULTS = {"num_speculative_tokens": 3, "eagle_topk": 1}
UNSPECIFIED_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}

# The sandbox every engine unit gets (docs/security.md). A role's *_sandbox loosens it: a directive set to "" or null
# is left out, any other value replaces the default. Never PrivateDevices=yes: it hides /dev/nvidia*. Never
# MemoryDenyWriteExecute=yes: PyTorch, Triton and CUDA generate code at run time.
SANDBOX_DEFAULTS = {
    "NoNewPrivileges": "yes",
    "PrivateTmp": "yes",
    "ProtectSystem": "strict",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "ProtectProc": "invisible",
    "RestrictSUIDSGID": "yes",
    "RestrictRealtime": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    # NCCL and the engines' HTTP servers use IP and Unix sockets; RDMA (InfiniBand, RoCE) needs netlink
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    # an engine needs no capability: the GPU device files are opened by mode, like any file
    "CapabilityBoundingSet": "",
    "UMask": "0027",
}
FORBIDDEN_SANDBOX = {
    "PrivateDevices": "it hides /dev/nvidia* from the engine",
    "MemoryDenyWriteExecute": "PyTorch, Triton and CUDA write and run code at run time",
    "DevicePolicy": "the engine needs the NVIDIA (and RDMA) device files",
}
PROTECT_HOME = ("read-only", "yes", "tmpfs", "no")
DIRECTIVE_NAME = re.compile(r"^[A-Z][A-Za-z]+$")


class EngineArgsError(ValueError):
    pass


# configuration keys whose values a message never shows
SECRET_KEYS = ("api_key",)


def variable(engine: str, key: str) -> str:
    """The role variable a configuration key comes from, for messages."""
    return VARIABLE_NAMES.get(engine, {}).get(key, f"{engine}_{key}")


class _Reader:
    """Typed reads of one engine's configuration; every refusal names the role variable."""

    def __init__(self, config: dict, engine: str):
        self.config = config
        self.engine = engine

    def fail(self, key: str, message: str):
        raise EngineArgsError(f"{variable(self.engine, key)}: {message}")

    def text(self, key: str, required: bool = False) -> str:
        value = self.config.get(key)
        if value is None or value == "":
            if required:
                self.fail(key, "is required")
            return ""
        if isinstance(value, (dict, list, bool)):
            shown = "" if key in SECRET_KEYS else f" {value!r}"  # a secret is named, never shown
            self.fail(key, f"give a string, got {type(value).__name__}{shown}")
        return str(value)

    def number(self, key: str, kind=int, minimum=None, source: dict | None = None, name: str | None = None):
        value = (self.config if source is None else source).get(key)
        label = name or variable(self.engine, key)
        if value is None or value == "":
            return None
        if isinstance(value, bool):
            raise EngineArgsError(f"{label}: give a {'whole number' if kind is int else 'number'}, got {value!r}")
        try:
            number = kind(value)
            if kind is int and float(value) != number:
                raise ValueError
        except (TypeError, ValueError):
            raise EngineArgsError(f"{label}: {value!r} is not a {'whole number' if kind is int else 'number'}") from None
        if minimum is not None and number < minimum:
            raise EngineArgsError(f"{label}: must be at least {minimum}, got {value!r}")
        return number

    def mapping(self, key: str) -> dict:
        value = self.config.get(key) or {}
        if not isinstance(value, dict):
            self.fail(key, f"give a mapping, got {type(value).__name__} {value!r}")
        return value


def _port(read: _Reader) -> int:
    port = read.number("port")
    if port is None or not 1 <= port <= 65535:
        read.fail("port", f"give a port from 1 to 65535, got {read.config.get('port')!r}")
    return port


def _common(read: _Reader) -> dict:
    fraction = read.number("memory_fraction", float)
    if fraction is not None and not 0 < fraction <= 1:
        read.fail("memory_fraction", f"must be in (0, 1], got {fraction}")
    extra = read.config.get("extra_args") or []
    if isinstance(extra, str) or not isinstance(extra, list) or not all(isinstance(arg, (str, int, float)) for arg in extra):
        read.fail("extra_args", f"give a list of separate arguments, e.g. ['--seed', '7'], got {extra!r}")
    for arg in extra:
        if str(arg).startswith("-") and len(str(arg).split()) > 1 and "=" not in str(arg).split()[0]:
            read.fail("extra_args", f"{arg!r} is one argument holding a space; give the option and its value as two items, "
                                    f"e.g. {str(arg).split(None, 1)!r}")
    port = _port(read)
    model = model_name(read)
    model_dir = staged_model_dir(read)
    return {
        # a hub model staged on the node is read from its directory (one quant: its one GGUF file), still served under its
        # hub name
        "model": staged_model_path(model, model_dir) or model, "served": read.text("served_model_name") or (model if model_dir else ""),
        "host": read.text("host") or "127.0.0.1",
        "port": port, "tp": read.number("tensor_parallel_size", minimum=1), "dp": read.number("data_parallel_size", minimum=1),
        "fraction": fraction, "max_len": read.number("max_model_len", minimum=1),
        "max_running": read.number("max_running_requests", minimum=1), "extra": [str(arg) for arg in extra],
        "quantization": read.text("quantization"), "kv_cache_dtype": read.text("kv_cache_dtype"),
    }


def tokenizer_path(read: _Reader) -> str:
    """What --tokenizer is given: where a hub tokenizer was staged, else the tokenizer as given (a hub name or a path)."""
    tokenizer = read.text("tokenizer")
    if tokenizer.startswith("/"):
        if not tokenizer.isprintable():
            read.fail("tokenizer", f"{tokenizer!r} holds a line break or control character: not a path a unit can name")
    elif tokenizer and (any(character.isspace() for character in tokenizer) or ":" in tokenizer):
        read.fail("tokenizer", f"{tokenizer!r} is not an absolute path or a hub repository (org/name)")
    return staged_model_dir(read, "tokenizer_dir") or tokenizer


def is_gguf(model: str) -> bool:
    return model.lower().endswith(".gguf") or hub_quant(model)[1] is not None


MODEL_FORMS = "an absolute path, a hub repository (org/name) or one quant of one (org/name:QUANT)"


def model_name(read: _Reader) -> str:
    """The model as given: a path, a hub name, or org/name:QUANT (vLLM's own form for one GGUF quant of a repository)."""
    model = read.text("model", required=True)
    if model.startswith("/"):
        # a path is a path: spaces and parentheses are quoted in the unit; a line break or a control character is not a name
        if not model.isprintable():
            read.fail("model", f"{model!r} holds a line break or control character: not a path a unit can name")
        return model
    if any(character.isspace() for character in model) or (":" in model and hub_quant(model)[1] is None):
        read.fail("model", f"{model!r} is not {MODEL_FORMS}")
    return model


def staged_model_path(model: str, model_dir: str) -> str:
    """What the engine is given for a staged model: its directory, or for one GGUF quant the file it was merged into."""
    if not model_dir:
        return ""
    return posixpath.join(model_dir, GGUF_MODEL_FILE) if hub_quant(model)[1] else model_dir


def staged_model_dir(read: _Reader, key: str = "model_dir") -> str:
    """Where the hub model (model_dir) or draft model (draft_model_dir) was staged on the node, or empty: the unit then
    reads it there, offline."""
    model_dir = read.text(key)
    if model_dir and not posixpath.isabs(model_dir):
        read.fail(key, f"give the absolute directory the hub model was staged into, got {model_dir!r}")
    return model_dir


def speculative(read: _Reader) -> dict | None:
    """One EAGLE-3 shape for both engines: draft_model, num_speculative_tokens (3), eagle_topk (1), num_draft_tokens.

    SGLang wants its three values together (steps, top-k, draft tokens); with top-k 1 the draft tokens are the
    steps plus one, with a wider tree they must be given. vLLM's EAGLE-3 has no tree: top-k and draft tokens are
    refused there rather than silently dropped.
    """
    spec = read.mapping("speculative")
    if not spec:
        return None
    name = variable(read.engine, "speculative")
    unknown = sorted(set(spec) - set(SPECULATIVE_KEYS))
    if unknown:
        raise EngineArgsError(f"{name}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(SPECULATIVE_KEYS)}")
    if not spec.get("draft_model"):
        raise EngineArgsError(f"{name}.draft_model: is required (the EAGLE-3 draft head's path or name)")
    method = str(spec.get("method", "eagle3")).lower()
    if method != "eagle3":
        raise EngineArgsError(f"{name}.method: only eagle3 is supported, got {method!r}")

    def number(key):
        found = read.number(key, minimum=1, source=spec, name=f"{name}.{key}")
        return SPECULATIVE_DEFAULTS.get(key) if found is None else found

    steps = number("num_speculative_tokens")
    # a hub draft model staged on the node is read from there, as the model is
    draft_path = staged_model_dir(read, "draft_model_dir") or str(spec["draft_model"])
    if read.engine == "vllm":
        for key in ("eagle_topk", "num_draft_tokens"):
            if spec.get(key) not in (None, ""):
                raise EngineArgsError(f"{name}.{key}: vLLM's EAGLE-3 drafts a chain, not a tree; this key is for SGLang only")
        return {"draft_model": str(spec["draft_model"]), "draft_model_path": draft_path, "num_speculative_tokens": steps}
    topk = number("eagle_topk")
    draft_tokens = number("num_draft_tokens")
    if draft_tokens is None:
        if topk != 1:
            raise EngineArgsError(f"{name}.num_draft_tokens: is required when eagle_topk is above 1 (SGLang's own choice for "
                                  "Llama is 5 steps, top-k 4, 8 draft tokens)")
        draft_tokens = steps + 1
    if topk == 1 and draft_tokens != steps + 1:
        raise EngineArgsError(f"{name}.num_draft_tokens: with eagle_topk 1 it must be num_speculative_tokens + 1 = {steps + 1}, "
                              f"got {draft_tokens}")
    if not 2 <= draft_tokens <= topk * steps + 1:
        raise EngineArgsError(f"{name}.num_draft_tokens: must be between 2 and eagle_topk x num_speculative_tokens + 1 = "
                              f"{topk * steps + 1}, got {draft_tokens}")
    return {"draft_model": str(spec["draft_model"]), "draft_model_path": draft_path, "num_speculative_tokens": steps, "eagle_topk": topk,
            "num_draft_tokens": draft_tokens}


def _options(argv: list[str], pairs) -> None:
    for flag, value in pairs:
        if value is not None and value != "":
            argv += [flag, str(value)]


def vllm_argv(config: dict) -> list[str]:
    """Arguments after `vllm serve` (the model comes first)."""
    read = _Reader(config, "vllm")
    common = _common(read)
    argv = [common["model"]]
    _options(argv, [("--served-model-name", common["served"]), ("--host", common["host"]), ("--port", common["port"]),
                    ("--tensor-parallel-size", common["tp"]), ("--data-parallel-size", common["dp"]),
                    ("--max-model-len", common["max_len"]), ("--gpu-memory-utilization", common["fraction"]),
                    ("--max-num-seqs", common["max_running"]), ("--quantization", common["quantization"]),
                    ("--kv-cache-dtype", common["kv_cache_dtype"]),
                    ("--shutdown-timeout", read.number("shutdown_timeout", minimum=0))])
    expert = config.get("expert_parallel")
    if expert not in (None, "", False, True):
        read.fail("expert_parallel", f"vLLM takes true or false, got {expert!r}")
    if expert:
        argv.append("--enable-expert-parallel")
    if parkable(read):
        argv.append("--enable-sleep-mode")  # parks through POST /sleep (its routes need VLLM_SERVER_DEV_MODE=1)
    tokenizer = tokenizer_path(read)
    if tokenizer:
        # the base model's tokenizer (vLLM's GGUF docs), and for a GGUF its config from the same place
        argv += ["--tokenizer", tokenizer] + (["--hf-config-path", tokenizer] if is_gguf(common["model"]) else [])
    spec = speculative(read)
    if spec:
        argv += ["--speculative-config", json.dumps({"method": "eagle3", "model": spec["draft_model_path"],
                                                     "num_speculative_tokens": spec["num_speculative_tokens"]}, separators=(",", ":"))]
    return argv + common["extra"]


def sglang_argv(config: dict) -> list[str]:
    """Arguments after `python -m sglang.launch_server` (or `sglang serve`)."""
    read = _Reader(config, "sglang")
    common = _common(read)
    if ":" in common["served"]:
        read.fail("served_model_name", f"SGLang reads 'name:adapter' as a LoRA adapter, so ':' is not allowed, got {common['served']!r}")
    expert = config.get("expert_parallel")
    if expert is True:
        ep_size = common["tp"]
    elif expert is None or expert is False or expert == "":
        ep_size = None
    else:
        ep_size = read.number("expert_parallel", minimum=1)
    argv = ["--model-path", common["model"]]
    _options(argv, [("--served-model-name", common["served"]), ("--host", common["host"]), ("--port", common["port"])])
    argv.append("--enable-metrics")  # the drain reads SGLang's running requests from its metrics
    _options(argv, [("--tp-size", common["tp"]), ("--dp-size", common["dp"]), ("--context-length", common["max_len"]),
                    ("--mem-fraction-static", common["fraction"]), ("--max-running-requests", common["max_running"]),
                    ("--quantization", common["quantization"]), ("--kv-cache-dtype", common["kv_cache_dtype"]),
                    ("--ep-size", ep_size)])
    if config.get("api_key"):
        argv += ["--api-key", SGLANG_API_KEY_REFERENCE]
    if parkable(read):
        # parks through /release_memory_occupation; without the CPU backup its weights would be discarded
        argv += ["--enable-memory-saver", "--enable-weights-cpu-backup"]
    spec = speculative(read)
    if spec:
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", spec["draft_model_path"],
                 "--speculative-num-steps", str(spec["num_speculative_tokens"]),
                 "--speculative-eagle-topk", str(spec["eagle_topk"]),
                 "--speculative-num-draft-tokens", str(spec["num_draft_tokens"])]
    return argv + common["extra"]


PARK_VARIABLES = {"vllm": "vllm_sleep_mode", "sglang": "sglang_memory_saver"}


def parkable(read: _Reader) -> bool:
    """Whether the engine is started so that it can be parked (switch_engine_park_previous). Its park and wake routes
    must not widen what is reachable: vLLM's --api-key guards only /v1, so vLLM parks only bound to loopback; SGLang's
    key guards every route but health and metrics, so SGLang parks bound to loopback or with its key."""
    value = read.config.get("parkable")
    if value in (None, "", False, "false", "False"):
        return False
    if value not in (True, "true", "True"):
        read.fail("parkable", f"give true or false, got {value!r}")
    host = read.text("host") or "127.0.0.1"
    if read.engine == "vllm" and not is_loopback(host):
        read.fail("parkable", f"vLLM's sleep routes are not guarded by its API key and vllm_host {host} is not a loopback "
                              "address: bind it to 127.0.0.1 (a balancer on the node reaches it there) or leave vllm_sleep_mode false")
    if read.engine == "sglang" and not is_loopback(host) and not read.config.get("api_key"):
        read.fail("parkable", f"sglang_host {host} is not a loopback address and sglang_api_key is empty: its "
                              "memory routes would be open to anyone who reaches the port")
    return True


# PyTorch's pinned-memory settings; its checks: a power of two, at most 128
PIN_THREADS_MAX = 128


def park_environment(read: _Reader) -> list[tuple[str, str]]:
    """vLLM's sleep routes need its development mode; and its sleep pins its host copy of the weights at park time,
    inside the forward switch's downtime: registering ordinary pages in threads pins 32 GiB 4-10x faster than
    cudaHostAlloc (docs/switch.md). The operator's own PYTORCH_CUDA_ALLOC_CONF, written after this, replaces it."""
    if not parkable(read):
        return []
    threads = read.number("park_pin_threads", minimum=0)
    if threads and (threads > PIN_THREADS_MAX or threads & (threads - 1)):
        read.fail("park_pin_threads", f"PyTorch takes a power of two up to {PIN_THREADS_MAX} (or 0 for its default pinning), got {threads}")
    pinning = [("PYTORCH_CUDA_ALLOC_CONF", f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}")] if threads else []
    return [("VLLM_SERVER_DEV_MODE", "1"), *pinning]


def engine_argv(config: dict, engine: str) -> list[str]:
    if engine not in ENGINES:
        raise EngineArgsError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    return vllm_argv(config) if engine == "vllm" else sglang_argv(config)


def launcher(config: dict, engine: str) -> list[str]:
    """The words before the engine's arguments: an existing install, or the role's pinned virtualenv."""
    read = _Reader(config, engine)
    install = bool(config.get("install"))
    if engine == "vllm":
        executable = read.text("virtualenv", required=True) + "/bin/vllm" if install else read.text("executable", required=True)
        command = [executable, "serve"]
    else:
        python = read.text("virtualenv", required=True) + "/bin/python" if install else read.text("python", required=True)
        entry_point = read.text("entry_point") or "launch_server"
        if entry_point not in ("launch_server", "serve"):
            read.fail("entry_point", f"launch_server or serve, got {entry_point!r}")
        command = [python, "-m", "sglang.launch_server"] if entry_point == "launch_server" else [posixpath.dirname(python) + "/sglang", "serve"]
    if not posixpath.isabs(command[0]):
        read.fail("virtualenv" if install else ("executable" if engine == "vllm" else "python"),
                  f"give an absolute path (systemd runs it without a shell), got {command[0]!r}")
    return command


def version_argv(config: dict, engine: str) -> list[str]:
    """The command that prints the installed engine's version on its last line (the preflight's executable check)."""
    read = _Reader(config, engine)
    install = bool(config.get("install"))
    if engine == "vllm":
        return [launcher(config, engine)[0], "--version"]
    python = read.text("virtualenv", required=True) + "/bin/python" if install else read.text("python", required=True)
    return [python, "-c", "import sglang; print(sglang.__version__)"]


def probe_url(host: str, port: int) -> str:
    """Where the node reaches the engine: the address it binds, or loopback when it binds every address."""
    address = UNSPECIFIED_HOSTS.get(host, host)
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"


def _escaped(read: _Reader, key: str, escape, items) -> list[str]:
    """escape(*item) for each item; a value systemd cannot carry is refused naming the role variable."""
    try:
        return [escape(*item) for item in items]
    except _systemd_escape.SystemdEscapeError as error:
        read.fail(key, str(error))


def _owner(read: _Reader) -> tuple[str, str]:
    """The engine's unit and the user it runs as, checked."""
    unit = read.text("unit", required=True)
    if not unit.endswith(".service") or "/" in unit or len(unit) <= len(".service"):
        read.fail("unit", f"give a service unit name such as {read.engine}.service, got {unit!r}")
    return unit, read.text("user", required=True)


def engine_owner(config: dict, engine: str) -> dict:
    """What a cleanup needs of an engine - its unit and its user - without rendering the rest of its facts (the same
    checks as engine_facts' for these two)."""
    if engine not in ENGINES:
        raise EngineArgsError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    unit, user = _owner(_Reader(config, engine))
    return {"engine": engine, "unit": unit, "user": user, "dedicated_user": user != "root"}


def engine_facts(config: dict, engine: str) -> dict:
    """Everything the role and the switch need to know of one engine, from its role's variables.

    Without a model (an engine this inventory does not configure) the facts still say where its unit, port and
    secrets are, so that the switch can find and stop it; ``configured`` is false and nothing is rendered.
    """
    if engine not in ENGINES:
        raise EngineArgsError(f"engine: {engine!r} is not one of {', '.join(ENGINES)}")
    read = _Reader(config, engine)
    unit, user = _owner(read)
    port = _port(read)
    host = read.text("host") or "127.0.0.1"
    shutdown = read.number("shutdown_timeout", minimum=0)
    if shutdown is None:
        read.fail("shutdown_timeout", "is required")
    ready_timeout = read.number("ready_timeout", minimum=1)
    if ready_timeout is None:
        read.fail("ready_timeout", "is required")
    api_key = config.get("api_key") or ""
    if not isinstance(api_key, str):
        read.fail("api_key", f"give a string, got a {type(api_key).__name__}")  # never echo a key
    if read.text("model") and not api_key and not is_loopback(host) and not _flag(config.get("allow_unauthenticated")):
        read.fail("host", f"{host} is not a loopback address and {variable(engine, 'api_key')} is empty: anyone who reaches "
                          f"the port could use the engine. Set {variable(engine, 'api_key')}, bind to 127.0.0.1, or set "
                          f"{variable(engine, 'allow_unauthenticated')}: true if something in front of it authenticates")
    stem = unit[: -len(".service")]
    facts = {
        "engine": engine,
        "configured": bool(read.text("model")),
        "unit": unit,
        "user": user,
        "dedicated_user": user != "root",
        # systemd creates both, owned by the user; HOME and XDG_CACHE_HOME point there (model downloads, compile caches)
        "state_directory": f"/var/lib/{stem}",
        "cache_directory": f"/var/cache/{stem}",
        "sandbox_lines": sandbox_lines(read, stem),
        "host": host,
        "port": port,
        "url": probe_url(host, port),
        "model": read.text("model") or None,
        "model_revision": read.text("model_revision") or "main",
        # where the weights are on the node: the staged directory of a hub model, else the model as given
        "model_dir": staged_model_dir(read) or None,
        "model_path": staged_model_path(read.text("model"), staged_model_dir(read)) or read.text("model") or None,
        # one GGUF quant of a hub repository (org/name:QUANT): staged alone, and merged into one file when split
        "model_quant": hub_quant(read.text("model"))[1],
        # what the preflight checks where the switch stages it: the directory, or one quant's model.gguf
        "model_staged_path": staged_model_path(read.text("model"), staged_model_dir(read)) or None,
        # a GGUF model needs the gguf package in the engine's environment (vLLM's loader imports it)
        "gguf": engine == "vllm" and is_gguf(staged_model_path(read.text("model"), staged_model_dir(read)) or read.text("model")),
        # the interpreter the engine runs in, where the role knows it (a pinned install's virtualenv, SGLang's python)
        "python": (read.text("virtualenv") + "/bin/python" if bool(config.get("install")) else (read.text("python") or None) if engine == "sglang" else None),
        "tokenizer": read.text("tokenizer") or None,
        "tokenizer_dir": staged_model_dir(read, "tokenizer_dir") or None,
        "served_model_name": read.text("served_model_name") or read.text("model") or None,
        "secrets_path": f"{SECRETS_DIR}/{unit[: -len('.service')]}.secrets",
        "api_key_set": bool(api_key),
        "restart": read.text("restart", required=True),
        "description": _systemd_escape.description(f"{engine} inference engine ({read.text('served_model_name') or read.text('model')})"),
        "shutdown_timeout": shutdown,
        "timeout_stop_sec": shutdown + STOP_MARGIN_SECONDS,
        "ready_timeout": ready_timeout,
    }
    if not facts["configured"]:
        return facts
    argv = launcher(config, engine) + engine_argv(config, engine)
    # the one word systemd must expand: SGLang's key, right after the first --api-key (the role's own, before extra_args)
    expand = frozenset([argv.index("--api-key") + 1]) if engine == "sglang" and api_key else frozenset()
    environment = read.mapping("environment")
    spec = speculative(read)
    install = bool(config.get("install"))
    facts.update({
        "executable": argv[0],
        "argv": argv,
        "exec_start": _escaped(read, "extra_args", lambda words: _systemd_escape.exec_line(words, expand), [[argv]])[0],
        "environment": {str(name): str(value) for name, value in environment.items()},
        # HOME and XDG_CACHE_HOME first: the user's own environment, written after them, may override them
        # and a staged model's engine never reaches for the hub: nothing is downloaded inside the downtime
        "environment_lines": _escaped(read, "environment", _systemd_escape.environment_assignment,
                                      [("HOME", f"/var/lib/{stem}"), ("XDG_CACHE_HOME", f"/var/cache/{stem}")]
                                      + (park_environment(read) if engine == "vllm" else [])
                                      + ([("HF_HUB_OFFLINE", "1")] if staged_model_dir(read) or (spec and staged_model_dir(read, "draft_model_dir"))
                                         or staged_model_dir(read, "tokenizer_dir") else [])
                                      + sorted(environment.items())),
        "speculative": spec,
        # what the preflight checks before the node is disrupted
        "draft_model": spec["draft_model"] if spec else None,
        "draft_model_dir": (staged_model_dir(read, "draft_model_dir") or None) if spec else None,
        "draft_model_path": spec["draft_model_path"] if spec else None,
        "gpus_needed": (read.number("tensor_parallel_size", minimum=1) or 1) * (read.number("data_parallel_size", minimum=1) or 1),
        "visible_devices": str(environment["CUDA_VISIBLE_DEVICES"]) if "CUDA_VISIBLE_DEVICES" in environment else None,
        # the share of each GPU it takes, for the fit beside other users' GPU processes (None: the engine's default)
        "memory_fraction": read.number("memory_fraction", float),
        "install": install,
        "parkable": parkable(read),
        "install_dir": read.text("virtualenv") if install else None,
        **_virtualenvs(read, install),
        "version": (read.text("version") or None) if install else None,  # pinned only by an install
        "version_argv": version_argv(config, engine),
    })
    return facts


def _virtualenvs(read: _Reader, install: bool) -> dict:
    """Where the pinned versions' virtualenvs sit side by side, and how many a verified engine keeps (older: pruned).

    Pruning needs the virtualenv directly under the root (the default <root>/<version>); elsewhere nothing is pruned.
    """
    if not install:
        return {"virtualenvs_root": None, "virtualenvs_keep": None}
    root = read.text("virtualenvs_root")
    if root and (not posixpath.isabs(root) or posixpath.normpath(root) == "/"):
        read.fail("virtualenvs_root", f"give an absolute directory other than /, got {root!r}")
    keep = read.number("virtualenvs_keep", minimum=1)
    directory = posixpath.normpath(read.text("virtualenv"))
    side_by_side = bool(root) and posixpath.dirname(directory) == posixpath.normpath(root)
    return {"virtualenvs_root": posixpath.normpath(root) if side_by_side else None, "virtualenvs_keep": keep or 2}


def unauthenticated_binds(settings_by_host: dict) -> list[str]:
    """For every host and engine it configures: a refusal when the engine would listen beyond loopback without a key.

    ``settings_by_host``: {host: {engine: {model, host, api_key, allow_unauthenticated}}} from the inventory, so that
    a playbook can refuse before it touches any node.
    """
    refusals = []
    for name, engines in sorted(settings_by_host.items()):
        for engine in ENGINES:
            settings = engines.get(engine) or {}
            bind = str(settings.get("host") or "127.0.0.1")
            if settings.get("model") and not settings.get("api_key") and not is_loopback(bind) and not _flag(settings.get("allow_unauthenticated")):
                refusals.append(f"{name}: {engine}_host is {bind}, not loopback, and {engine}_api_key is empty (set the key, bind to "
                                f"127.0.0.1, or set {engine}_allow_unauthenticated: true when something in front authenticates)")
    return refusals


def is_loopback(host: str) -> bool:
    """Only a loopback address keeps an engine off the network (a wildcard or a name may reach anyone)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def sandbox_lines(read: _Reader, stem: str) -> list[str]:
    """The unit's sandbox directives: the defaults, ProtectHome, the writable paths, and the role's loosening."""
    protect_home = read.text("protect_home") or "read-only"
    if protect_home not in PROTECT_HOME:
        read.fail("protect_home", f"give one of {', '.join(PROTECT_HOME)}, got {protect_home!r}")
    directives = dict(SANDBOX_DEFAULTS, ProtectHome=protect_home)
    for name, value in read.mapping("sandbox").items():
        if not isinstance(name, str) or not DIRECTIVE_NAME.match(name):
            read.fail("sandbox", f"{name!r} is not a systemd directive name")
        if name in FORBIDDEN_SANDBOX and value not in (None, "", False, "no"):
            read.fail("sandbox", f"{name}= is refused: {FORBIDDEN_SANDBOX[name]}")
        if value is None or value == "":
            directives.pop(name, None)
            continue
        text = ("yes" if value else "no") if isinstance(value, bool) else str(value)
        if "\n" in text or "\r" in text:
            read.fail("sandbox", f"{name}: one line, got {text!r}")
        directives[name] = text
    paths = config_list(read, "read_write_paths")
    for path in paths:
        if not path.startswith("/") or any(character.isspace() for character in path) or "\0" in path:
            read.fail("read_write_paths", f"give absolute paths without spaces, got {path!r}")
    lines = [f"{name}={value}" for name, value in directives.items()]
    lines += [f"StateDirectory={stem}", f"CacheDirectory={stem}"]
    if paths:
        lines.append("ReadWritePaths=" + " ".join(f"-{path}" for path in paths))
    return lines


def config_list(read: _Reader, key: str) -> list[str]:
    value = read.config.get(key) or []
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        read.fail(key, f"give a list of strings, got {value!r}")
    return list(value)


def engine_secrets(facts: dict, api_key: str) -> dict:
    """The facts with the API key and the secrets file's lines: kept apart so that only this step is never logged."""
    read = _Reader({}, facts["engine"])
    secrets = {SECRET_VARIABLE[facts["engine"]]: api_key} if api_key else {}
    return dict(facts, api_key=api_key or "", secrets_lines=_escaped(read, "api_key", _systemd_escape.environment_file_line, secrets.items()))


def unit_command(exec_start: str | None) -> list[str]:
    """The words of a unit's first ExecStart=, from `systemctl show` ({ path=... ; argv[]=WORDS ; ... }); [] if none."""
    return exec_start_argv(exec_start)


def command_model(engine: str, argv: list) -> str | None:
    """The model an engine's command line serves: `vllm serve MODEL`, SGLang's --model-path (or --model)."""
    words = [str(word) for word in argv or []]
    if engine == "vllm":
        return words[words.index("serve") + 1] if "serve" in words[:-1] else None
    for flag in ("--model-path", "--model"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return None
