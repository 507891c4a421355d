"""Each module's DOCUMENTATION agrees with its argument spec, as ansible-test's validate-modules would check."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[4]

MODULES = ["systemd_stop_hard", "gpu_holders_kill", "gpu_memory_assert", "engine_ready", "engine_drain", "host_lease", "engine_preflight",
           "weights_prewarm"]
TYPE_NAMES = {"str": "str", "float": "float", "int": "int", "bool": "bool", "list": "list", "path": "path"}


def load(name: str):
    """A module's documentation with the options of the collection's own fragments merged in, as ansible-doc shows it."""
    module = importlib.import_module(f"ansible_collections.gpufleet.serving.plugins.modules.{name}")
    doc = yaml.safe_load(module.DOCUMENTATION)
    for fragment in doc.get("extends_documentation_fragment", []):
        if fragment.startswith("gpufleet.serving."):
            own = importlib.import_module(f"ansible_collections.gpufleet.serving.plugins.doc_fragments.{fragment.split('.')[-1]}")
            doc["options"] = dict(yaml.safe_load(own.ModuleDocFragment.DOCUMENTATION).get("options") or {}, **doc["options"])
    return module, doc, yaml.safe_load(module.EXAMPLES), yaml.safe_load(module.RETURN)


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
    for task in examples:
        assert f"gpufleet.serving.{name}" in task, task["name"]
    for key, value in returns.items():
        assert value.get("description") and value.get("returned") and value.get("type"), key


def test_gpu_holders_kill_documents_every_builtin_protected_name():
    from ansible_collections.gpufleet.serving.plugins.module_utils._holders import PROTECTED_DAEMONS

    text = (REPO / "plugins" / "modules" / "gpu_holders_kill.py").read_text()
    documented = text[text.index("Process names never signalled"):text.index("A name matches the executable")]
    assert [name for name in PROTECTED_DAEMONS if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", documented)] == []


def test_docs_list_every_builtin_protected_name_with_its_reason():
    from ansible_collections.gpufleet.serving.plugins.module_utils._holders import PROTECTED_DAEMONS

    text = (REPO / "docs" / "modules.md").read_text()
    rows = dict(re.findall(r"^  \| (\S+) \| (.+) \|$", text, re.MULTILINE))
    rows.pop("name", None)
    assert rows == PROTECTED_DAEMONS
