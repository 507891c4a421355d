"""Validation of the GPU modules on a real NVIDIA node, through ansible-playbook on localhost.

Run as root on a GPU node with PyTorch, nvidia-ml-py and ansible-core:

    python3 tests/gpu/real_gpu_validation.py [--out DIR] [--gib 8]

It starts PyTorch processes that hold real GPU memory - a plain holder, a SIGTERM-ignorer, a stopped holder, a holder
that forked after allocating (NVML then lists its dead parent), a zombie leader with a live thread, a holder with
pinned host memory (slow release), a protected-name process that keeps NVML open, and a decoy naming sglang that
holds nothing - then runs gpu_memory_assert (must fail), gpu_holders_kill in check mode (the plan), for real, and
gpu_memory_assert (must pass). It measures the physical floor in the same run (SIGKILL of a plain holder to its
memory freed, seen through NVML) and, with two GPUs or more, selection of the last GPU by index and by UUID while a
holder on GPU 0 must survive. Results: <out>/real_gpu_<host>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pynvml

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import torch,time,sys,os,signal,ctypes,threading\n"
        "gpu,gib=int(sys.argv[1]),int(sys.argv[2])\n"
        "x=torch.empty(gib<<30,dtype=torch.uint8,device=f'cuda:{gpu}');x.fill_(1);torch.cuda.synchronize()\n")
KINDS = {
    "plain": "print('R',flush=True);time.sleep(3600)",
    "ignore_term": "signal.signal(signal.SIGTERM,signal.SIG_IGN);print('R',flush=True);time.sleep(3600)",
    "stopped": "print('R',flush=True);time.sleep(3600)",
    "forked": "c=os.fork()\nif c==0:\n time.sleep(3600)\nprint('R',c,flush=True);time.sleep(3600)",
    "zombie_leader": "threading.Thread(target=lambda:time.sleep(3600)).start();print('R',flush=True);ctypes.CDLL(None).pthread_exit(None)",
    "pinned": "y=torch.empty(int(sys.argv[3])<<30,dtype=torch.uint8,pin_memory=True);y.fill_(1);print('R',flush=True);time.sleep(3600)",
}
# a CUDA context and an allocation through the driver API alone, for machines without PyTorch (the M13 case)
DRIVER_HOLD = ("import ctypes,sys,time\ncuda=ctypes.CDLL('libcuda.so.1')\nassert cuda.cuInit(0)==0\n"
               "dev=ctypes.c_int();assert cuda.cuDeviceGet(ctypes.byref(dev),int(sys.argv[1]))==0\n"
               "ctx=ctypes.c_void_p();assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx),dev)==0\n"
               "assert cuda.cuCtxSetCurrent(ctx)==0\nptr=ctypes.c_uint64()\n"
               "assert cuda.cuMemAlloc_v2(ctypes.byref(ptr),ctypes.c_size_t(int(sys.argv[2])<<20))==0\n"
               "print('R',flush=True);time.sleep(3600)")
PROTECTED = ("import ctypes,time,pynvml;ctypes.CDLL(None).prctl(15,b'nvidia-persistenced',0,0,0);pynvml.nvmlInit();"
             "[pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())];print('R',flush=True);time.sleep(3600)")


class Lab:
    def __init__(self, out: Path):
        self.out = out
        self.started: list[subprocess.Popen] = []
        self.extra: list[int] = []
        collections = Path(tempfile.mkdtemp()) / "ansible_collections" / "gpufleet"
        collections.mkdir(parents=True)
        (collections / "serving").symlink_to(REPO)
        self.env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections.parent.parent), ANSIBLE_LOCALHOST_WARNING="False",
                        ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)

    def holder(self, kind: str, gpu: int, gib: int, pinned_gib: int = 0) -> tuple[subprocess.Popen, list[int]]:
        proc = subprocess.Popen([sys.executable, "-c", HOLD + KINDS[kind], str(gpu), str(gib), str(pinned_gib)], stdout=subprocess.PIPE, text=True)
        self.started.append(proc)
        words = proc.stdout.readline().split()
        if not words or words[0] != "R":
            raise SystemExit(f"holder {kind} did not start")
        self.extra += [int(w) for w in words[1:]]
        return proc, [proc.pid] + [int(w) for w in words[1:]]

    def spawn(self, argv: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.started.append(proc)
        proc.stdout.readline()
        return proc

    def module(self, name: str, args: dict, check_mode: bool = False) -> tuple[dict, float]:
        """Run one module through ansible-playbook on localhost; return its result and the playbook's wall time."""
        result_file = Path(tempfile.mkstemp(suffix=".json")[1])
        playbook = Path(tempfile.mkstemp(suffix=".yml")[1])
        playbook.write_text(json.dumps([{
            "hosts": "localhost", "connection": "local", "gather_facts": False,
            "tasks": [{"name": name, f"gpufleet.serving.{name}": args, "check_mode": check_mode, "register": "r", "ignore_errors": True},
                      {"name": "save", "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(result_file)}}]}]))
        started = time.monotonic()
        playbook_command = os.environ.get("ANSIBLE_PLAYBOOK") or shutil.which("ansible-playbook") or str(Path(sys.executable).parent / "ansible-playbook")
        run = subprocess.run([playbook_command, "-i", "localhost,", str(playbook)],
                             capture_output=True, text=True, env=self.env, check=False)
        wall = time.monotonic() - started
        if run.returncode != 0:
            raise SystemExit(f"ansible-playbook failed:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}")
        return json.loads(result_file.read_text()), wall

    def cleanup(self) -> None:
        for proc in self.started:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            proc.wait()
        for pid in self.extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def used_mib(index: int) -> int:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used >> 20


def wait_free(index: int, baseline: int, timeout: float = 120) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if used_mib(index) <= baseline + 512:
            return time.monotonic() - started
        time.sleep(0.005)
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X") or len(os.listdir(f"/proc/{pid}/task")) > 1


def machine() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout.strip().splitlines()
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    return {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version(), "torch": torch_version,
            "gpus": smi, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def physical_floor(lab: Lab, gpu: int, gib: int, baseline: int) -> dict:
    """SIGKILL to memory freed, and SIGTERM to memory freed, for a plain holder: what no tool can beat."""
    floors = {}
    for name, sig in (("sigkill_to_free_s", signal.SIGKILL), ("sigterm_to_free_s", signal.SIGTERM)):
        proc, _pids = lab.holder("plain", gpu, gib)
        started = time.monotonic()
        proc.send_signal(sig)
        freed = wait_free(gpu, baseline)
        floors[name] = round(freed, 3) if freed is not None else None
        proc.wait()
        floors[name.replace("_s", "_measured_at")] = round(time.monotonic() - started, 3)
    return floors


def main_gpu_case(lab: Lab, gpu: int, gib: int, pinned_gib: int) -> dict:
    baseline = used_mib(gpu)
    report: dict = {"gpu": gpu, "baseline_used_mib": baseline, "floor": physical_floor(lab, gpu, gib, baseline)}
    holders = {}
    for kind in ("plain", "ignore_term", "stopped", "zombie_leader"):
        holders[kind] = lab.holder(kind, gpu, gib)[1]
    holders["pinned"] = lab.holder("pinned", gpu, gib, pinned_gib)[1]
    forked_proc, (parent, child) = lab.holder("forked", gpu, gib)
    os.kill(holders["stopped"][0], signal.SIGSTOP)
    forked_proc.kill()
    forked_proc.wait()  # NVML now lists a dead parent while the child holds the memory
    holders["forked_child"] = [child]
    protected = lab.spawn([sys.executable, "-c", PROTECTED])
    decoy = lab.spawn([sys.executable, "-c", "print('R',flush=True);import time;time.sleep(3600)", "sglang", "--model-path", "x"])
    report["used_mib_with_holders"] = used_mib(gpu)
    nvml_listed = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(gpu))]
    report["nvml_listed_pids"] = nvml_listed
    report["nvml_lists_dead_parent"] = parent in nvml_listed

    before, _seconds = lab.module("gpu_memory_assert", {"timeout": 0})
    report["assert_before"] = {"failed": before.get("failed"), "dirty": before.get("dirty"),
                               "classification": (before.get("details") or {}).get(str(gpu), {}).get("classification")}
    plan, _seconds = lab.module("gpu_holders_kill", {"outside_units": "kill"}, check_mode=True)  # a node teardown frees every GPU
    report["plan"] = {"targets": sorted(t["pid"] for t in plan["targets"]), "protected": [(p["pid"], p["reason"]) for p in plan["protected"]],
                      "stale_nvml_pids": plan["stale_nvml_pids"], "signals": plan["signals"]}
    first_signal = time.monotonic()
    killed, kill_wall = lab.module("gpu_holders_kill", {"term_timeout": 5, "kill_timeout": 60, "outside_units": "kill"})
    after, assert_wall = lab.module("gpu_memory_assert", {"timeout": 120, "interval": 0.1})
    report["signal_to_verified_free_s"] = round(time.monotonic() - first_signal, 3)
    report["kill"] = {"terminated": sorted(p["pid"] for p in killed["terminated"]), "killed": sorted(p["pid"] for p in killed["killed"]),
                      "survivors": killed["survivors"], "module_elapsed_s": round(killed["elapsed"], 3), "playbook_wall_s": round(kill_wall, 3),
                      "signals": killed["signals"]}
    report["assert_after"] = {"passed": after.get("passed"), "attempts": after.get("attempts"), "module_elapsed_s": round(after.get("elapsed", 0), 3),
                              "playbook_wall_s": round(assert_wall, 3), "used_mib": [g["used_mib"] for g in after.get("gpus", [])]}
    real_holders = {pid for pids in holders.values() for pid in pids}
    report["checks"] = {
        "every_real_holder_gone": not any(alive(pid) for pid in real_holders),
        "protected_alive": protected.poll() is None,
        "decoy_alive": decoy.poll() is None,
        "ansible_never_a_target": not any("ansible" in " ".join(t.get("cmdline") or []).lower() for t in plan["targets"] + killed["holders"]
                                          if t["pid"] in {s["pid"] for s in killed["signals"]}),
        "stale_parent_reported_not_signalled": (parent in [s["pid"] for s in killed["stale_nvml_pids"]]
                                                and parent not in [s["pid"] for s in killed["signals"]]),
        "assert_failed_while_held": bool(before.get("failed")),
        "assert_passed_when_free": bool(after.get("passed")),
        "planned_equals_real_holders": set(report["plan"]["targets"]) == real_holders,
    }
    return report


def context_case(lab: Lab) -> dict:
    """M13: gpu_memory_assert reads NVML only and creates no CUDA context. A small holder on GPU 0 keeps it polling;
    while it polls every GPU for 4 s, NVML is sampled every 50 ms from here: no compute process may appear that was not
    there before, and no GPU's used memory may grow. Then a PyTorch process that does create a context (the positive
    control) is started: the same sampling must see its PID and its memory."""
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]

    def sample() -> tuple[set[int], list[int]]:
        pids = {p.pid for handle in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return pids, [pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used >> 20 for handle in handles]

    lab.spawn([sys.executable, "-c", DRIVER_HOLD, "0", "1024"])  # 1 GiB on GPU 0: the assertion cannot pass, it polls to its deadline
    base_pids, base_used = sample()
    samples: list[tuple[set[int], list[int]]] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            samples.append(sample())
            time.sleep(0.05)

    thread = threading.Thread(target=sampler)
    thread.start()
    try:
        result, wall = lab.module("gpu_memory_assert", {"max_used_mib": 512, "timeout": 4, "interval": 0.1})
    finally:
        stop.set()
        thread.join()
    new_pids = sorted(set().union(*(pids for pids, _used in samples)) - base_pids)
    growth = max(used[index] - base_used[index] for _pids, used in samples for index in range(len(handles)))
    control = lab.spawn([sys.executable, "-c", DRIVER_HOLD, "0", "1"])  # a context and 1 MiB
    control_pids, control_used = sample()
    report = {"samples": len(samples), "module_attempts": result.get("attempts"), "module_failed_at_deadline": bool(result.get("failed")),
              "playbook_wall_s": round(wall, 3), "new_compute_pids_while_polling": new_pids, "max_used_growth_mib": growth,
              "control": {"pid_listed": control.pid in control_pids, "gpu0_growth_mib": control_used[0] - base_used[0]}}
    report["checks"] = {
        "polled_to_its_deadline": report["module_failed_at_deadline"] and (result.get("attempts") or 0) >= 10,
        "sampled_throughout": len(samples) >= 40,
        "no_compute_process_appeared": not new_pids,
        "no_memory_growth": growth <= 0,
        "control_context_seen": report["control"]["pid_listed"] and report["control"]["gpu0_growth_mib"] > 100,
    }
    return report


def selection_case(lab: Lab, gib: int) -> dict:
    """With two GPUs or more: holders on the last GPU only are freed by index, then by UUID; GPU 0's holder survives."""
    count = pynvml.nvmlDeviceGetCount()
    last = count - 1
    uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(last))
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    keeper = lab.holder("plain", 0, gib)[1][0]
    forked, (parent, orphan) = lab.holder("forked", 0, gib)
    forked.kill()
    forked.wait()  # a GPU-0 context kept by a child NVML does not list: ambiguous when only the last GPU is freed
    results = {"orphan_of_gpu0": orphan}
    for label, selector in (("by_index", str(last)), ("by_uuid", uuid)):
        victim = lab.holder("plain", last, gib)[1][0]
        result, _seconds = lab.module("gpu_holders_kill", {"gpus": [selector], "term_timeout": 5, "outside_units": "kill"})
        results[label] = {"selector": selector, "holders": [(h["pid"], h["gpus"]) for h in result["holders"]],
                          "victim_gone": not alive(victim), "gpu0_holder_alive": alive(keeper),
                          "gpu0_orphan_alive_and_ambiguous": alive(orphan) and orphan in [a["pid"] for a in result["ambiguous"]],
                          "reported_on_gpu": [h["gpus"] for h in result["holders"] if h["pid"] == victim]}
    minors = [pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    return {"gpu_count": count, "minors": minors, **results}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--gib", type=int, default=8, help="GiB each holder allocates")
    parser.add_argument("--pinned-gib", type=int, default=32, help="GiB of pinned host memory of the slow-release holder")
    parser.add_argument("--cases", default="main,context,selection",
                        help="which cases: main and selection need PyTorch; context (M13) needs only the driver")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the modules read every process's file descriptors")
    pynvml.nvmlInit()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lab = Lab(out)
    cases = set(args.cases.split(","))
    report = {"machine": machine()}
    try:
        if "main" in cases:
            report["main"] = main_gpu_case(lab, 0, args.gib, args.pinned_gib)
            lab.cleanup()
            lab.started, lab.extra = [], []
        if "context" in cases:
            report["context"] = context_case(lab)
            lab.cleanup()
            lab.started, lab.extra = [], []
        if "selection" in cases and pynvml.nvmlDeviceGetCount() > 1:
            report["selection"] = selection_case(lab, args.gib)
    finally:
        lab.cleanup()
    path = out / f"real_gpu_{platform.node() or 'node'}.json"
    path.write_text(json.dumps(report, indent=1))
    if "main" in report:
        print(json.dumps(report["main"]["checks"], indent=1))
        print(json.dumps({k: report["main"][k] for k in ("floor", "signal_to_verified_free_s")}, indent=1))
    for name in ("context", "selection"):
        if name in report:
            print(json.dumps(report[name], indent=1))
    return 0 if all(all(report[name]["checks"].values()) for name in ("main", "context") if name in report) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
