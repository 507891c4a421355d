"""The situation the collection exists for, on a real multi-GPU node: a tensor-parallel job torn down.

    sudo python3 tests/gpu/tp_teardown_scenario.py [--out DIR] [--gib 16]

A parent that ignores SIGTERM starts one PyTorch worker per visible GPU, joined by NCCL (an all-reduce, so workers
also map their peers' memory); the last worker escaped into its own session (setsid). Then, through ansible-playbook
on localhost: gpu_memory_assert with expected_count (every GPU checked and reported), gpu_holders_kill on every GPU,
gpu_memory_assert again. Measured: first signal to verified free on every GPU, against the physical floor (SIGKILL
of one holder to its memory freed) in the same run. Last: a holder on the last GPU alone (CUDA_VISIBLE_DEVICES) must be
found and reported on that GPU's index, whatever the device minors. Results: <out>/tp_scenario_<host>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_gpu_validation import Lab, alive, machine, used_mib, wait_free  # noqa: E402

JOB = r'''
import os, sys, time, signal, socket
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world, gib, port, ready):
    if rank == world - 1:
        os.setsid()  # escaped into its own session, as SGLang schedulers are
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda").fill_(1)
    y = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(y)
    torch.cuda.synchronize()
    ready.put(os.getpid())
    while True:
        time.sleep(3600)

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent ignores SIGTERM
    world, gib = torch.cuda.device_count(), int(sys.argv[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, gib, port, ready)) for r in range(world)]
    for p in procs:
        p.start()
    pids = [ready.get(timeout=180) for _rank in range(world)]
    print("R", *pids, flush=True)
    while True:
        time.sleep(3600)
'''


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--gib", type=int, default=16)
    args = parser.parse_args(argv)
    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    out = Path(args.out)
    lab = Lab(out)
    report: dict = {"machine": machine(), "gpu_count": count,
                    "minors": [pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]}
    try:
        baseline = [used_mib(i) for i in range(count)]
        floor_holder, _pids = lab.holder("plain", count - 1, args.gib)
        started = time.monotonic()
        floor_holder.kill()
        report["floor_sigkill_to_free_s"] = round(wait_free(count - 1, baseline[-1]), 3)
        floor_holder.wait()
        report["floor_measured_at_s"] = round(time.monotonic() - started, 3)

        script = out / "tp_job.py"  # spawned workers import __main__ from a file
        script.write_text(JOB)
        job = subprocess.Popen([sys.executable, str(script), str(args.gib)], stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1"))
        lab.started.append(job)
        words = job.stdout.readline().split()
        if not words:
            raise SystemExit("the tensor-parallel job did not start")
        workers = [int(w) for w in words[1:]]
        lab.extra += workers
        report["workers"] = workers
        report["used_mib_with_job"] = [used_mib(i) for i in range(count)]
        before, _seconds = lab.module("gpu_memory_assert", {"expected_count": count, "timeout": 0})
        report["assert_before"] = {"dirty": before.get("dirty"), "gpus_reported": [g["index"] for g in before.get("gpus", [])]}
        first_signal = time.monotonic()
        killed, kill_wall = lab.module("gpu_holders_kill", {"term_timeout": 5, "kill_timeout": 60, "outside_units": "kill"})
        after, assert_wall = lab.module("gpu_memory_assert", {"expected_count": count, "timeout": 120, "interval": 0.1})
        report["signal_to_verified_free_all_gpus_s"] = round(time.monotonic() - first_signal, 3)
        report["kill"] = {"terminated": sorted(p["pid"] for p in killed["terminated"]), "killed": sorted(p["pid"] for p in killed["killed"]),
                          "protected": [(p["pid"], p["reason"]) for p in killed["protected"]], "module_elapsed_s": round(killed["elapsed"], 3),
                          "playbook_wall_s": round(kill_wall, 3)}
        report["assert_after"] = {"passed": after.get("passed"), "used_mib": [g["used_mib"] for g in after.get("gpus", [])],
                                  "gpus_reported": [g["index"] for g in after.get("gpus", [])], "playbook_wall_s": round(assert_wall, 3)}
        report["checks"] = {
            "every_gpu_checked": (report["assert_before"]["gpus_reported"] == list(range(count))
                                  and report["assert_after"]["gpus_reported"] == list(range(count))),
            "parent_gone": not alive(job.pid), "workers_gone": not any(alive(pid) for pid in workers),
            "escaped_worker_gone": not alive(workers[-1]) if workers else False,
            "memory_free_on_all": bool(after.get("passed")),
        }

        last = count - 1
        env_holder = subprocess.Popen([sys.executable, "-c", "import torch,time;x=torch.empty(4<<30,dtype=torch.uint8,device='cuda');"
                                       "x.fill_(1);torch.cuda.synchronize();print('R',flush=True);time.sleep(3600)"],
                                      stdout=subprocess.PIPE, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(last)))
        lab.started.append(env_holder)
        env_holder.stdout.readline()
        plan, _seconds = lab.module("gpu_holders_kill", {"gpus": [str(last)], "outside_units": "kill"}, check_mode=True)
        found = [t for t in plan["targets"] if t["pid"] == env_holder.pid]
        report["last_gpu_alone"] = {"gpu": last, "found": bool(found), "reported_gpus": found[0]["gpus"] if found else None,
                                    "devices": found[0]["devices"] if found else None}
        report["checks"]["holder_on_last_gpu_reported_on_it"] = bool(found) and found[0]["gpus"] == [last]
    finally:
        lab.cleanup()
    path = out / f"tp_scenario_{platform.node() or 'node'}.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report.get(k) for k in ("checks", "floor_sigkill_to_free_s", "signal_to_verified_free_all_gpus_s", "last_gpu_alone")}, indent=1))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
