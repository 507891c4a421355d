"""Holder scan cost: the collection's /proc fd+maps scan against fuser, on the same processes and device file.

For each size, fd_farm starts the processes (a few of them also hold the device file); then, alternating, fuser and
our scan run REPS times each. Reported: median and spread of each, their ratio, and whether both found the same
holders. Our scan is timed two ways: in-process (HolderScanner.scan, what the module spends) and as the whole
module run (a Python process, AnsibleModule, check mode, sources=[proc]).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "collections"))  # linked by make setup

from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import HolderScanner, device_nodes  # noqa: E402
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader  # noqa: E402

SIZES = [(20, 10), (2000, 10), (2000, 30)]  # (processes, fds each): 200, 20,000 and 60,000 descriptors
HOLDERS = 8
REPS = 5
MODULE_PEAK_KIB: list[int] = []


def build_farm(work: Path) -> Path:
    binary = work / "fd_farm"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(Path(__file__).with_name("fd_farm.c"))], check=True)
    return binary


def start_farm(binary: Path, work: Path, processes: int, fds: int) -> tuple[subprocess.Popen, list[int], Path]:
    device = work / "nvidia0"
    device.write_bytes(b"\0" * 4096)
    fillers = []
    for i in range(8):
        filler = work / f"filler{i}"
        filler.write_bytes(b"x")
        fillers.append(str(filler))
    farm = subprocess.Popen([str(binary), str(processes), str(fds), str(HOLDERS), str(device), *fillers], stdout=subprocess.PIPE, text=True)
    pids = []
    for line in farm.stdout:
        if line.strip() == "ready":
            break
        pids.append(int(line))
    last = pids[-1]
    deadline = time.monotonic() + 120
    while len(os.listdir(f"/proc/{last}/fd")) < fds:
        if time.monotonic() > deadline:
            raise SystemExit("fd_farm children did not open their descriptors")
        time.sleep(0.05)
    return farm, pids[:HOLDERS], device


def time_fuser(device: Path) -> tuple[float, set[int]]:
    started = time.perf_counter()
    run = subprocess.run(["fuser", str(device)], capture_output=True, text=True, check=False)
    return time.perf_counter() - started, {int(word.rstrip("cemfrs")) for word in run.stdout.split()}


def time_scan(device: Path) -> tuple[float, set[int]]:
    scanner = HolderScanner(device_nodes([str(device)]), ProcReader())
    started = time.perf_counter()
    result = scanner.scan()
    return time.perf_counter() - started, set(result.holdings)


def time_module(device: Path) -> tuple[float, set[int]]:
    args = json.dumps({"ANSIBLE_MODULE_ARGS": {"device_paths": [str(device)], "sources": ["proc"], "outside_units": "kill", "_ansible_check_mode": True}})
    env = dict(os.environ, PYTHONPATH=str(REPO / "collections"))
    started = time.perf_counter()
    run = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "ansible_collections.gpufleet.serving.plugins.modules.gpu_holders_kill", args],
                         capture_output=True, text=True, env=env, cwd="/", check=False)
    elapsed = time.perf_counter() - started
    MODULE_PEAK_KIB.append(int(run.stderr.strip().splitlines()[-1]))
    return elapsed, {holder["pid"] for holder in json.loads(run.stdout)["holders"]}


def summary(samples: list[float]) -> dict:
    return {"median_ms": round(statistics.median(samples) * 1000, 1), "min_ms": round(min(samples) * 1000, 1),
            "max_ms": round(max(samples) * 1000, 1)}


def run() -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        binary = build_farm(work)
        for processes, fds in SIZES:
            farm, holders, device = start_farm(binary, work, processes, fds)
            try:
                timings: dict[str, list[float]] = {"fuser": [], "scan": [], "module": []}
                found = {}
                for _rep in range(REPS):  # interleaved, so that drift affects both alike
                    for name, measure in (("fuser", time_fuser), ("scan", time_scan), ("module", time_module)):
                        seconds, pids = measure(device)
                        timings[name].append(seconds)
                        found[name] = pids
                expected = set(holders)
                results.append({
                    "processes": processes, "fds_each": fds, "descriptors": processes * fds,
                    "fuser": summary(timings["fuser"]), "scan": summary(timings["scan"]), "module": summary(timings["module"]),
                    "ratio_scan_to_fuser": round(statistics.median(timings["scan"]) / statistics.median(timings["fuser"]), 3),
                    "ratio_module_to_fuser": round(statistics.median(timings["module"]) / statistics.median(timings["fuser"]), 3),
                    "module_peak_mib": round(max(MODULE_PEAK_KIB[-REPS:]) / 1024, 1),
                    "same_holders": (found["fuser"] >= expected and found["scan"] >= expected and found["module"] >= expected
                                     and found["fuser"] == found["scan"]),
                })
            finally:
                farm.send_signal(signal.SIGTERM)
                farm.wait()
    return results


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
