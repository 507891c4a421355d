"""docs/architecture.md's map held against the code: every module_utils file in one room (a package, or the flat ground
files), imports only from its own room or a lower one, none importing Ansible's module machinery or the controller's
code; the cleanup's module sends nothing of the switch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PACKAGE = "ansible_collections.gpufleet.serving.plugins"


def rooms() -> list[tuple[str, str, list[str]]]:
    """[(room, its package under module_utils or "" for the flat ground files, its files' stems)], lowest first."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("<!-- rooms -->", 1)[1].split("<!-- /rooms -->", 1)[0]
    found = re.findall(r"^- ([^:(\n]+?) \((?:plugins/module_utils/)?([^)]*)\):(.*)$", block, re.MULTILINE)
    return [(name.strip(), package.strip().strip("/").strip("."), files.split()) for name, package, files in found]


def dotted(package: str, stem: str) -> str:
    """A module_utils file's dotted name below module_utils: '_errors', '_gpus.holders'."""
    return f"{package}.{stem}" if package else stem


def imports(path: Path) -> set[str]:
    """The collection's modules this file imports: 'module_utils._x', 'module_utils._room.y', 'plugin_utils._y', or
    other packages by name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            room = node.module.startswith(f"{PACKAGE}.module_utils._") and (MODULE_UTILS / node.module.split(".")[-1]).is_dir()
            if node.module == f"{PACKAGE}.module_utils" or room:
                found |= {f"{node.module[len(PACKAGE) + 1:]}.{alias.name}" for alias in node.names}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module[len(PACKAGE) + 1:])
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def present() -> list[str]:
    return sorted(".".join(path.relative_to(MODULE_UTILS).with_suffix("").parts) for path in MODULE_UTILS.rglob("*.py")
                  if path.name != "__init__.py")


def test_every_module_utils_file_is_in_exactly_one_room_and_its_rooms_package():
    listed = [dotted(package, stem) for _room, package, files in rooms() for stem in files]
    assert sorted(listed) == present(), "docs/architecture.md's rooms and plugins/module_utils differ"


def test_only_the_ground_pieces_are_flat():
    assert [room for room, package, _files in rooms() if not package] == ["ground"]


def test_a_file_imports_only_from_its_own_room_or_a_lower_one():
    level = {dotted(package, stem): index for index, (_room, package, files) in enumerate(rooms()) for stem in files}
    names = {index: room for index, (room, _package, _files) in enumerate(rooms())}
    upward = []
    for name, index in level.items():
        for imported in imports(MODULE_UTILS.joinpath(*name.split(".")).with_suffix(".py")):
            target = imported.removeprefix("module_utils.")
            if imported.startswith("module_utils.") and level[target] > index:
                upward.append(f"{name} ({names[index]}) imports {target} ({names[level[target]]})")
    assert upward == []


def test_the_cleanup_sends_only_the_teardown_and_what_it_stands_on():
    """node_teardown's closure holds no file of the rooms above the teardown's (the switch's, the models', the
    engines' but the park record): the cleanup is no longer carried inside the switch."""
    level = {dotted(package, stem): index for index, (_room, package, files) in enumerate(rooms()) for stem in files}
    teardown = next(index for index, (room, _package, _files) in enumerate(rooms()) if room == "teardown")
    seen, todo = set(), [target.removeprefix("module_utils.") for target in imports(REPO / "plugins" / "modules" / "node_teardown.py")
                         if target.startswith("module_utils.")]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [target.removeprefix("module_utils.") for target in imports(MODULE_UTILS.joinpath(*name.split(".")).with_suffix(".py"))
                     if target.startswith("module_utils.")]
    assert sorted(name for name in seen if level[name] > teardown) == []
    assert not any(name.startswith(("_engines.", "_models.", "_switch.")) for name in seen), sorted(seen)


def test_module_utils_never_import_the_module_machinery_nor_the_controllers_code():
    offending = [f"{path.name}: {imported}" for path in sorted(MODULE_UTILS.rglob("*.py")) for imported in imports(path)
                 if imported.startswith(("plugin_utils", "ansible.module_utils.basic", "filter"))]
    assert offending == []
