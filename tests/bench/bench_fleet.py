"""Fleet scaling on up to hundreds of lab nodes: what each node costs the controller.

    python tests/bench/bench_fleet.py [--nodes 1,10,50,100] [--forks 5,25,100] [--keep-lab] [--out FILE]

One lab of the largest size is started (its own: GPUFLEET_LAB=fleet, SSH ports from 3001); each size runs against an
inventory of that many of its nodes. For each size, forks 25 and SSH pipelining on:

- switch_engine.yml --check (the plan), then the rolling switch (batches 1, 10 %) to vLLM (--parts switch-back: and
  back to SGLang),
- gpu_cleanup.yml with the switch's engine serving on every node (each stopped), then again with nothing left to stop
  (the cost is then all ours).

At the largest size, gpu_cleanup.yml and --check also run with every forks value and with pipelining off. Measured per
run: wall time, the controller's CPU seconds (ansible-playbook and everything it started - forks, ssh - from
getrusage), those per node, and the controller's peak memory: the largest single process (ru_maxrss) and the peak sum
of the whole process tree's proportional set size (PSS, sampled every second; forks share pages with their parent).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("GPUFLEET_LAB", "fleet")
os.environ.setdefault("GPUFLEET_LAB_PORT", "3001")
sys.path.insert(0, str(REPO / "tests" / "sim"))
import lab  # noqa: E402
import psutil  # noqa: E402

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
DEFAULT_FORKS = 25


def inventory_of(size: int) -> Path:
    """The lab's inventory cut to its first size nodes (the group's variables kept)."""
    lines = (lab.BUILD / "inventory.ini").read_text().splitlines()
    kept, in_nodes, count = [], False, 0
    for line in lines:
        if line.startswith("["):
            in_nodes = line == "[gpu_nodes]"
        elif in_nodes and line.strip():
            count += 1
            if count > size:
                continue
        kept.append(line)
    path = lab.BUILD / f"inventory-{size}.ini"
    path.write_text("\n".join(kept) + "\n")
    return path


class TreeMemory(threading.Thread):
    """The peak, over the run, of the summed PSS of a process and its descendants."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root, self.peak, self.done = psutil.Process(pid), 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            total = 0
            with contextlib.suppress(psutil.Error):
                for process in [self.root, *self.root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += process.memory_full_info().pss
            self.peak = max(self.peak, total)


def mitogen_env() -> dict:
    """Mitogen's strategy (PyPI mitogen), where it is installed: its linear strategy, one persistent interpreter per node."""
    try:
        import ansible_mitogen
    except ImportError:
        return {}
    return {"ANSIBLE_STRATEGY_PLUGINS": str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"), "ANSIBLE_STRATEGY": "mitogen_linear",
            # Mitogen's own SSH client does not read ansible_ssh_common_args' StrictHostKeyChecking
            "ANSIBLE_HOST_KEY_CHECKING": "False"}


def timed_playbook(size: int, playbook: str, *extra: str, forks: int = DEFAULT_FORKS, pipelining: bool = True, mitogen: bool = False) -> dict:
    path = HERE / playbook if (HERE / playbook).exists() else REPO / "playbooks" / playbook
    argv = [PLAYBOOK, "-f", str(forks), "-i", str(inventory_of(size)), str(path),
            "-e", f"ansible_pipelining={str(pipelining).lower()}", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(lab.BUILD / "last-run.log", "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=lab.BUILD,
                                   env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), **(mitogen_env() if mitogen else {})})
        memory = TreeMemory(process.pid)
        memory.start()
        process.wait()
        memory.done.set()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    row = {"playbook": playbook, "nodes": size, "forks": forks, "pipelining": pipelining, "mitogen": mitogen, "args": list(extra),
           "ok": process.returncode == 0,
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_per_node_s": round(cpu / size, 3), "wall_per_node_s": round(wall / size, 3),
           # ru_maxrss of children: the largest process that ever ended, in KiB
           "largest_process_mib": round(after.ru_maxrss / 1024, 1), "tree_pss_mib": round(memory.peak / 2**20, 1)}
    if not row["ok"]:
        row["log_tail"] = (lab.BUILD / "last-run.log").read_text()[-2000:]
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def measure(sizes: list[int], forks: list[int], parts: set[str]) -> list[dict]:
    rows: list[dict] = []
    largest = max(sizes)
    for size in sizes:
        if "check" in parts:
            rows.append(timed_playbook(size, "switch_engine.yml", "-e", "target=vllm", "--check"))
        if "switch" in parts:
            for target in ("vllm", "sglang")[:2 if "switch-back" in parts else 1]:
                rows.append(timed_playbook(size, "switch_engine.yml", "-e", f"target={target}", "-e", "switch_engine_serial=1,10%"))
        if "cleanup" in parts:
            rows.append(dict(timed_playbook(size, "gpu_cleanup.yml"), engines_stopped="switch" in parts))
            rows.append(timed_playbook(size, "gpu_cleanup.yml"))
    if "floor" in parts:  # Ansible's own cost of a task per node: ten set_fact tasks, ten ping tasks (ten skipped each)
        for floor in ("set_fact", "ping"):
            rows.append(timed_playbook(largest, "task_floor.yml", "-e", f"floor={floor}"))
    if "variants" in parts:
        for count in forks:
            if count != DEFAULT_FORKS:
                rows.append(timed_playbook(largest, "gpu_cleanup.yml", forks=count))
                rows.append(timed_playbook(largest, "switch_engine.yml", "-e", "target=sglang", "--check", forks=count))
        rows.append(timed_playbook(largest, "gpu_cleanup.yml", pipelining=False))
        if mitogen_env():
            for size in sorted({min(sizes, key=lambda n: abs(n - 10)), largest}):
                rows.append(timed_playbook(size, "gpu_cleanup.yml", mitogen=True))
                rows.append(timed_playbook(size, "switch_engine.yml", "-e", "target=sglang", "--check", mitogen=True))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1,10,50,100", help="fleet sizes, comma-separated")
    parser.add_argument("--forks", default="5,25,100", help="forks tried at the largest size")
    parser.add_argument("--keep-lab", action="store_true", help="leave the lab running (and reuse one of the right size)")
    parser.add_argument("--parts", default="check,switch,cleanup,floor,variants",
                        help="check, switch (to vLLM; switch-back: then to SGLang), cleanup, floor (Ansible's cost of a task), "
                        "variants (forks, pipelining off, Mitogen)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "results" / "fleet_scale.json")
    args = parser.parse_args()
    sizes = sorted({int(size) for size in args.nodes.split(",")})
    forks = [int(count) for count in args.forks.split(",")]
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
        lab.up(max(sizes), 8, reuse=args.keep_lab)
    started = time.monotonic()
    try:
        rows = measure(sizes, forks, set(args.parts.split(",")))
    finally:
        if not args.keep_lab:
            with contextlib.redirect_stdout(sys.stderr):
                lab.down()
    result = {"date": time.strftime("%Y-%m-%d"), "cpu_count": os.cpu_count(), "minutes": round((time.monotonic() - started) / 60, 1), "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
