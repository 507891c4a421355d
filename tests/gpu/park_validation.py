"""Park and wake on a real NVIDIA GPU, against the pinned-copy floor measured in the same run.

Run as root on a GPU node with PyTorch, nvidia-ml-py and ansible-core (systemd or a writable cgroup v2 hierarchy for the teardown part):

    python3 tests/gpu/park_validation.py [--out DIR] [--gib 32]

1. The floor: one process copies GIB of GPU memory to a pinned host buffer allocated beforehand and back, and then
   pins a fresh host buffer of the same size and copies into it (what a park that allocates its buffer when it parks
   pays).
2. A sleeper parks as vLLM's sleep mode level 1 does - its tensor copied to a pinned host buffer allocated at park
   time, its GPU memory freed, its CUDA context kept - then wakes (GPU memory allocated again, copied back, the data
   checked), then parks and wakes a second time (the pinned buffer reused). Per park: seconds, the GPU memory it
   still holds (NVML), its open /dev/nvidia* files. Goals: wake within 3x the floor's copy in, the first park within
   1.5x the fresh pin plus copy out.
3. The teardown modules beside it: the sleeper runs in a unit's control group (a transient scope through systemd-run
   where systemd is PID 1; elsewhere a cgroup v2 group named as that scope, which is all the modules read of a unit),
   a plain holder beside it; with the sleeper's unit kept and outside_units=kill the teardown must kill the holder,
   keep the sleeper, and pass its memory assertion with the sleeper's memory reported per GPU (left_mib), not counted:
   node_teardown where systemd runs, else gpu_holders_kill (kept_units) and gpu_memory_assert (left_pids).
4. The driver checkpoint (cuCheckpointProcess*, CUDA 12.8+ drivers) of a TP = 1 process holding GIB, driven from
   another process: lock, checkpoint, restore, unlock, with the GPU memory seen while it is out, and the data checked
   after.
Results: <out>/park_<host>.json; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_gpu_validation import REPO, Lab, machine  # noqa: E402

# the floor: copies of the same bytes with a buffer pinned before, then a buffer pinned fresh
FLOOR = r'''
import sys, time, torch
gib = int(sys.argv[1]); n = gib << 30
x = torch.empty(n, dtype=torch.uint8, device="cuda"); x.fill_(7); torch.cuda.synchronize()
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
t = time.monotonic(); host.copy_(x); torch.cuda.synchronize(); out_s = time.monotonic() - t
t = time.monotonic(); x.copy_(host); torch.cuda.synchronize(); in_s = time.monotonic() - t
del host; torch._C._host_emptyCache()  # else PyTorch hands the freed pinned block back, pinned already
t = time.monotonic(); fresh = torch.empty(n, dtype=torch.uint8, pin_memory=True); pin_s = time.monotonic() - t
t = time.monotonic(); fresh.copy_(x); torch.cuda.synchronize(); fresh_out_s = time.monotonic() - t
print("F", out_s, in_s, pin_s, fresh_out_s, flush=True)
'''

# the sleeper: parks and wakes on commands read from stdin, answering one line each
SLEEPER = r'''
import os, sys, time, torch
gib = int(sys.argv[1]); n = gib << 30
weights = torch.empty(n, dtype=torch.uint8, device="cuda"); weights.fill_(42)
weights[: 1 << 20] = torch.arange(1 << 20, device="cuda", dtype=torch.int64).to(torch.uint8)
expect = weights[: 1 << 20].cpu().clone(); torch.cuda.synchronize()
backup = None
print("R", os.getpid(), flush=True)
for line in sys.stdin:
    command = line.strip()
    t = time.monotonic()
    if command == "park":
        if backup is None:
            backup = torch.empty(n, dtype=torch.uint8, pin_memory=True)  # allocated when it parks, as vLLM's sleep does
        backup.copy_(weights); torch.cuda.synchronize()
        del weights; torch.cuda.empty_cache()
        print("P", time.monotonic() - t, flush=True)
    elif command == "wake":
        weights = torch.empty(n, dtype=torch.uint8, device="cuda"); weights.copy_(backup); torch.cuda.synchronize()
        ok = bool(torch.equal(weights[: 1 << 20].cpu(), expect)) and int(weights[-1].item()) == 42
        print("W", time.monotonic() - t, int(ok), flush=True)
    elif command == "check":
        print("C", int(bool(torch.equal(weights[: 1 << 20].cpu(), expect))), flush=True)
'''


def nvidia_files(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("/dev/nvidia")
        except OSError:
            continue
    return count


def process_mib(pid: int, index: int = 0) -> int:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return sum((p.usedGpuMemory or 0) >> 20 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == pid)


def ask(proc: subprocess.Popen, command: str) -> list[str]:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return proc.stdout.readline().split()


def floor(gib: int) -> dict:
    words = subprocess.run([sys.executable, "-c", FLOOR, str(gib)], capture_output=True, text=True, check=True).stdout.split()
    out_s, in_s, pin_s, fresh_out_s = (float(word) for word in words[1:5])
    return {"copy_out_s": round(out_s, 3), "copy_in_s": round(in_s, 3), "fresh_pin_s": round(pin_s, 3), "fresh_copy_out_s": round(fresh_out_s, 3)}


def thp() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    return None


def cgroup2_root() -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def unit_placement(unit: str) -> str | None:
    """How the sleeper is put into ``unit``'s control group here: systemd, a bare cgroup v2 group, or not at all."""
    if Path("/run/systemd/system").is_dir() and shutil.which("systemd-run"):
        return "systemd-run --scope"
    root = cgroup2_root()
    if root is None:
        return None
    try:
        (root / unit).mkdir(exist_ok=True)
    except OSError:
        return None
    return f"cgroup v2 group {root / unit}"


def park_cycles(lab: Lab, gib: int, unit: str | None, placement: str | None, env: dict | None = None, count: int = 2) -> tuple[subprocess.Popen, dict]:
    argv = [sys.executable, "-c", SLEEPER, str(gib)]
    if placement == "systemd-run --scope":
        argv = ["systemd-run", "--scope", "--quiet", f"--unit={unit}", *[f"--setenv={k}={v}" for k, v in (env or {}).items()], *argv]
    sleeper = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {})))
    lab.started.append(sleeper)
    pid = int(sleeper.stdout.readline().split()[1])
    lab.extra.append(pid)
    if placement and placement.startswith("cgroup v2"):
        try:
            (cgroup2_root() / unit / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            placement = f"none: moving it into {unit} failed ({exc})"
    cycles = {"pid": pid, "placement": placement, "env": env or {}, "cgroup": Path(f"/proc/{pid}/cgroup").read_text().strip(),
              "serving_mib": process_mib(pid), "cycles": []}
    for _cycle in range(count):
        park_s = float(ask(sleeper, "park")[1])
        parked = {"park_s": round(park_s, 3), "parked_mib": process_mib(pid), "nvidia_files": nvidia_files(pid)}
        words = ask(sleeper, "wake")
        parked.update(wake_s=round(float(words[1]), 3), data_intact=words[2] == "1")
        cycles["cycles"].append(parked)
    ask(sleeper, "park")  # left parked for the teardown
    cycles["left_parked_mib"] = process_mib(pid)
    return sleeper, cycles


def teardown_beside(lab: Lab, unit: str, sleeper_pid: int, gib: int, placement: str) -> dict:
    """A plain holder beside the parked sleeper, torn down with the sleeper's unit kept: node_teardown where systemd
    runs; elsewhere the two modules it chains (it needs systemctl), gpu_holders_kill with kept_units and
    gpu_memory_assert with the kept processes' memory left."""
    holder, pids = lab.holder("plain", 0, max(1, gib // 8))
    count = pynvml.nvmlDeviceGetCount()
    if placement == "systemd-run --scope":
        # no unit to stop: the kept one is the parked engine's, and the holder runs in none
        result, wall = lab.module("node_teardown", {"units": [], "kept_units": [unit], "outside_units": "kill", "lease": False,
                                                    "metrics_dir": "", "expected_gpu_count": count, "memory_timeout": 60})
        steps = result.get("steps") or {}
        holders, after, walls = steps.get("holders") or {}, steps.get("after") or {}, [wall]
        passed = result.get("result") == "done"
        modules = "node_teardown"
    else:
        holders, kill_wall = lab.module("gpu_holders_kill", {"kept_units": [unit], "outside_units": "kill", "term_timeout": 5})
        left = [holder["pid"] for holder in holders.get("kept") or []]
        after, assert_wall = lab.module("gpu_memory_assert",
                                        {"left_pids": left, "expected_count": count, "max_used_mib": 512, "timeout": 60})
        walls = [kill_wall, assert_wall]
        passed = not holders.get("failed") and not after.get("failed")
        result = {"msg": holders.get("msg") or after.get("msg")}
        modules = "gpu_holders_kill + gpu_memory_assert"
    signalled = {p["pid"] for p in (holders.get("terminated") or []) + (holders.get("killed") or [])}
    return {"modules": modules, "msg": result.get("msg"), "playbook_wall_s": [round(wall, 3) for wall in walls],
            "kept": sorted(p["pid"] for p in holders.get("kept") or []), "signalled": sorted(signalled),
            "holder_killed": bool(set(pids) & signalled), "sleeper_kept": sleeper_pid not in signalled and Path(f"/proc/{sleeper_pid}").exists(),
            "used_mib": [gpu.get("used_mib") for gpu in after.get("gpus") or []],
            "left_mib": [gpu.get("left_mib") for gpu in after.get("gpus") or []], "passed": passed}


def role_pinning(lab: Lab) -> dict:
    """The pinning setting the vllm role gives a vLLM started to park (its default vllm_sleep_pin_threads), rendered by
    the role's own code: what is measured here is what the unit gets."""
    import yaml  # noqa: PLC0415 - PyTorch's machines have it; the rest of the harness does not need it

    sys.path.insert(0, lab.env["ANSIBLE_COLLECTIONS_PATH"])
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines  # noqa: PLC0415

    threads = yaml.safe_load((REPO / "roles/vllm/defaults/main.yml").read_text())["vllm_sleep_pin_threads"]
    config = {"unit": "vllm.service", "user": "vllm", "model": "m", "host": "127.0.0.1", "port": 8000, "restart": "always",
              "ready_timeout": 60, "shutdown_timeout": 60, "executable": "/usr/local/bin/vllm", "parkable": True, "park_pin_threads": threads}
    lines = _engines.engine_facts(config, "vllm")["environment_lines"]
    return dict(line.strip('"').split("=", 1) for line in lines if line.strip('"').startswith("PYTORCH_CUDA_ALLOC_CONF="))


# the checkpoint's driver: another process, as cuda-checkpoint is; one call of the API per line read
CHECKPOINTER = r'''
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
pid = int(sys.argv[1])
print("I", cuda.cuInit(0), int(hasattr(cuda, "cuCheckpointProcessCheckpoint")), flush=True)
for line in sys.stdin:
    name = line.strip()
    t = time.monotonic()
    code = getattr(cuda, "cuCheckpointProcess" + name)(ctypes.c_int(pid), None)
    print(name, code, time.monotonic() - t, flush=True)
'''


def checkpoint(lab: Lab, gib: int) -> dict:
    """The driver's checkpoint of a TP = 1 process, through libcuda (cuCheckpointProcess*): seconds out and in."""
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEPER, str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lab.started.append(sleeper)
    pid = int(sleeper.stdout.readline().split()[1])
    driver = subprocess.Popen([sys.executable, "-c", CHECKPOINTER, str(pid)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lab.started.append(driver)
    init_code, has_api = driver.stdout.readline().split()[1:3]
    if init_code != "0" or has_api != "1":
        return {"skipped": f"cuInit answered {init_code}" if init_code != "0" else "this driver has no checkpoint API (CUDA 12.8+ drivers)"}
    figures: dict = {"pid": pid, "before_mib": process_mib(pid), "before_nvidia_files": nvidia_files(pid)}
    for name in ("Lock", "Checkpoint", "Restore", "Unlock"):
        code, seconds = ask(driver, name)[1:3]
        figures[f"{name.lower()}_s"] = round(float(seconds), 3)
        figures[f"{name.lower()}_code"] = int(code)
        if name == "Checkpoint":
            figures["out_mib"] = process_mib(pid)
            figures["out_nvidia_files"] = nvidia_files(pid)
        if code != "0":
            break
    figures["data_intact"] = ask(sleeper, "check")[1:] == ["1"] if figures.get("unlock_code") == 0 else False
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--gib", type=int, default=32)
    args = parser.parse_args(argv)
    pynvml.nvmlInit()
    out = Path(args.out)
    lab = Lab(out)
    unit = "gpufleet-park-validation.scope"
    placement = unit_placement(unit)
    report: dict = {"machine": machine(), "transparent_hugepages": thp(), "gib": args.gib, "date": time.strftime("%Y-%m-%d"), "checks": {}}
    path = out / f"park_{platform.node() or 'node'}.json"
    try:
        report["floor"] = floor(args.gib)
        sleeper, report["park"] = park_cycles(lab, args.gib, unit, placement)
        placed = report["park"]["placement"]
        report["teardown"] = (teardown_beside(lab, unit, report["park"]["pid"], args.gib, placed) if placed and not placed.startswith("none")
                              else {"skipped": placed or "neither systemd nor a writable cgroup v2 hierarchy: no unit to keep"})
        sleeper.kill()
        sleeper.wait()
        # the same first park with the pinning the vllm role sets for a vLLM started to park
        registered, report["park_host_register"] = park_cycles(lab, args.gib, None, None, env=role_pinning(lab), count=1)
        registered.kill()
        registered.wait()
        report["checkpoint"] = checkpoint(lab, args.gib)
        report["ratios"], report["checks"] = judge(report)
    finally:
        lab.cleanup()
        if placement and placement.startswith("cgroup v2"):
            with contextlib.suppress(OSError):
                (cgroup2_root() / unit).rmdir()
        path.write_text(json.dumps(report, indent=1))
    print(json.dumps({key: report.get(key) for key in ("floor", "park", "park_host_register", "teardown", "ratios", "checks", "checkpoint")}, indent=1))
    return 0 if report["checks"] and all(report["checks"].values()) else 1


def judge(report: dict) -> tuple[dict, dict]:
    """The ratios against the floor of the same run, and the checks the exit status stands on."""
    cycles = report["park"]["cycles"]
    floor_figures = report["floor"]
    ratios = {"wake_over_copy_in": round(cycles[0]["wake_s"] / floor_figures["copy_in_s"], 2),
              "first_park_over_fresh_pin_and_copy": round(cycles[0]["park_s"] / (floor_figures["fresh_pin_s"] + floor_figures["fresh_copy_out_s"]), 2),
              "second_park_over_copy_out": round(cycles[1]["park_s"] / floor_figures["copy_out_s"], 2),
              "first_park_default_over_host_register": round(cycles[0]["park_s"] / report["park_host_register"]["cycles"][0]["park_s"], 2)}
    teardown = report["teardown"]
    checks = {"data_intact": all(cycle["data_intact"] for cycle in cycles),
              "context_kept": all(cycle["nvidia_files"] > 0 for cycle in cycles),
              "wake_within_3x_floor": ratios["wake_over_copy_in"] <= 3,
              "park_within_1_5x_pin_and_copy": ratios["first_park_over_fresh_pin_and_copy"] <= 1.5,
              "teardown_kept_the_parked_killed_the_other": bool(teardown.get("passed") and teardown.get("holder_killed")
                                                                and teardown.get("sleeper_kept"))}
    return ratios, checks


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
