"""The node's paths and its lease name live in one place (module_utils/_paths.py): the modules' defaults, the planner and
the roles' tasks and templates read them there (the roles through the node_path filter)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.filter.node import node_path
from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths

REPO = Path(__file__).resolve().parents[4]
NODE_PATH = re.compile(r"/(?:var/lib|run|var/log)/gpufleet-serving\b")


def test_the_filter_gives_the_paths_the_modules_use_and_names_the_known_ones_when_asked_another():
    assert node_path("park_hold_dir") == "/run/gpufleet-serving/parked" == paths.PARK_HOLD_DIR
    assert node_path("lease_name") == "switch_engine"
    with pytest.raises(AnsibleFilterError, match=r"'parked_dir' is not one of answers_dir, last_cutover, lease_name"):
        node_path("parked_dir")


def test_no_python_file_nor_role_task_or_template_spells_a_node_path_of_its_own():
    """Public defaults (a role's defaults and argument specs, a module's documented default) state the value; the code
    that acts on a path reads it from _paths."""
    code = [path for path in (REPO / "plugins").rglob("*.py") if path.name != "_paths.py" and "doc_fragments" not in path.parts]
    code += [path for pattern in ("roles/*/tasks/*.yml", "roles/*/templates/*", "roles/*/vars/*.yml", "playbooks/*.yml")
             for path in REPO.glob(pattern)]
    spelled = [f"{path.relative_to(REPO)}:{number}" for path in code
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if NODE_PATH.search(line)]
    assert spelled == []
