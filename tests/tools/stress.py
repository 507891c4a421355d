"""Hunt flaky tests: the unit and functional suites run ROUNDS times under a bounded CPU load on every core (`make stress`).

    python tests/tools/stress.py [--rounds 10] [--load 75] [--workers N] [PYTEST_PATH ...] [-- PYTEST_ARGS]

The load is one busy process per core (default: as many as the machine has), each busy --load percent of every
100 ms and asleep the rest; they start before the first round and die with this script (PR_SET_PDEATHSIG as well,
should it be killed). Every test that failed at least once is reported with how often and its first message line;
the figures go to build/stress/summary.json. A flake is fixed at its cause (wait for the event or poll to a deadline),
never by rerunning the test: this tool only finds them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "build" / "stress"
DEFAULT_PATHS = ["tests/unit", "tests/functional"]
PERIOD = 0.1
PR_SET_PDEATHSIG = 1

BUSY_LOOP = f"""
import sys, time
busy = float(sys.argv[1]) * {PERIOD}
while True:
    until = time.monotonic() + busy
    while time.monotonic() < until:
        pass
    time.sleep({PERIOD} - busy)
"""


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_load(workers: int, percent: int) -> list[subprocess.Popen]:
    if percent <= 0:
        return []
    share = "0.999" if percent >= 100 else f"{percent / 100:.3f}"
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, share], preexec_fn=_die_with_parent) for _worker in range(workers)]


def stop_load(load: list[subprocess.Popen]) -> None:
    for proc in load:
        proc.kill()
    for proc in load:
        proc.wait(timeout=10)


def failures(junit: Path) -> tuple[int, dict[str, str]]:
    """(tests run, {test id: first line of its failure}) from one round's JUnit XML."""
    root = ElementTree.parse(junit).getroot()
    ran, failed = 0, {}
    for case in root.iter("testcase"):
        ran += 1
        for outcome in ("failure", "error"):
            element = case.find(outcome)
            if element is not None:
                name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                message = (element.get("message") or outcome).strip() or outcome
                failed[name] = message.splitlines()[0][:200]
    return ran, failed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--load", type=int, default=75, help="percent of each core every load worker keeps busy (0-100)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="load workers (default: one per core)")
    parser.add_argument("--round-timeout", type=float, default=1800, help="seconds one round may take before it counts as hung")
    parser.add_argument("paths", nargs="*", default=DEFAULT_PATHS)
    args, pytest_args = parser.parse_known_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 0 <= args.load <= 100:
        parser.error("--load must be 0-100 (percent of a core)")
    if args.workers < 0:
        parser.error("--workers must not be negative")
    OUT.mkdir(parents=True, exist_ok=True)
    load_line = f"{args.workers} load worker(s) at {args.load} % of a core each, on {os.cpu_count()} core(s)"
    print(f"stress: {args.rounds} round(s) of pytest {' '.join(args.paths)} under {load_line}", flush=True)

    failed_counts: Counter[str] = Counter()
    first_message: dict[str, str] = {}
    rounds: list[dict] = []
    load = start_load(args.workers, args.load)
    try:
        for number in range(1, args.rounds + 1):
            junit = OUT / f"round-{number}.xml"
            junit.unlink(missing_ok=True)
            started = time.monotonic()
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args.paths, *pytest_args]
            try:
                proc = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=args.round_timeout, check=False)
                hung = False
            except subprocess.TimeoutExpired:
                proc, hung = None, True
            seconds = time.monotonic() - started
            ran, failed = failures(junit) if junit.exists() else (0, {})
            if hung:
                failed["(round)"] = f"hung: not finished within --round-timeout={args.round_timeout:g} s"
            elif not junit.exists():
                failed["(round)"] = f"pytest wrote no report (rc {proc.returncode}): {proc.stdout[-500:]}"
            for name, message in failed.items():
                failed_counts[name] += 1
                first_message.setdefault(name, message)
            rounds.append({"round": number, "seconds": round(seconds, 1), "tests": ran, "failed": sorted(failed)})
            print(f"stress: round {number}/{args.rounds}: {ran} tests, {len(failed)} failed, {seconds:.0f} s"
                  + "".join(f"\n  FAILED {name}: {failed[name]}" for name in sorted(failed)), flush=True)
    finally:
        stop_load(load)

    summary = {"rounds": args.rounds, "load_percent": args.load, "load_workers": args.workers, "cores": os.cpu_count(),
               "paths": args.paths, "per_round": rounds, "seconds_total": round(sum(r["seconds"] for r in rounds), 1),
               "failed_at_least_once": {name: {"times": failed_counts[name], "first_message": first_message[name]}
                                        for name in sorted(failed_counts)}}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    seconds = [r["seconds"] for r in rounds]
    print(f"stress: {args.rounds} round(s), {sum(r['tests'] for r in rounds)} test runs, {len(failed_counts)} test(s) failed at least once;"
          f" round {min(seconds):.0f}-{max(seconds):.0f} s under {load_line} ({OUT / 'summary.json'})")
    for name in sorted(failed_counts, key=lambda n: (-failed_counts[n], n)):
        print(f"  {failed_counts[name]}/{args.rounds} {name}: {first_message[name]}")
    return 1 if failed_counts else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
