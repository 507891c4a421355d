"""Teardown latency on a lab node: the gpu_teardown role against the shell recipe it replaces, on the same engine double.

For each engine behaviour (exits promptly on SIGTERM, drains for 5 s, ignores SIGTERM, leaves an escaped worker) and
each tool, alternating, REPS times: start vLLM's double on all 8 GPUs (TP 8, its unit from the vllm role) next to a
protected daemon named nvidia-persistenced and a decoy whose command line names python3 and sglang; tear down; then
read what was left: processes holding a GPU node, GPU memory on all 8 GPUs (the recipe itself looks at two), whether
the protected daemon and the decoy survived. Wall time runs from the start of the tool to its own end (the recipe's
last memory query; the role's memory assertion).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "sim"))
import lab  # noqa: E402

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
NODE = "node1"
BEHAVIOURS = {
    "exits_promptly": {},
    "drains_5s": {"drain_seconds": 5},
    "ignores_sigterm": {"ignore_sigterm": True},
    "escaped_worker": {"escape_worker": True},
}
# The one-liners operators run today (the mission's own example), made to run at all on this node.
RECIPE = ("systemctl stop vllm.service; sleep 3; ps aux | grep python3 | grep -v grep | awk '{print $2}' | xargs -r kill -9; sleep 3; "
          "kill -9 $(fuser /dev/nvidia* 2>/dev/null) 2>/dev/null; sleep 2; "
          "python3 -c 'import pynvml as n; n.nvmlInit(); print([n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).used >> 20 for i in (0, 1)])'")
PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
INVENTORY = str(lab.BUILD / "inventory.ini")


def node(command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", lab.CONTAINER_PREFIX + NODE, "bash", "-c", command], capture_output=True, text=True, check=check)


def ansible(playbook: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([PLAYBOOK, "-i", INVENTORY, "-l", NODE, playbook, *extra], capture_output=True, text=True, cwd=REPO, check=False)


def prepare(faults: dict) -> None:
    """A clean node serving the vLLM double, plus the protected daemon and the decoy."""
    node("systemctl stop vllm.service 'gpufleet-bench-*' 2>/dev/null; systemctl reset-failed 2>/dev/null; "
         "pkill -9 -f '[_]_worker__' ; python3 /opt/gpufleet-tests/sim/node_setup.py --reset", check=False)
    node(f"echo '{json.dumps({'vllm': dict(faults, load_seconds=0.2)})}' > /etc/gpufleet-sim/faults.json")
    run = ansible(str(HERE / "start_vllm.yml"))
    if run.returncode:
        raise SystemExit(f"could not start the engine:\n{run.stdout[-3000:]}")
    node("systemd-run --unit=gpufleet-bench-persistenced python3 /opt/gpufleet-tests/helpers/gpu_holder.py --open /dev/nvidiactl "
         "--comm nvidia-persistenced > /dev/null; systemd-run --unit=gpufleet-bench-decoy python3 -c 'import time; time.sleep(1e6)' "
         "sglang python3 > /dev/null; sleep 0.5")


def leftovers() -> dict:
    probe = node("fuser /dev/nvidia[0-9]* 2>/dev/null | wc -w; "
                 "python3 -c 'import pynvml as n; n.nvmlInit(); print(sum(n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i), "
                 "version=n.nvmlMemory_v2).used > 512 << 20 for i in range(n.nvmlDeviceGetCount())))'; "
                 "systemctl is-active gpufleet-bench-persistenced gpufleet-bench-decoy vllm.service", check=False).stdout.split()
    return {"gpu_node_holders": int(probe[0]), "dirty_gpus": int(probe[1]), "protected_alive": probe[2] == "active",
            "decoy_alive": probe[3] == "active", "unit": probe[4]}


def run_recipe() -> float:
    started = time.monotonic()
    node(RECIPE, check=False)
    return time.monotonic() - started


def run_modules() -> float:
    """The three modules run directly on the node, one after the other: the work without Ansible's own costs."""
    calls = [("systemd_stop_hard", {"name": "vllm.service"}), ("gpu_holders_kill", {"outside_units": "kill"}), ("gpu_memory_assert", {"expected_count": 8})]
    script = " && ".join(
        f"python3 -m ansible_collections.gpufleet.serving.plugins.modules.{name} '{json.dumps({'ANSIBLE_MODULE_ARGS': args})}' > /dev/null"
        for name, args in calls)
    started = time.monotonic()
    run = node(f"cd / && export PYTHONPATH={lab.NODE_COLLECTION} && {script}", check=False)
    elapsed = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"modules failed: {run.stdout[-2000:]} {run.stderr[-2000:]}")
    return elapsed


def run_role() -> float:
    started = time.monotonic()
    run = ansible(str(REPO / "playbooks" / "gpu_cleanup.yml"), "-e", json.dumps({"gpu_teardown_measure_before": False, "gpu_teardown_units": ["vllm.service"]}))
    elapsed = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"gpu_cleanup.yml failed:\n{run.stdout[-3000:]}")
    return elapsed


def main() -> None:
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
        lab.up(1, 8)
    # the modules import ansible.module_utils, which Ansible ships inside each module run; give the node a copy
    import ansible

    subprocess.run(["podman", "cp", str(Path(ansible.__file__).parent), f"{lab.CONTAINER_PREFIX}{NODE}:{lab.NODE_COLLECTION}/ansible"], check=True)
    results = {}
    for behaviour, faults in BEHAVIOURS.items():
        samples = {"role": [], "modules": [], "recipe": []}
        left = {}
        for _rep in range(REPS):
            for tool, action in (("role", run_role), ("modules", run_modules), ("recipe", run_recipe)):
                prepare(faults)
                samples[tool].append(action())
                left[tool] = leftovers()
        results[behaviour] = {
            tool: {"median_s": round(statistics.median(values), 2), "min_s": round(min(values), 2), "max_s": round(max(values), 2),
                   "left_behind": left[tool]} for tool, values in samples.items()}
        results[behaviour]["ratio_role_to_recipe"] = round(statistics.median(samples["role"]) / statistics.median(samples["recipe"]), 3)
        results[behaviour]["ratio_modules_to_recipe"] = round(statistics.median(samples["modules"]) / statistics.median(samples["recipe"]), 3)
        print(behaviour, json.dumps(results[behaviour]), file=sys.stderr, flush=True)
    node("systemctl stop vllm.service 'gpufleet-bench-*'; echo '{}' > /etc/gpufleet-sim/faults.json", check=False)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
