"""docs/architecture.md's map held against the code: every module_utils file in one room, imports only from its own
room or a lower one, none importing Ansible's module machinery or the controller's code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PACKAGE = "ansible_collections.gpufleet.serving.plugins"


def rooms() -> list[tuple[str, list[str]]]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- rooms -->", 1)[1].split("<!-- /rooms -->", 1)[0]
    return [(name.strip(), files.split()) for name, files in re.findall(r"^- ([^:\n]+):(.*)$", block, re.MULTILINE)]


def imports(path: Path) -> set[str]:
    """The collection's modules this file imports: 'module_utils._x', 'plugin_utils._y', or other packages by name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == f"{PACKAGE}.module_utils":
                found |= {f"module_utils.{alias.name}" for alias in node.names}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module[len(PACKAGE) + 1:])
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_every_module_utils_file_is_in_exactly_one_room():
    listed = [name for _room, files in rooms() for name in files]
    present = sorted(path.stem for path in MODULE_UTILS.glob("_*.py"))
    assert sorted(listed) == present, "docs/architecture.md's rooms and plugins/module_utils differ"


def test_a_file_imports_only_from_its_own_room_or_a_lower_one():
    level = {name: index for index, (_room, files) in enumerate(rooms()) for name in files}
    names = {index: room for index, (room, _files) in enumerate(rooms())}
    upward = []
    for name, index in level.items():
        for imported in imports(MODULE_UTILS / f"{name}.py"):
            target = imported.removeprefix("module_utils.")
            if imported.startswith("module_utils.") and level[target] > index:
                upward.append(f"{name} ({names[index]}) imports {target} ({names[level[target]]})")
    assert upward == []


def test_module_utils_never_import_the_module_machinery_nor_the_controllers_code():
    offending = [f"{path.name}: {imported}" for path in sorted(MODULE_UTILS.glob("_*.py")) for imported in imports(path)
                 if imported.startswith(("plugin_utils", "ansible.module_utils.basic", "filter"))]
    assert offending == []
