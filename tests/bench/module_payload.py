"""What each module sends to a node: its AnsiballZ payload as ansible-core builds it (the same recursive finder, the
same zip), with the collection's module_utils in it counted by files and lines.

    python tests/bench/module_payload.py [MODULE ...]        (default: every module of the collection)

A module's payload is built on the controller for every run of it (cached per module and process) and sent to every
node: what it imports is what a maintainer pays for in the cleanup's and the switch's controller time.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO / "collections"
PREFIX = "ansible_collections/gpufleet/serving/plugins/module_utils/"


def payload(module: str) -> dict:
    # ansible-core's own finder (private to it: the figures are what a run really sends, or nothing)
    from ansible._internal._ansiballz import _builder
    from ansible.executor import module_common

    source = (REPO / "plugins" / "modules" / f"{module}.py").read_bytes()
    built = io.BytesIO()
    with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as archive:
        module_common.recursive_finder(module, f"ansible_collections.gpufleet.serving.plugins.modules.{module}", source, archive,
                                       datetime.datetime(2026, 1, 1), _builder.ExtensionManager())
    archive = zipfile.ZipFile(io.BytesIO(built.getvalue()))
    ours = sorted(name for name in archive.namelist() if name.startswith(PREFIX) and name.endswith(".py") and not name.endswith("__init__.py"))
    return {"module": module, "zip_files": len(archive.namelist()), "zip_bytes": len(built.getvalue()),
            "module_utils_files": len(ours), "module_utils_lines": sum(archive.read(name).count(b"\n") for name in ours),
            "module_utils": [name[len(PREFIX):] for name in ours]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module", nargs="*", help="default: every module")
    parser.add_argument("--json", action="store_true", help="one JSON object per module, with the module_utils it sends")
    args = parser.parse_args(argv)
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([str(COLLECTIONS)])
    modules = args.module or sorted(path.stem for path in (REPO / "plugins" / "modules").glob("*.py") if path.stem != "__init__")
    for module in modules:
        found = payload(module)
        if args.json:
            print(json.dumps(found))
        else:
            print(f"{module:20} {found['module_utils_files']:3} module_utils files, {found['module_utils_lines']:5} lines; "
                  f"zip {found['zip_files']} files, {found['zip_bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
