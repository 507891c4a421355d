"""Runs at boot on a lab node (gpufleet-sim-gpus.service): simulated GPU device files and NVML state.

Reads /etc/gpufleet-sim/node.json ({"gpus": N, "minors": [...]}) written by tests/sim/lab.py.
With --reset, also forgets every simulated allocation (memory goes back to idle).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvml_sim  # noqa: E402

CONFIG = Path("/etc/gpufleet-sim/node.json")
DEV = Path("/dev")
NVML_ROOT = Path("/run/gpufleet-sim/nvml")
READY = Path("/run/gpufleet-sim/ready")
# the engines' signal witnesses write here (tests/sim/signal_witness.py); each engine runs as a user of its own
WITNESS_DIR = Path("/run/gpufleet-sim/signals")


def main(argv: list[str]) -> None:
    config = json.loads(CONFIG.read_text())
    minors = config["minors"]
    (DEV / "nvidia-caps").mkdir(exist_ok=True)
    names = [f"nvidia{minor}" for minor in minors] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                                      "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"]
    for name in names:
        node = DEV / name
        if not node.exists():
            node.write_bytes(b"\0" * 4096)  # regular stand-in: the per-GPU ones are recognised by name
            node.chmod(0o666)
    sim = nvml_sim.SimNvml(NVML_ROOT, gpus=nvml_sim.default_gpus(config["gpus"], minors))
    WITNESS_DIR.mkdir(parents=True, exist_ok=True)
    WITNESS_DIR.chmod(0o1777)
    if "--reset" in argv:
        sim.release_all()
    READY.write_text("ready\n")


if __name__ == "__main__":
    main(sys.argv[1:])
