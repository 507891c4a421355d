"""docs/testing.md maps every case of the reliability catalogue to the tests that cover it (tests/tools/catalogue_map.py)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "tools"))

import catalogue_map  # noqa: E402


def test_the_map_in_the_docs_is_the_generated_one():
    assert catalogue_map.section() in catalogue_map.DOC.read_text(), "run: python tests/tools/catalogue_map.py --write"


def test_every_case_is_covered_or_says_what_is_missing():
    text, covered = catalogue_map.build_map()
    assert covered >= 90
    assert "NO TEST AND NO REASON" not in text


def test_a_partial_case_has_tests_and_names_what_they_lack():
    references = catalogue_map.pytest_references(REPO / "tests")
    references.update(catalogue_map.molecule_references(REPO / "molecule"))
    assert sorted(set(catalogue_map.PARTIAL) - set(references)) == []
    assert all(len(lack) > 20 for lack in catalogue_map.PARTIAL.values())


def test_only_the_covers_marker_counts_not_a_mention(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "def test_mentions():\n    \"\"\"G12: reuse, as G33 / S37 did.\"\"\"\n\n"
        "@pytest.mark.covers('G5', 'M3')\ndef test_declares():\n    \"\"\"Protected names.\"\"\"\n")
    found = catalogue_map.pytest_references(tmp_path)
    assert sorted(found) == ["G5", "M3"] and all("test_declares" in place for places in found.values() for place in places)


def test_a_case_listed_as_not_covered_has_no_test():
    references = catalogue_map.pytest_references(REPO / "tests")
    references.update(catalogue_map.molecule_references(REPO / "molecule"))
    assert sorted(set(catalogue_map.NOT_COVERED) & set(references)) == []
    assert sorted(set(catalogue_map.NOT_COVERED) & set(catalogue_map.PARTIAL)) == []


def test_case_ids_are_read_from_lists_and_ranges():
    assert catalogue_map.cases_in("S24-S26, S33: refused units") == ["S24", "S25", "S26", "S33"]
    assert catalogue_map.cases_in("G9, G18 / F8: forked") == ["G9", "G18"]
    assert catalogue_map.cases_in("S28/S38: a fork loop") == ["S28", "S38"]
    assert catalogue_map.cases_in("E99 and GPU-0 and S7x") == []


def test_a_case_whose_every_test_skipped_is_named_and_fails_the_gate_run(tmp_path):
    """A case counts as covered by its markers only if its tests ran: with the tree guard on (make unit, make test), a
    case whose every test skipped fails the run and is named with the skip's reason; one test of it that ran is enough."""
    import os
    import subprocess

    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.covers('G8')\ndef test_needs_unshare():\n    pytest.skip('needs unshare')\n\n"
        "@pytest.mark.covers('G6')\ndef test_ran():\n    pass\n\n"
        "@pytest.mark.covers('G6')\ndef test_also_g6_but_skipped():\n    pytest.skip('needs fuse')\n")
    env = dict(os.environ, GPUFLEET_TREE_GUARD="1", PYTHONPATH=str(REPO / "tests"))
    env.pop("GPUFLEET_CATALOGUE_DIR", None)  # its sample outcomes are not this run's
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          str(tmp_path / "test_sample.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 1, run.stdout
    assert "CATALOGUE CASES NOT TESTED ON THIS MACHINE" in run.stdout
    assert "G8: test_sample.py::test_needs_unshare (skipped: Skipped: needs unshare)" in run.stdout
    assert "G6:" not in run.stdout, "one test of G6 ran"


def _write_run(directory: Path, pytest_outcomes: dict, molecule_lines: list[dict]) -> Path:
    import json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pytest-1.json").write_text(json.dumps(pytest_outcomes))
    (directory / "molecule.jsonl").write_text("".join(json.dumps(line) + "\n" for line in molecule_lines))
    return directory


def test_a_run_counts_a_case_only_when_every_test_declaring_it_ran_and_passed(tmp_path):
    """One weak test that ran does not hide a skipped real one: G8 with its unshare test skipped is not proven by the run,
    though its other tests passed; with every declared test (each parametrisation) passed, it is."""
    tests = catalogue_map.pytest_tests(REPO / "tests")["G8"]
    assert len(tests) >= 2
    skipped = {"G8": [[tests[0], "skipped: needs unshare"]] + [[test + "[x]", "passed"] for test in tests[1:]]}
    covered, missing = catalogue_map.run_map(_write_run(tmp_path / "skipped", skipped, []))
    assert "G8" not in covered and f"{tests[0]} skipped: needs unshare" in missing["G8"]
    passed = {"G8": [[test, "passed"] for test in tests]}
    covered, missing = catalogue_map.run_map(_write_run(tmp_path / "passed", passed, []))
    assert "G8" in covered and "G8" not in missing
    assert "S1" in missing and "did not run" in missing["S1"], "a case none of whose tests ran is not proven"


def test_a_molecule_task_counts_only_where_it_ran_and_passed(tmp_path):
    """S21 is declared by a pytest test and by Molecule tasks: each task must have passed on some host and failed on none."""
    tests = catalogue_map.pytest_tests(REPO / "tests")["S21"]
    tasks = catalogue_map.molecule_tasks(REPO / "molecule")["S21"]
    outcomes = {"S21": [[test, "passed"] for test in tests]}
    every = [{"cases": ["S21"], "task": name, "outcome": "passed"} for _path, name in tasks]
    covered, _missing = catalogue_map.run_map(_write_run(tmp_path / "all", outcomes, every))
    assert "S21" in covered
    _covered, missing = catalogue_map.run_map(_write_run(tmp_path / "one_missing", outcomes, every[1:]))
    assert f"{tasks[0][1]!r} did not run" in missing["S21"]
    failed = every[:-1] + [dict(every[-1], outcome="failed")]
    _covered, missing = catalogue_map.run_map(_write_run(tmp_path / "failed", outcomes, failed))
    assert "ended ['failed']" in missing["S21"]
    skipped = every[:-1] + [dict(every[-1], outcome="skipped")]
    _covered, missing = catalogue_map.run_map(_write_run(tmp_path / "skipped", outcomes, skipped))
    assert "skipped on every host" in missing["S21"]


def test_the_gate_fails_when_a_case_the_map_covers_was_not_proven(tmp_path, capsys):
    assert catalogue_map.check_run(_write_run(tmp_path / "empty", {}, [])) == 1
    assert "NOT PROVEN S1:" in capsys.readouterr().out


def test_a_task_named_for_a_range_proves_every_case_in_it(tmp_path):
    """The callback records the ids it sees ("S6-S13" gives S6 and S13); the map reads the task's name itself, so S7
    to S12 are proven by the same task (the gate run of stop 50 called them 'did not run')."""
    tasks = catalogue_map.molecule_tasks(REPO / "molecule")["S7"]
    ranged = [name for _path, name in tasks if "S6-S13" in name]
    assert ranged, tasks
    lines = [{"cases": ["S6", "S13"], "task": name, "outcome": "passed"} for _path, name in tasks]
    outcomes = {"S7": [[test, "passed"] for test in catalogue_map.pytest_tests(REPO / "tests").get("S7", [])]}
    covered, missing = catalogue_map.run_map(_write_run(tmp_path / "range", outcomes, lines))
    assert "S7" in covered, missing.get("S7")
