"""The README's demo: a lab of 3 simulated GPU nodes serving vLLM, switched to SGLang by playbooks/switch_engine.yml.

First run: starts the lab (built once), makes every node serve vLLM, then switches the fleet to SGLang and prints the
report. Later runs reuse the running lab, where SGLang already serves, so the switch changes nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
import lab  # noqa: E402

PLAYBOOK = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.BUILD / "inventory.ini"), str(REPO / "playbooks" / "switch_engine.yml")]


def switch(target: str, quiet: bool) -> tuple[int, float]:
    started = time.monotonic()
    run = subprocess.run([*PLAYBOOK, "-e", f"target={target}"], cwd=REPO, capture_output=quiet, text=True, check=False)
    if quiet and run.returncode:
        print(run.stdout[-4000:], run.stderr[-2000:])
    return run.returncode, time.monotonic() - started


def main() -> int:
    lab.require_prerequisites()  # a missing tool is named, not a traceback
    fresh = lab.up(3, 8, reuse=True)
    if fresh:
        print("\n== the fleet starts out serving vLLM (switch_engine.yml -e target=vllm) ==")
        rc, seconds = switch("vllm", quiet=True)
        if rc:
            return rc
        print(f"   3 nodes serve vLLM ({seconds:.0f}s)")
    print("\n== switch_engine.yml -e target=sglang ==")
    rc, seconds = switch("sglang", quiet=False)
    print(f"\nswitch_engine.yml took {seconds:.0f}s; JSON report: {REPO / 'reports' / 'switch_engine.json'} (docs/reports.md)")
    print(f"the run as a picture (timeline, GPUs, summary; open it in a browser): {REPO / 'reports' / 'switch_engine.html'}")
    print(f"run `make demo` again: the lab is reused, SGLang already serves, and nothing changes. `{lab.down_command()}` removes it.")
    return rc


if __name__ == "__main__":
    sys.exit(main())
