"""The switch's downtime on the lab: with and without the weight prewarm, and client requests through HAProxy with and
without the rotation hooks.

A 3-node lab with engine ports published on 127.0.0.1 and a model of real files (GPUFLEET_LAB_MODEL_MIB, 3 GiB by
default) that the engine doubles read in full at start.
1. Downtime (report's downtime_s) of node1 switching vLLM <-> SGLang alone, cold (every weight file dropped from the
   page cache with posix_fadvise DONTNEED just before, prewarm off) and prewarmed (dropped the same way, prewarm on),
   interleaved run by run, 3 of each; medians.
   Each prewarmed run also records where the downtime goes: the engine's own start (engine_start_s, measured on the
   node), the teardown, the rest (overhead_s), the node's whole switch (lease to release) and an unchanged rerun.
2. A bounded load generator (tests/sim/traffic.py) sends completions through HAProxy during a whole 3-node switch
   vLLM -> SGLang with the built-in HAProxy hooks, and again (after switching back) without them (skipped with
   --no-load, which is how an older tree is measured back to back with this one).
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
# where a prewarmed node's downtime goes, and what a whole switch and an unchanged rerun take
CUTOVER_KEYS = ("engine_start_s", "overhead_s", "teardown_s", "switch_s", "unchanged_s", "unchanged_wall_s")


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
            run = {"downtime_s": node["downtime_s"], "bring_up_s": node["durations_s"].get("bring_up"),
                   "prewarm_s": node["durations_s"].get("prewarm"), "prewarm_bytes": (node["prewarm"] or {}).get("bytes"),
                   # older reports have no engine_start_s: their bring-up phase is the nearest figure
                   "engine_start_s": node.get("engine_start_s"), "overhead_s": node.get("overhead_s"),
                   "teardown_s": node["durations_s"].get("teardown"), "switch_s": node["durations_s"].get("total")}
            if mode == "prewarm":
                started = time.monotonic()
                again = switch(target, "-l", "node1,localhost")["hosts"]["node1"]
                run.update(unchanged_result=again["result"], unchanged_s=again["durations_s"].get("total"),
                           unchanged_wall_s=round(time.monotonic() - started, 2))
            runs[mode].append(run)
            print(json.dumps({mode: run}), file=sys.stderr, flush=True)
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


def median(values: list) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    with_load = "--no-load" not in sys.argv[1:]
    WORK.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
        models = model_files.ensure(lab.MODELS, lab.MODEL_MIB)
        lab.up(3, 8, http_port=HTTP_PORT)
    try:
        switch("vllm")
        runs = downtime_runs(models)
        if not with_load:
            return summarize(models, runs, None, None)
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
    summarize(models, runs, with_hooks, without_hooks)


def summarize(models: Path, runs: dict, with_hooks: dict | None, without_hooks: dict | None) -> None:
    weights = sum(size for _path, size in model_files_weights(models))
    warm = runs["prewarm"]
    result = {
        "model_gib": round(weights / 2**30, 2),
        "downtime_s": {"cold": median([r["downtime_s"] for r in runs["cold"]]), "prewarm": median([r["downtime_s"] for r in warm])},
        "bring_up_s": {"cold": median([r["bring_up_s"] for r in runs["cold"]]), "prewarm": median([r["bring_up_s"] for r in warm])},
        "prewarm_s": median([r["prewarm_s"] for r in warm]),
        # prewarmed runs: the engine's own start, the rest of the downtime, the teardown, a node's whole switch, a rerun
        "cutover": {key: median([r.get(key) for r in warm]) for key in CUTOVER_KEYS},
        "runs": runs,
    }
    if with_hooks is not None:
        result.update(failed_requests={"with_hooks": with_hooks["failed"], "without_hooks": without_hooks["failed"]},
                      requests_sent=with_hooks["sent"] + without_hooks["sent"], with_hooks=with_hooks, without_hooks=without_hooks)
    print(json.dumps(result, indent=1))


def model_files_weights(models: Path) -> list:
    return [(path, path.stat().st_size) for path in models.rglob("*.safetensors")]


if __name__ == "__main__":
    main()
