"""Each module's DOCUMENTATION (in the YAML file beside it) agrees with its argument spec, as ansible-test's validate-modules
would check."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[4]

# every module with an argument spec of its own (the action plugins' stubs have none)
MODULES = sorted(path.stem for path in (REPO / "plugins" / "modules").glob("*.py") if "ARGUMENT_SPEC = " in path.read_text())
TYPE_NAMES = {"str": "str", "float": "float", "int": "int", "bool": "bool", "list": "list", "path": "path", "dict": "dict", "raw": "raw"}


def load(name: str):
    """A module's documentation with the options of the collection's own fragments merged in, as ansible-doc shows it."""
    module = importlib.import_module(f"ansible_collections.gpufleet.serving.plugins.modules.{name}")
    sidecar = yaml.safe_load((REPO / "plugins" / "modules" / f"{name}.yml").read_text())
    assert not hasattr(module, "DOCUMENTATION"), f"{name}: documented twice (the module and its YAML file)"
    doc = sidecar["DOCUMENTATION"]
    for fragment in doc.get("extends_documentation_fragment", []):
        if fragment.startswith("gpufleet.serving."):
            own = importlib.import_module(f"ansible_collections.gpufleet.serving.plugins.doc_fragments.{fragment.split('.')[-1]}")
            doc["options"] = dict(yaml.safe_load(own.ModuleDocFragment.DOCUMENTATION).get("options") or {}, **doc["options"])
    return module, doc, yaml.safe_load(sidecar["EXAMPLES"]), sidecar["RETURN"]


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_match_the_argument_spec(name):
    module, doc, _examples, _returns = load(name)
    assert doc["module"] == name
    assert not doc["short_description"].endswith(".")
    assert set(doc["options"]) == set(module.ARGUMENT_SPEC)
    for option, spec in module.ARGUMENT_SPEC.items():
        documented = doc["options"][option]
        assert documented["type"] == TYPE_NAMES[spec["type"]], option
        assert documented.get("default") == spec.get("default"), option
        assert documented.get("required", False) == spec.get("required", False), option
        assert documented.get("choices") == spec.get("choices"), option
        assert documented.get("elements") == spec.get("elements"), option
        assert documented.get("description"), option
    assert doc["attributes"]["check_mode"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_fqcn_and_returns_are_described(name):
    _module, _doc, examples, returns = load(name)
    # every example calls the module by its full name (a task that only shows its result uses ansible.builtin's)
    assert any(f"gpufleet.serving.{name}" in task for task in examples)
    for task in examples:
        assert [key for key in task if "." in key and not key.startswith(("gpufleet.serving.", "ansible.builtin."))] == [], task["name"]
    for key, value in returns.items():
        assert value.get("description") and value.get("returned") and value.get("type"), key


def test_gpu_holders_kill_documents_every_builtin_protected_name():
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import PROTECTED_DAEMONS

    text = (REPO / "plugins" / "modules" / "gpu_holders_kill.yml").read_text()
    documented = text[text.index("Process names never signalled"):text.index("A name matches the executable")]
    assert [name for name in PROTECTED_DAEMONS if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", documented)] == []


def test_docs_list_every_builtin_protected_name_with_its_reason():
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import PROTECTED_DAEMONS

    text = (REPO / "docs" / "modules.md").read_text()
    rows = dict(re.findall(r"^  \| (\S+) \| (.+) \|$", text, re.MULTILINE))
    rows.pop("name", None)
    assert rows == PROTECTED_DAEMONS
