"""Fleet scaling on the lab: gpu_cleanup.yml and switch_engine.yml over 1, 5, 10 and 20 nodes (forks 20).

For each size the lab is restarted with that many nodes. Measured: wall time of each playbook, time per node, the
controller's peak memory (GNU time's maximum resident set of ansible-playbook or its largest fork).
SSH pipelining is measured on and off for gpu_cleanup.yml (ControlPersist is Ansible's default).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "sim"))
import lab  # noqa: E402

SIZES = [int(size) for size in sys.argv[1:]] or [1, 5, 10, 20]
PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def timed_playbook(playbook: str, *extra: str) -> dict:
    started = time.monotonic()
    run = subprocess.run(["/usr/bin/time", "-v", PLAYBOOK, "-f", "20", "-i", str(lab.BUILD / "inventory.ini"), str(REPO / "playbooks" / playbook), *extra],
                         capture_output=True, text=True, cwd=REPO, check=False)
    wall = time.monotonic() - started
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    return {"wall_s": round(wall, 2), "ok": run.returncode == 0, "controller_peak_mib": round(int(peak.group(1)) / 1024, 1) if peak else None}


def main() -> None:
    results = []
    for size in SIZES:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result
            lab.up(size, 8)
        row = {"nodes": size}
        row["cleanup_pipelining_off"] = timed_playbook("gpu_cleanup.yml", "-e", "ansible_pipelining=false")
        row["cleanup"] = timed_playbook("gpu_cleanup.yml")
        row["switch_to_vllm"] = timed_playbook("switch_engine.yml", "-e", "target=vllm")  # default batches: [1, "25%"]
        row["switch_to_sglang"] = timed_playbook("switch_engine.yml", "-e", "target=sglang")
        for key in ("cleanup", "switch_to_sglang"):
            row[key]["per_node_s"] = round(row[key]["wall_s"] / size, 2)
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    with contextlib.redirect_stdout(sys.stderr):
        lab.down()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
