"""Switching back to a parked engine against starting it cold, side by side on one lab node.

A 1-node lab (8 simulated GPUs) whose vLLM double takes --load-seconds (20 by default) to load, standing in for a
real engine's start of minutes. Each repetition switches node1 vLLM -> SGLang -> vLLM twice, interleaved:
- parked: switch_engine_park_previous=auto, vLLM started with vllm_sleep_mode - the forward switch parks vLLM
  (park_s, inside its downtime), the switch back wakes it (wake_s);
- cold: park off - the forward switch stops vLLM, the switch back starts it cold.
Per run, the switch back's downtime_s and engine_start_s (the wake, or the start) and the forward switch's downtime_s
and park_s; medians and the ratio of the switch back's downtime, cold over parked. Prints the JSON result
(docs/results/park_switch_back.json); --keep-lab leaves the lab up.
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
os.environ.setdefault("GPUFLEET_LAB", "benchpark")
os.environ.setdefault("GPUFLEET_LAB_PORT", "2721")
sys.path.insert(0, str(REPO / "tests" / "sim"))
import lab  # noqa: E402

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
WORK = lab.BUILD / "bench-park"
REPETITIONS = 3
STANDBY = ["-e", "vllm_sleep_mode=true", "-e", "sglang_memory_saver=true"]


def switch(target: str, park: str) -> dict:
    """One run of switch_engine.yml on node1; returns node1's report."""
    run = subprocess.run([PLAYBOOK, "-i", str(lab.BUILD / "inventory.ini"), str(REPO / "playbooks" / "switch_engine.yml"),
                          "-e", f"target={target}", "-e", f"switch_engine_report_dir={WORK}", "-e", f"switch_engine_park_previous={park}",
                          *STANDBY], capture_output=True, text=True, cwd=REPO, check=False)
    if run.returncode:
        raise SystemExit(f"switch to {target} (park {park}) failed:\n{run.stdout[-3000:]}")
    return json.loads((WORK / "switch_engine.json").read_text())["hosts"]["node1"]


def set_faults(faults: dict) -> None:
    container = f"gpufleet-{os.environ['GPUFLEET_LAB']}-node1"
    subprocess.run(["podman", "exec", "-i", container, "sh", "-c", "cat > /etc/gpufleet-sim/faults.json"], input=json.dumps(faults),
                   text=True, check=True)


def median(values: list) -> float | None:
    values = [value for value in values if value is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    load_seconds = float(next((arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("--load-seconds=")), 20))
    keep = "--keep-lab" in sys.argv[1:]
    WORK.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
        lab.up(1, 8)
    try:
        set_faults({"vllm": {"load_seconds": load_seconds}})
        switch("vllm", "off")
        runs: dict = {"parked": [], "cold": []}
        for _repetition in range(REPETITIONS):
            for mode, park in (("parked", "auto"), ("cold", "off")):
                forward = switch("sglang", park)
                back = switch("vllm", park)
                run = {"forward_downtime_s": forward["downtime_s"], "park_s": forward["park_s"], "back_downtime_s": back["downtime_s"],
                       "back_engine_start_s": back["engine_start_s"], "wake_s": back["wake_s"], "path": (back["park"] or {}).get("path"),
                       "back_result": back["result"]}
                runs[mode].append(run)
                print(json.dumps({mode: run}), file=sys.stderr, flush=True)
    finally:
        if not keep:
            with contextlib.redirect_stdout(sys.stderr):
                lab.down()
    keys = ("forward_downtime_s", "park_s", "back_downtime_s", "back_engine_start_s")
    summary = {mode: {key: median([run[key] for run in runs[mode]]) for key in keys} for mode in runs}
    parked, cold = summary["parked"]["back_downtime_s"], summary["cold"]["back_downtime_s"]
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "load_seconds": load_seconds, "repetitions": REPETITIONS, "runs": runs,
                      "medians": summary, "switch_back_cold_over_parked": round(cold / parked, 1) if parked and cold else None},
                     indent=1))


if __name__ == "__main__":
    main()
