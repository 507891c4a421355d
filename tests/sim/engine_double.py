"""Test double of the vLLM 0.33.0 and SGLang 0.5.23 servers, for the simulated lab. It is not an inference engine.

    engine_double.py vllm MODEL [vllm serve options]       (installed as `vllm serve ...`)
    engine_double.py sglang --model-path MODEL [options]   (installed as `sglang serve ...`, `python -m sglang.launch_server ...`)

What it does like the real servers:
- parses its command line with the real parsers' options (tests/sim/engine_cli.py) and exits 2 on what they reject;
- starts one worker process per tensor-parallel rank; each holds /dev/nvidia<minor of its GPU>, /dev/nvidiactl and
  /dev/nvidia-uvm and records its memory in the simulated NVML, and exits when the server exits (vLLM's death pipe,
  SGLang's PDEATHSIG); refuses to start when its GPUs are not free, as vLLM does;
- reads every byte of its model's (and draft model's) weight files while "loading", as the engines load weights;
  a path that is not a directory is read as nothing (the lab's fixture units name models that do not exist);
- refuses connections while "loading", then serves /health, /v1/models, /v1/completions, /metrics (the real metric
  names, speculative-decoding counters), SGLang's /health_generate and /ready, with --api-key enforced as each engine
  does;
- parks and wakes as the engines' standby does: vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 serves
  POST /sleep?level=1, POST /wake_up, GET /is_sleeping; SGLang with --enable-memory-saver serves POST
  /release_memory_occupation and /resume_memory_occupation (weights kept only with --enable-weights-cpu-backup).
  Parked, each worker's simulated GPU memory drops to its context (park_leftover_mib) and the server keeps a copy of
  the weight files in its own memory (the host-memory backup); completions are refused until it wakes;
- on SIGTERM: vLLM rejects new requests (503) and drains up to --shutdown-timeout, SGLang still admits them and
  drains until no request runs (unbounded unless SGL_FORCE_SHUTDOWN), then stops its workers and exits 0.

Faults, from /etc/gpufleet-sim/faults.json ({"*": {...}, "vllm": {...}, "sglang": {...}}) or GPUFLEET_SIM_FAULTS (JSON):
  load_seconds (default 1)   time before the port listens
  load_until                 a path: loading goes on until it exists (at most 600 s more)
  request_seconds (0.05)     time each completion takes
  drain_seconds              keep running this long after SIGTERM before exiting
  ignore_sigterm             the server ignores SIGTERM
  escape_worker              the last worker leaves with setsid (double fork) and outlives the server
  scope_worker               the last worker runs in its own transient scope (systemd-run --scope), outside the unit
  release_delay_ms           GPU memory stays used this long after a worker exits
  leak_mib                   this much memory stays used on each GPU with no process, until the node is reset
  health_never_green         /health (and /health_generate, /ready) answer 503 forever
  spec_acceptance (0.7)      share of drafted tokens accepted (low values: the drafter slows things down)
  exit_on_start              exit 1 right after parsing, as on a bad model path
  crash_after_ready_seconds  the server SIGKILLs itself this long after its first good /health (an OOM on the first
                             batches); under Restart= systemd starts it again, and it crashes again: a restart loop
  ignore_busy_gpus           start even when another process uses the GPUs (two engines on one node after a reboot)
  version                    the version `vllm --version` prints (default: the real one this double mimics)
  park_seconds (0.2)         time a park takes; wake_seconds (0.3): time a wake takes
  park_leftover_mib (600)    GPU memory each parked worker keeps (its CUDA context)
  answers                    how completions answer: "garbage_after_wake" ('!' over and over once woken, as vLLM after a
                             level-2 wake; read again at each wake), "garbage" (from the start), "other_model" (another
                             model's tokens)
  logprob_drift              added to every logprob (a kernel's nondeterminism, larger than it should be)

Completions answer deterministically from the model served: each token is drawn from a small vocabulary by a hash of
the model's weight bytes (their first MiB, or a GGUF file's), the prompt and the position, with a logprob derived the
same way - so one model always answers one prompt the same, and another model otherwise.

    engine_double.py --version vllm|sglang                prints the version
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_cli  # noqa: E402
import nvml_sim  # noqa: E402
import signal_witness  # noqa: E402

FAULTS_FILE = Path("/etc/gpufleet-sim/faults.json")
# where each process records the signals it receives, and from whom (tests/sim/signal_witness.py); none off the lab
WITNESS_DIR = Path(os.environ.get("GPUFLEET_SIM_WITNESS") or "/run/gpufleet-sim/signals")
NVML_ROOT = Path(os.environ.get(nvml_sim.ROOT_ENV, "/run/gpufleet-sim/nvml"))
DEV = Path(os.environ.get("GPUFLEET_SIM_DEV", "/dev"))
PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
VERSIONS = {"vllm": "0.33.0", "sglang": "0.5.23"}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
READ_BLOCK = 8 << 20


def set_title(title: str) -> None:
    ctypes.CDLL(None).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def load_faults(engine: str) -> dict:
    faults: dict = {}
    sources = []
    if FAULTS_FILE.exists():
        sources.append(json.loads(FAULTS_FILE.read_text() or "{}"))
    if os.environ.get("GPUFLEET_SIM_FAULTS"):
        sources.append(json.loads(os.environ["GPUFLEET_SIM_FAULTS"]))
    for source in sources:
        faults.update(source.get("*", {}))
        faults.update(source.get(engine, {}))
    return faults


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def gguf_refusal(settings: Settings) -> str | None:
    """As vLLM refuses them: a GGUF model that is not one whole single-file GGUF (read with llama.cpp's own reader, the
    gguf package, never our parser), or a tokenizer directory without tokenizer files."""
    tokenizer = getattr(settings, "tokenizer", None)
    if tokenizer and Path(tokenizer).is_dir() and not any((Path(tokenizer) / name).exists() for name in TOKENIZER_FILES):
        return f"OSError: Can't load tokenizer for '{tokenizer}': no tokenizer files in the directory"
    if settings.engine != "vllm" or not str(settings.model).lower().endswith(".gguf"):
        return None
    try:
        import gguf
    except ImportError:
        return "ModuleNotFoundError: No module named 'gguf' (vLLM's GGUF loader imports it)"
    try:
        reader = gguf.GGUFReader(settings.model)
    except (OSError, ValueError, IndexError) as exc:
        return f"ValueError: {settings.model} is not a GGUF file vLLM can load: {exc}"
    count = reader.fields.get("split.count")
    if count is not None and int(count.parts[count.data[0]][0]) > 1:
        return (f"ValueError: {settings.model} is part of a split GGUF; vLLM only supports loading single-file GGUF models "
                "(merge them with gguf-split)")
    return None


def weight_files(paths: list[str]) -> list[Path]:
    return [weights for path in paths if Path(path).is_dir() for weights in sorted(Path(path).iterdir()) if weights.name.endswith(WEIGHT_SUFFIXES)]


def read_weights(paths: list[str]) -> tuple[int, float]:
    """Read every byte of the weight files under each model directory, as a load does. Returns (bytes, seconds)."""
    started, total = time.monotonic(), 0
    buffer = bytearray(READ_BLOCK)
    for path in paths:
        directory = Path(path)
        if not directory.is_dir():
            continue
        for weights in sorted(f for f in directory.iterdir() if f.name.endswith(WEIGHT_SUFFIXES)):
            with open(weights, "rb", buffering=0) as source:
                while count := source.readinto(buffer):
                    total += count
    return total, time.monotonic() - started


VOCABULARY = (" the", " Paris", " city", " of", " water", " boils", " at", " 100", " degrees", ",", ".", " and", " is", " a",
              " return", " n", " if", " fib", "(", ")", ":", "\n", " light", " river", " capital", " France", " on", " sea",
              " level", " Celsius", " known", " for")


def model_fingerprint(paths: list[str]) -> str:
    """A digest of what the model is: the first MiB of each weight file (a GGUF file's own), else its path."""
    digest = hashlib.sha256()
    found = False
    for path in paths:
        if not path:
            continue
        candidate = Path(path)
        files = [candidate] if candidate.is_file() else weight_files([path])
        for weights in files:
            with open(weights, "rb") as source:
                digest.update(source.read(1 << 20))
            found = True
        if not found:
            digest.update(path.encode())
    return digest.hexdigest()


def answer_tokens(fingerprint: str, prompt: str, count: int, drift: float = 0.0) -> tuple[list[str], list[float]]:
    """The double's greedy answer: tokens and their logprobs, a function of the model and the prompt only."""
    tokens, logprobs = [], []
    for position in range(count):
        value = int.from_bytes(hashlib.sha256(f"{fingerprint}|{prompt}|{position}".encode()).digest()[:8], "big")
        tokens.append(VOCABULARY[value % len(VOCABULARY)])
        logprobs.append(round(-((value >> 16) % 2000) / 1000.0 + drift, 6))
    return tokens, logprobs


def sglang_default_fraction(total_mib: int, tp: int, speculative: bool) -> float:
    """SGLang's --mem-fraction-static when none is given (ServerArgs._handle_gpu_memory_settings): the GPU's size less
    what it reserves for metadata, a prefill's activations and CUDA graphs, at least 10 GiB on a GPU over 60 GiB."""
    chunked, graphs = (8192, 256 if tp < 4 else 512) if total_mib >= 60 * 1024 else (4096, 32 if tp < 4 else 160)
    reserved = 512 + max(chunked, 2048) * 1.5 + graphs * 2 + tp / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    reserved += 2 * 1024 if speculative else 0
    return round((total_mib - reserved) / total_mib, 3)


class Settings:
    """What the double needs from the parsed command line, in one shape for both engines."""

    def __init__(self, engine: str, args):
        self.engine = engine
        if engine == "vllm":
            self.model = args.model_tag or args.model or "Qwen/Qwen3-0.6B"
            self.served = (args.served_model_name or [self.model])[0]
            self.host, self.port = args.host or "0.0.0.0", args.port or 8000
            self.tp, self.dp = args.tensor_parallel_size or 1, args.data_parallel_size or 1
            self.api_key = (args.api_key or [os.environ.get("VLLM_API_KEY")])[0]
            self.speculative = bool(args.speculative_config)
            self.draft_model = json.loads(args.speculative_config).get("model") if args.speculative_config else None
            self.memory_fraction = float(args.gpu_memory_utilization or 0.92)
            self.drain_timeout = float(args.shutdown_timeout or 0)
            self.metrics = True
            self.context = int(args.max_model_len) if args.max_model_len and str(args.max_model_len).isdigit() else 32768
            # the real vLLM runs at most this many sequences at once and counts the rest as waiting (seen on its CPU build)
            self.max_sequences = int(args.max_num_seqs) if args.max_num_seqs and str(args.max_num_seqs).isdigit() else None
            # the sleep endpoints exist only in the server's development mode
            self.can_park = bool(args.enable_sleep_mode) and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
            self.tokenizer = args.tokenizer
            self.keeps_weights = True
        else:
            self.model = args.model_path
            if not self.model:
                raise engine_cli.EngineCliError("the following arguments are required: --model-path")
            self.served = args.served_model_name or self.model
            self.host, self.port = args.host or "127.0.0.1", args.port or 30000
            self.tp, self.dp = args.tp_size or 1, args.dp_size or 1
            self.api_key = args.api_key
            self.speculative = bool(args.speculative_algorithm)
            self.draft_model = args.speculative_draft_model_path
            # None: derived per GPU at start, as SGLang does (sglang_default_fraction)
            self.memory_fraction = float(args.mem_fraction_static) if args.mem_fraction_static else None
            self.drain_timeout = None  # unbounded, as SGLang's sigterm_watchdog
            self.metrics = bool(args.enable_metrics)
            self.context = int(args.context_length) if args.context_length and str(args.context_length).isdigit() else 32768
            self.max_sequences = None
            self.can_park = bool(args.enable_memory_saver)
            self.keeps_weights = bool(args.enable_weights_cpu_backup)  # without it, released weights are discarded


class Server:
    def __init__(self, settings: Settings, faults: dict):
        self.settings = settings
        self.faults = faults
        self.running = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.crash_armed = threading.Event()
        self.warm = False
        self.workers: list[subprocess.Popen] = []
        self.allocations: list[tuple[Path, int]] = []  # each worker's simulated GPU memory: (its file, its MiB)
        self.parked = False
        self.backup: list[bytes] = []
        self.created = int(time.time())
        self.spec = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "steps": 3}
        self.woken = False  # woken from a park at least once (the answers fault "garbage_after_wake")
        answers_fault = faults.get("answers")
        self.fingerprint = model_fingerprint([settings.model] if answers_fault != "other_model" else [settings.model + "#another-model"])

    # --- GPUs and workers -------------------------------------------------------------------------------------------
    def gpu_indexes(self) -> list[int]:
        wanted = self.settings.tp * self.settings.dp
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        indexes = [int(i) for i in visible.split(",") if i.strip()] if visible else list(range(wanted))
        return indexes[:wanted] if len(indexes) >= wanted else []

    def start_workers(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        indexes = self.gpu_indexes()
        if not indexes or max(indexes) >= count:
            fail(f"need {self.settings.tp * self.settings.dp} GPU(s), {count} visible")
        for rank, index in enumerate(indexes):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            total_mib, used_mib = memory.total >> 20, memory.used >> 20
            fraction = self.settings.memory_fraction or sglang_default_fraction(total_mib, self.settings.tp, self.settings.speculative)
            if used_mib > total_mib * (1 - fraction) and not self.faults.get("ignore_busy_gpus"):
                fail(f"ValueError: Free memory on device cuda:{rank} ({(total_mib - used_mib) / 1024:.2f}/{total_mib / 1024:.2f} GiB) on "
                     f"startup is less than desired GPU memory utilization ({fraction}, "
                     f"{total_mib * fraction / 1024:.2f} GiB).")
            spec = {"engine": self.settings.engine, "rank": rank, "gpu": index, "minor": pynvml.nvmlDeviceGetMinorNumber(handle),
                    "mib": int(total_mib * fraction), "faults": self.faults,
                    "escape": rank == len(indexes) - 1 and bool(self.faults.get("escape_worker"))}
            scoped = rank == len(indexes) - 1 and bool(self.faults.get("scope_worker"))
            spec["survive"] = spec["escape"] or scoped  # nothing makes it exit with the server
            argv = [sys.executable, os.path.abspath(__file__), "__worker__", json.dumps(spec)]
            if scoped:
                argv = ["systemd-run", "--scope", "--quiet", f"--unit=gpufleet-fixture-scope-{os.getpid()}", *argv]
            worker = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            answer = worker.stdout.readline().split()
            if answer[:1] != ["ready"]:
                fail(f"worker {rank} did not start")
            self.allocations.append((Path(answer[1]), spec["mib"]))
            if not spec["survive"]:
                self.workers.append(worker)  # the server has lost track of a surviving worker
        pynvml.nvmlShutdown()

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.poll() is None:
                worker.terminate()
        deadline = time.monotonic() + 5
        for worker in self.workers:
            try:
                worker.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()

    # --- serving ------------------------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        if self.faults.get("health_never_green") or not self.warm:
            return False
        if self.faults.get("crash_after_ready_seconds") is not None and not self.crash_armed.is_set():
            self.crash_armed.set()
            threading.Timer(float(self.faults["crash_after_ready_seconds"]), os.kill, (os.getpid(), signal.SIGKILL)).start()
        return not (self.settings.engine == "sglang" and self.stopping.is_set())

    # --- standby: park and wake ----------------------------------------------------------------------------------------
    def park(self) -> None:
        """Weights to host memory (a copy the server keeps), the KV cache dropped, each worker down to its context."""
        if self.running:
            raise RuntimeError(f"{self.running} request(s) running")
        if not self.parked:
            if self.settings.keeps_weights:
                self.backup = [path.read_bytes() for path in weight_files([self.settings.model])]
            time.sleep(float(self.faults.get("park_seconds", 0.2)))
            for path, _mib in self.allocations:
                nvml_sim.resize(path, int(self.faults.get("park_leftover_mib", 600)))
            self.parked = True

    def wake(self) -> None:
        if self.parked:
            time.sleep(float(self.faults.get("wake_seconds", 0.3)))
            for path, mib in self.allocations:
                nvml_sim.resize(path, mib)
            self.backup = []
            self.parked = False
            self.woken = True
            # a fault set while it was parked applies from its wake (the answers it gives after one)
            self.faults["answers"] = load_faults(self.settings.engine).get("answers")

    def complete(self, body: dict) -> tuple[int, dict]:
        if self.parked:
            return 503, {"error": {"message": "The engine is sleeping", "type": "ServiceUnavailableError", "param": None, "code": 503}}
        if self.settings.engine == "vllm" and self.stopping.is_set():
            # vLLM's EngineCore rejects new requests once shutdown is requested (it drains only those it has)
            return 503, {"error": {"message": "The engine is shutting down; request aborted", "type": "ServiceUnavailableError",
                                   "param": None, "code": 503}}
        with self.lock:
            self.running += 1
        try:
            time.sleep(float(self.faults.get("request_seconds", 0.05)))
            tokens = int(body.get("max_tokens", 16))
            if self.settings.speculative:
                self.record_speculation(tokens)
        finally:
            with self.lock:
                self.running -= 1
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else json.dumps(body.get("prompt"))
        chosen, logprobs = answer_tokens(self.fingerprint, prompt, max(1, tokens), float(self.faults.get("logprob_drift", 0.0)))
        fault = self.faults.get("answers")
        if fault == "garbage" or (fault == "garbage_after_wake" and self.woken):
            chosen, logprobs = ["!"] * len(chosen), [-0.0001] * len(chosen)
        text = "".join(chosen)
        # OpenAI completions' logprobs, as both engines give them when asked (logprobs: N)
        wanted = body.get("logprobs")
        shown = ([f"token_id:{VOCABULARY.index(token) if token in VOCABULARY else 999}" for token in chosen]
                 if body.get("return_tokens_as_token_ids") and self.settings.engine == "vllm" else chosen)
        answer_logprobs = ({"tokens": shown, "token_logprobs": logprobs, "top_logprobs": [{t: lp} for t, lp in zip(shown, logprobs)],
                            "text_offset": [sum(len(t) for t in chosen[:i]) for i in range(len(chosen))]}
                           if wanted not in (None, False) else None)
        usage = {"prompt_tokens": 6, "total_tokens": 6 + tokens, "completion_tokens": tokens, "prompt_tokens_details": None}
        if self.settings.engine == "vllm":
            return 200, {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
                         "model": body.get("model") or self.settings.served,
                         "choices": [{"index": 0, "text": text, "logprobs": answer_logprobs, "finish_reason": "length", "stop_reason": None,
                                      "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None,
                                      "weight_versions": None}],
                         "service_tier": None, "system_fingerprint": f"vllm-0.33.0-tp{self.settings.tp}-1a2b3c4d",
                         "usage": dict(usage, completion_tokens_details=None), "kv_transfer_params": None,
                         "ec_transfer_params": None, "metrics": None}
        return 200, {"id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()), "model": body.get("model", "default"),
                     "choices": [{"index": 0, "text": text, "logprobs": answer_logprobs, "finish_reason": "length", "matched_stop": None}],
                     "usage": dict(usage, reasoning_tokens=0, completion_tokens_details=None), "metadata": {"weight_version": "default"}}

    def record_speculation(self, tokens: int) -> None:
        acceptance = float(self.faults.get("spec_acceptance", 0.7))
        with self.lock:
            self.spec["drafts"] += tokens
            self.spec["draft_tokens"] += tokens * self.spec["steps"]
            self.spec["accepted"] += round(tokens * self.spec["steps"] * acceptance)

    def models(self) -> dict:
        card = {"id": self.settings.served, "object": "model", "created": self.created, "owned_by": self.settings.engine,
                "root": self.settings.model if self.settings.engine == "vllm" else self.settings.served, "parent": None,
                "max_model_len": self.settings.context}
        if self.settings.engine == "vllm":
            card["permission"] = [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission", "created": self.created,
                                   "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                   "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                   "organization": "*", "group": None, "is_blocking": False}]
        return {"object": "list", "data": [card]}

    def metrics(self) -> str:
        name = self.settings.served
        spec = self.spec
        if self.settings.engine == "vllm":
            labels = f'{{model_name="{name}",engine="0"}}'
            running = min(self.running, self.settings.max_sequences or self.running)
            lines = [f"vllm:num_requests_running{labels} {running}", f"vllm:num_requests_waiting{labels} {self.running - running}",
                     f"vllm:kv_cache_usage_perc{labels} 0.0"]
            if self.settings.speculative:
                lines += [f"vllm:spec_decode_num_drafts_total{labels} {spec['drafts']}",
                          f"vllm:spec_decode_num_draft_tokens_total{labels} {spec['draft_tokens']}",
                          f"vllm:spec_decode_num_accepted_tokens_total{labels} {spec['accepted']}"]
            return "\n".join(lines) + "\n"
        labels = f'{{model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"}}'
        rate = spec["accepted"] / spec["draft_tokens"] if spec["draft_tokens"] else 0.0
        lines = [f"sglang:num_running_reqs{labels} {self.running}", f"sglang:num_queue_reqs{labels} 0"]
        if self.settings.speculative:
            lines += [f"sglang:spec_accept_rate{labels} {rate:.4f}", f"sglang:spec_accept_length{labels} {1 + rate * spec['steps']:.4f}",
                      f"sglang:spec_num_steps{labels} {spec['steps']}", f"sglang:spec_verify_calls_total{labels} {spec['drafts']}"]
        return "\n".join(lines) + "\n"

    def serve(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # the journal gets one line per request otherwise
                pass

            def send(self, status: int, body, content_type: str = "application/json") -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self) -> bool:
                key = server.settings.api_key
                path = self.path.split("?")[0]
                if not key:
                    return True
                if server.settings.engine == "vllm" and not path.startswith(("/v1", "/v2", "/inference", "/cohere")):
                    return True
                if server.settings.engine == "sglang" and path.startswith(("/health", "/ready", "/metrics")):
                    return True
                return self.headers.get("Authorization") == f"Bearer {key}"

            def do_GET(self):
                path = self.path.split("?")[0]
                if not self.authorized():
                    return self.send(401, {"error": "Unauthorized"})
                if path in ("/health", "/health_generate", "/ready") and (path == "/health" or server.settings.engine == "sglang"):
                    return self.send(200 if server.healthy() else 503, "", "text/plain")
                if path == "/v1/models":
                    return self.send(200, server.models())
                if path == "/metrics" and server.settings.metrics:
                    return self.send(200, server.metrics(), "text/plain; version=0.0.4")
                if path == "/version":
                    return self.send(200, {"version": VERSIONS[server.settings.engine]})
                if path == "/is_sleeping" and server.settings.engine == "vllm" and server.settings.can_park:
                    return self.send(200, {"is_sleeping": server.parked})
                return self.send(404, {"detail": "Not Found"})

            def do_POST(self):
                path = self.path.split("?")[0]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                if not self.authorized():
                    return self.send(401, {"error": "Unauthorized"})
                standby = {"vllm": {"/sleep": server.park, "/wake_up": server.wake},
                           "sglang": {"/release_memory_occupation": server.park, "/resume_memory_occupation": server.wake}}
                action = standby[server.settings.engine].get(path) if server.settings.can_park else None
                if action:
                    try:
                        action()
                    except RuntimeError as exc:
                        return self.send(500, {"error": {"message": str(exc), "type": "InternalServerError", "param": None, "code": 500}})
                    # vLLM answers an empty 200; SGLang's handler returns nothing, which its framework sends as null
                    return self.send(200, "" if server.settings.engine == "vllm" else "null")
                if path != "/v1/completions":
                    return self.send(404, {"detail": "Not Found"})
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    return self.send(400, {"object": "error", "message": "invalid JSON", "type": "Bad Request", "param": None, "code": 400})
                model = body.get("model")
                if server.settings.engine == "vllm" and model and model != server.settings.served:
                    return self.send(404, {"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError",
                                                     "param": "model", "code": 404}})
                return self.send(*server.complete(body))

        httpd = ThreadingHTTPServer((self.settings.host, self.settings.port), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        self.warm = True
        print(f"INFO: serving {self.settings.served} on http://{self.settings.host}:{self.settings.port}", flush=True)

    # --- shutdown -----------------------------------------------------------------------------------------------------
    def on_sigterm(self, _signum, _frame) -> None:
        self.stopping.set()

    def drain_and_exit(self) -> None:
        print("INFO: SIGTERM received, draining", flush=True)
        limit = self.settings.drain_timeout
        deadline = None if limit is None or os.environ.get("SGL_FORCE_SHUTDOWN") else time.monotonic() + limit
        if os.environ.get("SGL_FORCE_SHUTDOWN"):
            deadline = time.monotonic()
        while self.running and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)
        time.sleep(float(self.faults.get("drain_seconds", 0)))
        self.stop_workers()
        print("INFO: shut down", flush=True)
        sys.stdout.flush()
        os._exit(0)


def fail(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(1)


def witnessed(role: str, on_stop) -> bool:
    """Signals taken by the witness (SIGTERM and SIGINT call ``on_stop``; SIGHUP exits as its default would)."""
    if not WITNESS_DIR.is_dir():
        return False

    def on_signal(signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            on_stop(signum)
        elif signum == signal.SIGHUP:
            os._exit(128 + signum)

    signal_witness.install(str(WITNESS_DIR), role, on_signal)
    return True


def worker_main(spec: dict) -> None:
    """One tensor-parallel rank: holds its GPU's device files and memory until the server goes away."""
    faults = spec["faults"]
    if spec["escape"]:
        os.setsid()
        if os.fork():
            os._exit(0)  # the server loses track of it; it is reparented to PID 1
    # SIGTERM ends a worker (its default); SIGKILL, the server's death (PDEATHSIG) and the cgroup's kill as ever
    witnessed(f"{spec['engine']} worker", lambda signum: os._exit(128 + signum))
    set_title(f"VLLM::Worker_TP{spec['rank']}" if spec["engine"] == "vllm" else f"sglang::scheduler_TP{spec['rank']}")
    held = [open(DEV / f"nvidia{spec['minor']}", "rb"), open(DEV / "nvidiactl", "rb"), open(DEV / "nvidia-uvm", "rb")]  # noqa: SIM115
    linger_ms = int(faults.get("release_delay_ms", 0))
    try:
        allocation = nvml_sim.allocate(NVML_ROOT, spec["gpu"], spec["mib"], [os.getpid()], linger_ms=linger_ms)
    except nvml_sim.OutOfMemory as exc:
        if not faults.get("ignore_busy_gpus"):
            fail(f"torch.OutOfMemoryError: {exc}")
        # told to start beside another engine: it takes what is left, as an engine sized by free memory would
        used, total = nvml_sim.used_mib(NVML_ROOT, spec["gpu"])
        allocation = nvml_sim.allocate(NVML_ROOT, spec["gpu"], max(total - used, 0), [os.getpid()], linger_ms=linger_ms)
    if faults.get("leak_mib"):
        nvml_sim.allocate(NVML_ROOT, spec["gpu"], int(faults["leak_mib"]), [], leak=True)
    parent = os.getppid()
    print(f"ready {allocation}", flush=True)
    if spec.get("survive"):
        sys.stdout.close()
        while True:  # outlives the server: nothing watches for its exit
            time.sleep(3600)
    # dies with the server, as the engines' workers do; the kernel says when (polling for it cost CPU on every lab node)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server went away before the line above
        os._exit(0)
    while held:
        signal.pause()


def main(argv: list[str]) -> None:
    if argv and argv[0] == "__worker__":
        return worker_main(json.loads(argv[1]))
    if argv[:1] == ["--version"] and argv[1:2] in (["vllm"], ["sglang"]):
        print(load_faults(argv[1]).get("version") or VERSIONS[argv[1]], flush=True)
        return None
    if not argv or argv[0] not in ("vllm", "sglang"):
        fail("usage: engine_double.py vllm|sglang [options]")
    engine = argv[0]
    try:
        settings = Settings(engine, engine_cli.parse(engine, argv[1:]))
    except engine_cli.EngineCliError as error:
        prog = "vllm serve" if engine == "vllm" else "sglang serve"
        print(f"usage: {prog} [options]\n{prog}: error: {error}", file=sys.stderr, flush=True)
        os._exit(2)
    faults = load_faults(engine)
    if faults.get("exit_on_start"):
        fail("RuntimeError: simulated start failure (exit_on_start)")
    refusal = gguf_refusal(settings)
    if refusal:
        fail(refusal)
    server = Server(settings, faults)

    def on_stop(signum: int) -> None:
        if signum == signal.SIGINT or not faults.get("ignore_sigterm"):
            server.stopping.set()

    # before any thread starts: the witness's mask is inherited by the threads started after it
    if not witnessed(f"{engine} server", on_stop):
        signal.signal(signal.SIGTERM, signal.SIG_IGN if faults.get("ignore_sigterm") else server.on_sigterm)
        signal.signal(signal.SIGINT, server.on_sigterm)
    server.start_workers()
    loaded, seconds = read_weights([settings.model] + ([settings.draft_model] if settings.draft_model else []))
    print(f"INFO: read {loaded / 2**30:.2f} GiB of weights in {seconds:.2f}s", flush=True)
    time.sleep(float(faults.get("load_seconds", 1)))  # loading: the port does not listen yet
    if faults.get("load_until"):
        # a test holds the load (and so the switch's lease) until it lets go: no race with a machine's pace
        deadline = time.monotonic() + 600
        while not Path(faults["load_until"]).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    if not server.stopping.is_set():
        server.serve()
    server.stopping.wait()
    server.drain_and_exit()


if __name__ == "__main__":
    main(sys.argv[1:])
