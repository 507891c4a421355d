"""The switch's downtime on the lab: with and without the weight prewarm, and client requests through HAProxy with and
without the rotation hooks.

A 3-node lab with engine ports published on 127.0.0.1 and a model of real files (GPUFLEET_LAB_MODEL_MIB, 3 GiB by
default) that the engine doubles read in full at start.
1. Downtime (report's downtime_s) of node1 switching vLLM <-> SGLang alone, cold (every weight file dropped from the
   page cache with posix_fadvise DONTNEED just before, prewarm off) and prewarmed (dropped the same way, prewarm on),
   interleaved run by run, 3 of each; medians.
2. A bounded load generator (tests/sim/traffic.py) sends completions through HAProxy during a whole 3-node switch
   vLLM -> SGLang with the built-in HAProxy hooks, and again (after switching back) without them.
Prints the JSON result; run_all.py writes it to docs/results/switch_downtime.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("GPUFLEET_LAB", "benchsw")
os.environ.setdefault("GPUFLEET_LAB_PORT", "2621")
os.environ.setdefault("GPUFLEET_LAB_MODEL_MIB", "3072")
sys.path.insert(0, str(REPO / "tests" / "sim"))
import lab  # noqa: E402
import model_files  # noqa: E402

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
TRAFFIC = REPO / "tests" / "sim" / "traffic.py"
HTTP_PORT = 18601  # node1's engine port on 127.0.0.1; HAProxy listens one below
WORK = lab.BUILD / "bench"
REPETITIONS = 3


def switch(target: str, *extra: str) -> dict:
    """One run of switch_engine.yml; returns its JSON report."""
    run = subprocess.run([PLAYBOOK, "-i", str(lab.BUILD / "inventory.ini"), str(REPO / "playbooks" / "switch_engine.yml"),
                          "-e", f"target={target}", "-e", f"switch_engine_report_dir={WORK}", *extra],
                         capture_output=True, text=True, cwd=REPO, check=False)
    report = json.loads((WORK / "switch_engine.json").read_text())
    if run.returncode:
        raise SystemExit(f"switch to {target} failed:\n{run.stdout[-3000:]}")
    return report


def drop_page_cache(directory: Path) -> int:
    """Evict every file of the model directories from the page cache (the lab's nodes read them through a bind mount)."""
    dropped = 0
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            dropped += path.stat().st_size
    return dropped


def downtime_runs(models: Path) -> dict:
    runs: dict = {"cold": [], "prewarm": []}
    target = "sglang"
    for _repetition in range(REPETITIONS):
        for mode in ("cold", "prewarm"):
            drop_page_cache(models)
            report = switch(target, "-l", "node1,localhost", "-e", f"switch_engine_prewarm={'true' if mode == 'prewarm' else 'false'}")
            node = report["hosts"]["node1"]
            runs[mode].append({"downtime_s": node["downtime_s"], "bring_up_s": node["durations_s"].get("bring_up"),
                               "prewarm_s": node["durations_s"].get("prewarm"), "prewarm_bytes": (node["prewarm"] or {}).get("bytes")})
            print(json.dumps({mode: runs[mode][-1]}), file=sys.stderr, flush=True)
            target = "vllm" if target == "sglang" else "sglang"
    return runs


def under_load(label: str, target: str, hooks: bool) -> dict:
    stop = WORK / f"stop-{label}"
    stop.unlink(missing_ok=True)
    out = WORK / f"load-{label}.json"
    load = subprocess.Popen([sys.executable, str(TRAFFIC), "load", "--url", f"http://127.0.0.1:{HTTP_PORT - 1}", "--out", str(out),
                             "--stop-file", str(stop), "--clients", "6", "--max-requests", "200000", "--max-seconds", "900"],
                            stdout=subprocess.DEVNULL)
    time.sleep(3)
    rotation = ["-e", "switch_engine_rotation=haproxy", "-e", "switch_engine_haproxy_backend=engines", "-e",
                f"switch_engine_haproxy_socket={lab.BUILD / 'haproxy.sock'}", "-e", "switch_engine_rotation_delegate_to=localhost"]
    try:
        report = switch(target, *(rotation if hooks else []))
    finally:
        stop.touch()
        load.wait(timeout=120)
    result = json.loads(out.read_text())
    result["downtime_s"] = [host["downtime_s"] for host in report["hosts"].values()]
    result["min_serving"] = report["fleet"]["min_serving"]
    return result


def median(values: list) -> float:
    return round(statistics.median(values), 2)


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
        models = model_files.ensure(lab.MODELS, lab.MODEL_MIB)
        lab.up(3, 8, http_port=HTTP_PORT)
    try:
        switch("vllm")
        runs = downtime_runs(models)
        subprocess.run([sys.executable, str(TRAFFIC), "haproxy-start", str(lab.BUILD / "inventory.ini"), "--port", str(HTTP_PORT - 1)],
                       check=True, stdout=subprocess.DEVNULL)
        switch("vllm")  # node1 ends the downtime runs on either engine
        with_hooks = under_load("with_hooks", "sglang", hooks=True)
        switch("vllm", "-e", "switch_engine_rotation=haproxy", "-e", "switch_engine_haproxy_backend=engines", "-e",
               f"switch_engine_haproxy_socket={lab.BUILD / 'haproxy.sock'}", "-e", "switch_engine_rotation_delegate_to=localhost")
        without_hooks = under_load("without_hooks", "sglang", hooks=False)
    finally:
        subprocess.run([sys.executable, str(TRAFFIC), "haproxy-stop", str(lab.BUILD / "inventory.ini")], check=False,
                       stdout=subprocess.DEVNULL)
        with contextlib.redirect_stdout(sys.stderr):
            lab.down()
    weights = sum(size for _path, size in model_files_weights(models))
    result = {
        "model_gib": round(weights / 2**30, 2),
        "downtime_s": {"cold": median([r["downtime_s"] for r in runs["cold"]]), "prewarm": median([r["downtime_s"] for r in runs["prewarm"]])},
        "bring_up_s": {"cold": median([r["bring_up_s"] for r in runs["cold"]]), "prewarm": median([r["bring_up_s"] for r in runs["prewarm"]])},
        "prewarm_s": median([r["prewarm_s"] for r in runs["prewarm"]]),
        "failed_requests": {"with_hooks": with_hooks["failed"], "without_hooks": without_hooks["failed"]},
        "requests_sent": with_hooks["sent"] + without_hooks["sent"],
        "runs": runs, "with_hooks": with_hooks, "without_hooks": without_hooks,
    }
    print(json.dumps(result, indent=1))


def model_files_weights(models: Path) -> list:
    return [(path, path.stat().st_size) for path in models.rglob("*.safetensors")]


if __name__ == "__main__":
    main()
