"""Two or more trees of the collection measured back to back on one lab: a node's switch, alternating tree by tree.

    python tests/bench/bench_switch_trees.py --inventory build/lab/inventory.ini --runs 4 OLD_TREE NEW_TREE

Each tree is a checkout with its collections/ link (`make setup` makes it). For each run and each tree in turn: node1
switched to the other engine (whole switch: the report's durations_s.total, lease to release; its downtime_s,
engine_start_s, overhead_s; the playbook's wall time), then an unchanged rerun (its total and wall time). The trees
alternate within every run (in the reverse order every other run, so that each switches to each engine as often), so
that the machine's drift hits them alike. Prints JSON: medians per tree, and each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
KEYS = ("switch_s", "downtime_s", "engine_start_s", "overhead_s", "wall_s", "unchanged_s", "unchanged_wall_s")


def switch(tree: Path, inventory: str, target: str, reports: Path) -> tuple[dict, float]:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(tree / "collections"), "ANSIBLE_CONFIG": str(tree / "ansible.cfg")}
    started = time.monotonic()
    run = subprocess.run([PLAYBOOK, "-i", inventory, str(tree / "playbooks" / "switch_engine.yml"), "-l", "node1,localhost", "-e",
                          f"target={target}", "-e", f"switch_engine_report_dir={reports}"],
                         capture_output=True, text=True, cwd=tree, env=env, check=False)
    wall = round(time.monotonic() - started, 2)
    if run.returncode:
        raise SystemExit(f"{tree}: switch to {target} failed:\n{run.stdout[-3000:]}")
    return json.loads((reports / "switch_engine.json").read_text())["hosts"]["node1"], wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inventory", required=True, type=lambda path: str(Path(path).resolve()))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("trees", nargs="+", type=lambda path: Path(path).resolve())
    args = parser.parse_args()
    runs: dict = {str(tree): [] for tree in args.trees}
    target = "sglang"
    with tempfile.TemporaryDirectory() as reports:
        switch(args.trees[0], args.inventory, "vllm", Path(reports))
        for run in range(args.runs):
            # every other run in the reverse order: each tree switches to each engine as often
            for tree in args.trees if run % 2 == 0 else args.trees[::-1]:
                node, wall = switch(tree, args.inventory, target, Path(reports))
                again, again_wall = switch(tree, args.inventory, target, Path(reports))
                if node["result"] != "switched" or again["result"] != "unchanged":
                    raise SystemExit(f"{tree}: {node['result']}, then {again['result']}")
                record = {"switch_s": node["durations_s"]["total"], "downtime_s": node["downtime_s"], "engine_start_s": node.get("engine_start_s"),
                          "overhead_s": node.get("overhead_s"), "wall_s": wall, "unchanged_s": again["durations_s"]["total"],
                          "unchanged_wall_s": again_wall}
                runs[str(tree)].append(record)
                print(json.dumps({str(tree): record}), file=sys.stderr, flush=True)
                target = "vllm" if target == "sglang" else "sglang"
    medians = {tree: {key: round(statistics.median(r[key] for r in records), 2) for key in KEYS} for tree, records in runs.items()}
    print(json.dumps({"medians": medians, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
