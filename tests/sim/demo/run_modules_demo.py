"""Sets up 8 simulated GPUs on this machine and runs tests/sim/demo/modules.yml against them.

What it starts: an "engine" whose 8 workers hold one GPU each (one escaped into its own session, one ignores
SIGTERM, one is stopped), a worker that forked after allocating (NVML lists its dead parent), a decoy whose
command line says `python3 ... sglang` but holds nothing, and a protected daemon (nvidia-persistenced).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
import nvml_sim  # noqa: E402

HELPER = REPO / "tests" / "helpers" / "gpu_holder.py"


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))
    devices = work / "dev"
    devices.mkdir()
    minors = [3, 1, 0, 2, 7, 5, 4, 6]  # device minors permuted against NVML indexes, as on real hosts
    for name in [f"nvidia{m}" for m in range(8)] + ["nvidiactl", "nvidia-uvm"]:
        (devices / name).write_bytes(b"\0" * 4096)
    sim = nvml_sim.SimNvml(work / "nvml", gpus=nvml_sim.default_gpus(8, minors))
    env = {**os.environ, **sim.env, "LD_LIBRARY_PATH": str(nvml_sim.build_library(REPO / "build" / "sim").parent),
           "GPUFLEET_DEMO_DEVICES": str(devices)}
    started = []
    forked = []

    def holder(*args: str) -> list[int]:
        proc = subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        started.append(proc)
        return [int(pid) for pid in proc.stdout.readline().split()[1:]]

    try:
        for index, minor in enumerate(minors[:6]):
            flags = ["--ignore-term"] if index == 1 else []
            pid = holder("vllm-worker", "--open", str(devices / f"nvidia{minor}"), str(devices / "nvidiactl"),
                         "--sim-root", str(sim.root), "--alloc", f"{index}:60000", *flags)[0]
            if index == 2:
                os.kill(pid, signal.SIGSTOP)  # a stopped worker ignores SIGTERM until continued
        parent, child = holder("vllm-worker", "--open", str(devices / f"nvidia{minors[6]}"), "--fork-child",
                               "--sim-root", str(sim.root), "--alloc", "6:60000")
        forked.append(child)
        os.kill(parent, signal.SIGKILL)
        holder("--mmap", str(devices / f"nvidia{minors[7]}"), "--sim-root", str(sim.root), "--alloc", "7:60000")
        holder("--open", str(devices / "nvidiactl"), "--comm", "nvidia-persistenced")
        decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)", "sglang", "python3"], start_new_session=True)
        started.append(decoy)
        playbook = [str(Path(sys.executable).parent / "ansible-playbook"), str(HERE / "modules.yml")]
        result = subprocess.run(playbook, env=env, cwd=REPO, check=False).returncode
        print(f"decoy `python3 -c ... sglang python3` (pid {decoy.pid}) still running: {decoy.poll() is None}")
        return result
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        for pid in forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
