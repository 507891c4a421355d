"""Each role's README lists the variables of its argument specs, rendered from them (tests/tools/role_readmes.py)."""

from __future__ import annotations

import sys

import pytest
import yaml
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "tools"))
import role_readmes  # noqa: E402


@pytest.mark.parametrize("role", role_readmes.roles())
def test_role_readme_is_its_argument_specs(role):
    readme = REPO / "roles" / role / "README.md"
    assert readme.exists(), f"{readme} is missing: run python tests/tools/role_readmes.py"
    assert readme.read_text() == role_readmes.render(role), f"{readme} is out of date: run python tests/tools/role_readmes.py"
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for options in (spec.get("options") or {} for spec in specs.values()):
        for name in options:
            assert f"| `{name}` |" in readme.read_text(), name


def test_every_role_default_is_documented_in_its_argument_specs():
    """A variable in defaults/main.yml that the specs (and so the README) leave out is refused."""
    for role in role_readmes.roles():
        defaults = REPO / "roles" / role / "defaults" / "main.yml"
        if not defaults.exists():
            continue
        names = set(yaml.safe_load(defaults.read_text()) or {})
        specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        documented = {name for spec in specs.values() for name in (spec.get("options") or {})}
        assert names - documented == set(), f"{role}: defaults not in the argument specs"
