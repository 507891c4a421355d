"""Run Molecule scenarios on simulated labs, in parallel lanes: `make molecule` (every one), `make test` (the gate's).

    python tests/tools/run_molecule.py [--lanes 2] [--first-lane 1] [SCENARIO ...]

Each lane gets its own lab (2 nodes; switch_traffic's 3, engine ports published), created afresh for each scenario
(GPUFLEET_LAB=laneN, SSH ports from 2221 + 100 * N, beside the default lab on 2221) and runs its scenarios one after
the other; the lanes run side by side. Most of a scenario's time is spent waiting on the nodes (engines loading and
draining, deadlines, SSH round trips), so two lanes on two cores take about half the time of one.
A scenario's log is build/molecule-<scenario>.log; a failed one prints its failing tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml
from tree_state import added_by_run, status

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "tests" / "sim" / "lab.py"
BIN = Path(sys.executable).parent
# Longest first, as CI measured them on 2 cores (2026-12-05, a machine about 4x slower than the one of the figures in
# docs/testing.md); scenarios not listed are placed by the same rule with this default.
EXPECTED_SECONDS = {"switch_faults": 2000, "switch_engine": 2050, "switch_traffic": 280, "switch_readme": 230, "teardown_units": 340,
                    "engine_install": 600, "engine_units": 125, "teardown_faults": 160, "real_vllm": 2400, "real_vllm_switch": 900,
                    "fleet_slices": 400, "switch_park": 600, "switch_metrics": 115, "switch_pivot": 455,
                    "chaos_short": 900}
# A scenario whose lab is not 2 nodes with nothing published: switch_traffic puts HAProxy in front of 3 nodes;
# chaos_short's fault campaign gives each of 3 nodes two faults; teardown_units' cases are each about one node's units;
# real_vllm and real_vllm_switch run vLLM's real CPU build on one node.
LAB_OPTIONS = {"switch_traffic": ["--nodes", "3", "--http-port", "{http_port}"], "chaos_short": ["--nodes", "3"],
               "teardown_units": ["--nodes", "1"], "fleet_slices": ["--nodes", "4"],
               "switch_park": ["--nodes", "1"], "switch_pivot": ["--nodes", "1"], "switch_metrics": ["--nodes", "1", "--metrics-port", "{metrics_port}"],
               "real_vllm": ["--nodes", "1", "--real-vllm"], "real_vllm_switch": ["--nodes", "1", "--real-vllm"]}
DEFAULT_SECONDS = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def scenarios() -> list[str]:
    return sorted(path.parent.name for path in (REPO / "molecule").glob("*/molecule.yml"))


def steps(name: str) -> list[str]:
    """The scenario's test sequence but its cleanup: the lab is removed right after, and cleanup exists for a lab kept
    and reused by hand (`molecule test -s NAME` on `make lab-up`'s lab runs it)."""
    base = yaml.safe_load((REPO / ".config" / "molecule" / "config.yml").read_text())
    own = yaml.safe_load((REPO / "molecule" / name / "molecule.yml").read_text()) or {}
    sequence = (own.get("scenario") or {}).get("test_sequence") or base["scenario"]["test_sequence"]
    return [step for step in sequence if step not in ("cleanup", "destroy")]


def plan_lanes(names: list[str], lanes: int) -> list[list[str]]:
    """Longest scenario first onto the lane with the least expected time."""
    plan: list[list[str]] = [[] for _lane in range(lanes)]
    load = [0] * lanes
    for name in sorted(names, key=lambda n: (-EXPECTED_SECONDS.get(n, DEFAULT_SECONDS), n)):
        lane = load.index(min(load))
        plan[lane].append(name)
        load[lane] += EXPECTED_SECONDS.get(name, DEFAULT_SECONDS)
    return [lane for lane in plan if lane]


def lab_env(lane: int) -> dict[str, str]:
    return {**os.environ, "GPUFLEET_LAB": f"lane{lane}", "GPUFLEET_LAB_PORT": str(2221 + 100 * lane),
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


# how much of a failed task's message the summary at the end repeats
MESSAGE_CHARS = 600


def failing_tasks(log: Path) -> str:
    lines = ANSI.sub("", log.read_text(errors="replace")).splitlines()
    shown: list[str] = []
    for index, line in enumerate(lines):
        if re.search(r"fatal:|ERROR|Traceback", line):
            shown += [text[:300] for text in lines[max(0, index - 3):index + 25]] + ["..."]
    return "\n".join(shown[:150])


def failed_tasks(log: Path) -> list[tuple[str, str]]:
    """Each failed task's name and the start of what it said: the end of CI's output keeps them when its middle is cut."""
    task, found = "", {}
    lines = ANSI.sub("", log.read_text(errors="replace")).splitlines()
    for index, line in enumerate(lines):
        text = line.strip(" │")
        if text.startswith("TASK ["):
            task = text
        elif re.match(r"(fatal|failed):", text) and task and task not in found:
            said = [text.split("=>", 1)[-1].strip()]
            for following in lines[index + 1:index + 40]:
                following = following.strip(" │")
                if not following or following.startswith(("TASK [", "PLAY ", "...ignoring")):
                    break
                said.append(following)
            found[task] = " ".join(" ".join(said).split())[:MESSAGE_CHARS]
    return list(found.items())


def slowest_tasks(timings: Path, names: list[str], count: int = 4) -> list[str]:
    """Each scenario's slowest tasks of its own playbooks (the gpufleet_catalogue callback's timings.jsonl): where a
    gate over its time spent it."""
    if not timings.exists():
        return []
    rows = [json.loads(line) for line in timings.read_text(encoding="utf-8").splitlines() if line.strip()]
    shown = []
    for name in names:
        own = sorted((row for row in rows if row["scenario"] == name and row["playbook"].startswith(f"molecule/{name}/")),
                     key=lambda row: -row["seconds"])
        shown += [f"  {name}: {row['seconds']:.0f}s {row['playbook'].rsplit('/', 1)[-1]} | {row['task'][:100]}" for row in own[:count]]
    return shown


def run_lane(lane: int, names: list[str], results: dict[str, tuple[bool, float]], print_lock: threading.Lock) -> None:
    env = lab_env(lane)
    try:
        for name in names:
            started = time.monotonic()
            # a fresh lab for each scenario: one scenario's units and faults must not become the next one's state
            options = [word.format(http_port=18001 + 100 * lane, metrics_port=19101 + 100 * lane) for word in LAB_OPTIONS.get(name, ["--nodes", "2"])]
            up = subprocess.run([sys.executable, str(LAB), "up", "--gpus", "8", *options], env=env, capture_output=True, text=True, check=False)
            if up.returncode != 0:
                results[name] = (False, 0.0)
                with print_lock:
                    print(f"molecule {name}: FAILED, its lab did not start (lane {lane}):\n{up.stdout}{up.stderr}", flush=True)
                continue
            log = REPO / "build" / f"molecule-{name}.log"
            with log.open("w") as out:
                # reset: Molecule keeps state between runs (a stale "prepared" would skip prepare)
                passed = all(subprocess.run([str(BIN / "molecule"), step, "-s", name], cwd=REPO, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, check=False).returncode == 0 for step in ["reset", *steps(name)])
            seconds = time.monotonic() - started
            results[name] = (passed, seconds)
            with print_lock:
                if passed:
                    print(f"molecule {name}: passed in {seconds:.0f}s (lane {lane})", flush=True)
                else:
                    print(f"molecule {name}: FAILED in {seconds:.0f}s (lane {lane}, {log})\n{failing_tasks(log)}", flush=True)
    finally:
        subprocess.run([sys.executable, str(LAB), "down"], env=env, stdout=subprocess.DEVNULL, check=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--first-lane", type=int, default=1, help="number of the first lane (labs laneN), to run beside another run's lanes")
    parser.add_argument("scenario", nargs="*", help="default: every scenario under molecule/")
    args = parser.parse_args(argv)
    known = scenarios()
    unknown = sorted(set(args.scenario) - set(known))
    if unknown:
        parser.error(f"no such scenario: {', '.join(unknown)} (known: {', '.join(known)})")
    if not 1 <= args.lanes <= 4:
        parser.error("--lanes must be 1-4")
    if not 1 <= args.first_lane <= 8:
        parser.error("--first-lane must be 1-8")
    (REPO / "build").mkdir(exist_ok=True)
    (REPO / "build" / "catalogue" / "timings.jsonl").unlink(missing_ok=True)  # this run's timings only
    # the node image is built once, before the lanes start their labs
    subprocess.run([sys.executable, str(LAB), "image"], check=True, stdout=subprocess.DEVNULL)
    plan = plan_lanes(args.scenario or known, args.lanes)
    results: dict[str, tuple[bool, float]] = {}
    tree_before = status()
    print_lock = threading.Lock()
    started = time.monotonic()
    threads = [threading.Thread(target=run_lane, args=(lane, names, results, print_lock))
               for lane, names in enumerate(plan, start=args.first_lane)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    planned = [name for names in plan for name in names]
    failed = sorted(name for name in planned if not results.get(name, (False, 0.0))[0])
    print("molecule: the slowest tasks\n" + "\n".join(slowest_tasks(REPO / "build" / "catalogue" / "timings.jsonl", planned)))
    print(f"molecule: {len(planned) - len(failed)} of {len(planned)} scenario(s) passed in {time.monotonic() - started:.0f}s"
          f" ({len(plan)} lane(s)){': FAILED ' + ', '.join(failed) if failed else ''}")
    for name in failed:
        log = REPO / "build" / f"molecule-{name}.log"
        for task, said in failed_tasks(log) if log.exists() else [("its lab did not start", "")]:
            print(f"  {name}: {task}\n    {said}")
    # a scenario writes under build/ or its ephemeral directory, never into the tracked tree
    written = added_by_run(tree_before)
    if written:
        print("molecule: FAILED, the scenarios wrote into the working tree (write under build/ instead):\n  " + "\n  ".join(written))
    return 1 if failed or written else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
