"""The answer check's cost and the real vLLM's drift between starts (issue 53).

    python tests/bench/bench_answers.py double [--rounds 20]
    python tests/bench/bench_answers.py vllm --python PY --model DIR [--starts 5] [--other-model DIR]

double: the lab's engine double serving on 127.0.0.1; each round sends the collection's probe set (3 prompts, greedy,
24 tokens, logprobs) the way the cutover does (_engine_http.greedy_completion, one request at a time) and judges it
against the first round's record (_answers.judge). Prints the median and largest seconds of one check.

vllm: a real vLLM (its CPU build, in the Python PY) started --starts times on the model, each start in a fresh
process, greedy probes sent after it serves; every start's answers compared with the first's: the tokens must be equal,
and the largest logprob difference over every chosen token is the drift the tolerance must cover. With --other-model,
one more start on another model's weights, which the comparison must refuse. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))  # linked by make setup
sys.path.insert(0, str(REPO / "tests" / "sim"))

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers  # noqa: E402
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def probe_set(url: str, model: str) -> tuple[list[answers.Answer], float]:
    client = http.HttpClient(url, timeout=120)
    started = time.monotonic()
    got = [answers.Answer.from_completion(prompt, http.greedy_completion(client, model, prompt, answers.PROBE_TOKENS, "vllm"))
           for prompt in answers.PROBES]
    return got, time.monotonic() - started


def bench_double(rounds: int) -> dict:
    import engine_cli
    import engine_double

    port = free_port()
    server = engine_double.Server(engine_double.Settings("vllm", engine_cli.parse("vllm", ["/models/m", "--host", "127.0.0.1", "--port", str(port)])), {})
    server.serve()
    url = f"http://127.0.0.1:{port}"
    record, seconds = None, []
    for _round in range(rounds):
        started = time.monotonic()
        got, _sent = probe_set(url, "/models/m")
        ident = answers.identity("vllm", "/models/m", "0.33.0", "vllm serve /models/m")
        verdict = answers.judge(ident, record, got, [], [], answers.DEFAULT_TOLERANCE)
        assert verdict["passed"], verdict
        record = record or answers.new_record(ident, got, time.time())
        seconds.append(time.monotonic() - started)
    return {"engine": "the lab's vLLM double (request_seconds 0.05)", "rounds": rounds, "probes": len(answers.PROBES),
            "median_s": round(statistics.median(seconds), 3), "max_s": round(max(seconds), 3)}


def start_vllm(python: str, model: str, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    argv = [python, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
            "--enforce-eager", "--dtype", "float32", "--max-num-seqs", "1"]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_serving(url: str, process: subprocess.Popen, timeout: float = 900) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited {process.returncode} before serving")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("vLLM did not serve in time")


def one_start(python: str, model: str, log: Path) -> dict:
    port = free_port()
    process = start_vllm(python, model, port, log)
    try:
        start_s = wait_serving(f"http://127.0.0.1:{port}", process)
        got, check_s = probe_set(f"http://127.0.0.1:{port}", model)
        return {"start_s": round(start_s, 1), "check_s": round(check_s, 3), "answers": got}
    finally:
        os.killpg(process.pid, 15)
        process.wait(60)


def bench_vllm(python: str, model: str, starts: int, other_model: str | None, logs: Path) -> dict:
    logs.mkdir(parents=True, exist_ok=True)
    runs = [one_start(python, model, logs / f"start-{index}.log") for index in range(starts)]
    first = [answer.to_dict() for answer in runs[0]["answers"]]
    comparisons = [answers.compare(first, run["answers"], 1e9) for run in runs[1:]]  # the tokens alone
    drifts = [answers.drift(first, run["answers"]) for run in runs[1:]]
    result = {"engine": f"vLLM's CPU build ({python})", "model": model, "starts": starts,
              "tokens_equal_in_every_start": all(problem is None for problem in comparisons), "token_differences": comparisons,
              "drift_per_start": drifts, "largest_drift": max(drifts) if drifts else 0.0,
              "start_s": [run["start_s"] for run in runs], "check_s": [run["check_s"] for run in runs],
              "first_answers": [answer["text"] for answer in first],
              "sanity": [answers.degenerate(answer) for answer in runs[0]["answers"]]}
    if other_model:
        other = one_start(python, other_model, logs / "other-model.log")
        result["other_model"] = {"model": other_model, "comparison": answers.compare(first, other["answers"], answers.DEFAULT_TOLERANCE)}
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    double = sub.add_parser("double")
    double.add_argument("--rounds", type=int, default=20)
    real = sub.add_parser("vllm")
    real.add_argument("--python", required=True)
    real.add_argument("--model", required=True)
    real.add_argument("--starts", type=int, default=5)
    real.add_argument("--other-model")
    real.add_argument("--logs", default=str(REPO / "build" / "bench-answers"))
    args = parser.parse_args(argv)
    if args.what == "double":
        print(json.dumps(bench_double(args.rounds), indent=1))
    else:
        print(json.dumps(bench_vllm(args.python, args.model, args.starts, args.other_model, Path(args.logs)), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
