"""The mutation instrument (tests/tools/mutants.py): its sandbox holds, and its ledger says which files are due again."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
import warnings

import mutants
import pytest
from conftest import REPO, alive, wait_for


def sandboxed(script: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*mutants.SANDBOX, "sh", "-c", script], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def sandbox_available():
    if shutil.which("unshare") is None or sandboxed("true").returncode != 0:
        pytest.skip("needs unshare with PID and mount namespaces (root)")


def test_a_mutant_that_signals_every_process_it_sees_or_pid_1_harms_nothing_outside(sandbox_available):
    """What a mutant of the kill path can do at its worst - SIGKILL to PID 1 and to every process it may signal
    (kill(-1)), from the namespace's PID 1 and from a child of it - reaches its own run only: a process outside, and
    this test runner, live on; inside, the mutant's own sibling dies."""
    outside = subprocess.Popen(["sleep", "300"])
    try:
        done = sandboxed("sleep 300 & sibling=$!; python3 -c 'import os, signal; os.kill(-1, signal.SIGKILL)'; "
                         "kill -9 1; kill -9 -1; sleep 0.2; kill -0 $sibling 2>/dev/null && echo sibling-alive || echo sibling-dead")
        assert "sibling-dead" in done.stdout, done.stdout + done.stderr
        assert alive(outside.pid), "a process outside the sandbox was signalled"
    finally:
        outside.kill()
        outside.wait()


def test_a_sandboxed_run_past_its_bound_leaves_no_process_behind(sandbox_available):
    """A mutant that hangs its tests is stopped at its bound: the namespace's PID 1 dies with the sandbox, and the
    kernel kills every process in it - background children included."""
    marker = f"gpufleet-mutant-{uuid.uuid4().hex[:8]}"
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper = f"python3 -c 'import time; time.sleep(300)' {marker}"
        subprocess.run([*mutants.SANDBOX, "sh", "-c", f"{sleeper} & {sleeper} & wait"], timeout=1, check=False, capture_output=True)

    def gone() -> bool:
        return subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False).returncode == 1
    wait_for(gone, f"processes of a timed-out sandbox ({marker}) still run")


def test_the_ledger_names_the_files_due_again(tmp_path):
    """A file whose contents changed since its entry, or that has none, is due again; the current ones are named here."""
    source = tmp_path / "plugins" / "a.py"
    source.parent.mkdir()
    source.write_text("x = 1\n")
    scope = {"plugins/a.py": [], "plugins/b.py": []}
    (tmp_path / "plugins" / "b.py").write_text("y = 2\n")
    ledger = {"plugins/a.py": {"sha256": mutants.file_hash(source)}}
    assert mutants.stale(ledger, tmp_path, scope) == ["plugins/b.py"]
    source.write_text("x = 2\n")
    assert mutants.stale(ledger, tmp_path, scope) == ["plugins/a.py", "plugins/b.py"]

    due = mutants.stale(mutants.read_ledger())
    if due:
        warnings.warn(f"mutation ledger: due again (make mutants): {', '.join(due)}", stacklevel=1)
    assert set(due) <= set(mutants.SCOPE)


def test_every_file_of_the_scope_and_its_tests_exist_and_the_ledger_reads():
    for name, tests in mutants.SCOPE.items():
        assert (REPO / name).is_file(), name
        assert tests and all((REPO / test.split("::")[0]).is_file() for test in tests), (name, tests)
    for name, entry in mutants.read_ledger().items():
        assert name in mutants.SCOPE and entry["mutants"] == entry["killed"] + entry["timed_out"] + entry["survived"] + entry["incompetent"]
        assert all(json.dumps(survivor) for survivor in entry["survivors"])
    assert isinstance(mutants.accounted(), dict)


def test_a_mutant_inside_an_annotation_is_equivalent_only_where_annotations_are_never_evaluated(tmp_path):
    """`from __future__ import annotations`: `str | None` mutated to `str + None` changes nothing, so it is not run;
    without the import the annotation is evaluated at definition and the mutant is a real one."""
    body = "def f(x: str | None, n: int = 3) -> list[str]:\n    return [x] * (n | 1)\n"
    postponed, evaluated = tmp_path / "postponed.py", tmp_path / "evaluated.py"
    postponed.write_text("from __future__ import annotations\n\n" + body)
    evaluated.write_text(body)
    in_annotation = {"start_pos": [3, 13], "end_pos": [3, 14]}  # the `|` of `str | None`
    in_code = {"start_pos": [4, 20], "end_pos": [4, 21]}  # the `|` of `n | 1`
    assert postponed.read_text().splitlines()[2][13] == "|" and postponed.read_text().splitlines()[3][20] == "|"
    spans = mutants.annotation_spans(postponed)
    assert mutants.in_annotation(in_annotation, spans) and not mutants.in_annotation(in_code, spans)
    assert mutants.in_annotation({"start_pos": [3, 40], "end_pos": [3, 41]}, spans), "the return annotation"
    assert mutants.annotation_spans(evaluated) == []


def test_the_results_page_shows_the_ledger_as_it_is():
    """docs/results/mutation.md is written with the ledger (or by --page): never a figure the ledger does not hold."""
    page = (REPO / "docs" / "results" / "mutation.md").read_text(encoding="utf-8")
    assert page == mutants.PAGE_HEAD + mutants.table(mutants.read_ledger()), "docs/results/mutation.md: python tests/tools/mutants.py --page"


def test_each_workers_tests_run_in_its_own_tree_whatever_the_drivers_directory(tmp_path, sandbox_available):
    """The workers are threads of one process, which has one working directory: each mutant's command carries its
    tree, or one worker's tests would run against the other's mutant (this happened: mutants reported surviving)."""
    trees = {}
    for name in ("worker-0", "worker-1"):
        tree = tmp_path / name
        tree.mkdir()
        (tree / "test_where.py").write_text(f"import os\n\ndef test_here():\n    assert os.path.basename(os.getcwd()) == {name!r}\n")
        trees[name] = tree
    for name, tree in trees.items():
        other = trees["worker-1" if name == "worker-0" else "worker-0"]
        done = subprocess.run(shlex.split(mutants.test_command(tree, ["test_where.py"])), cwd=other, capture_output=True, text=True,
                              check=False, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_survivor_killed_by_a_new_test_moves_to_the_detected_when_the_survivors_run_again():
    entry = {"sha256": "x", "tests": [], "mutants": 10, "killed": 6, "timed_out": 1, "survived": 3, "incompetent": 0, "accounted": 0,
             "in_annotations": 2, "score": 0.7, "seconds": 100, "unmutated_tests_s": 1.0, "date": "2026-12-06", "survivors": [{}, {}, {}]}
    rerun = {"killed": 1, "timed_out": 1, "survived": 1, "accounted": 1, "seconds": 9, "date": "2026-12-07",
             "survivors": [{"operator": "core/AddNot", "occurrence": 0, "line": 3, "change": "x", "accounted": "equivalent - why"}]}
    merged = mutants.rechecked("plugins/module_utils/_node/lease.py", entry, rerun)
    assert (merged["killed"], merged["timed_out"], merged["survived"], merged["accounted"]) == (7, 2, 1, 1)
    assert merged["score"] == 1.0 and merged["seconds"] == 109 and merged["mutants"] == 10 and merged["in_annotations"] == 2
    assert merged["survivors"] == rerun["survivors"] and merged["date"] == "2026-12-07"


def test_survivors_accounted_for_are_kept_as_they_were_when_the_others_run_again():
    kept = [{"operator": "core/NumberReplacer", "occurrence": 4, "line": 9, "change": "y", "accounted": "equivalent - why"}]
    entry = {"sha256": "x", "tests": [], "mutants": 10, "killed": 6, "timed_out": 0, "survived": 4, "incompetent": 0, "accounted": 1,
             "in_annotations": 0, "score": 0.667, "seconds": 100, "unmutated_tests_s": 1.0, "date": "2026-12-06", "survivors": [{}, {}, {}, {}]}
    rerun = {"killed": 2, "timed_out": 0, "survived": 1, "accounted": 0, "seconds": 9, "date": "2026-12-07",
             "survivors": [{"operator": "core/AddNot", "occurrence": 0, "line": 12, "change": "x", "accounted": None}]}
    merged = mutants.rechecked("plugins/module_utils/_node/lease.py", entry, rerun, kept)
    assert (merged["killed"], merged["survived"], merged["accounted"], merged["score"]) == (8, 2, 1, round(8 / 9, 3))
    assert merged["survivors"] == kept + rerun["survivors"], "in line order"


def test_every_accounted_survivor_is_one_the_ledger_still_lists():
    """A reason kept for a mutant that a test now detects would hide it if it ever survived again unnoticed."""
    ledger = mutants.read_ledger()
    due = set(mutants.stale(ledger))
    listed = {(name, survivor["operator"], survivor["occurrence"]) for name, entry in ledger.items() for survivor in entry["survivors"]}
    kept = [key for key in mutants.accounted() if key[0] not in due]
    assert [key for key in kept if key not in listed] == []


def test_a_mutants_host_locks_are_its_own(sandbox_available):
    """Host locks and leases live in /run/lock: inside the sandbox it is a tmpfs of its own namespace, so a lock a
    mutant takes (or leaves) is never this machine's."""
    probe = f"/run/lock/gpufleet-mutant-probe-{uuid.uuid4().hex[:8]}"
    done = sandboxed(f"{mutants.PRIVATE_LOCKS} && touch {probe} && test -e {probe} && echo inside")
    assert "inside" in done.stdout, done.stdout + done.stderr
    assert not os.path.exists(probe), "the probe reached the machine's /run/lock"


def test_a_pass_cut_short_goes_on_only_from_results_made_of_the_files_contents_as_they_are(tmp_path):
    progress = tmp_path / "in_progress.json"
    results = [{"operator": "core/AddNot", "occurrence": 0, "line": 3, "outcome": "killed", "change": "x", "seconds": 1.0}]
    mutants.save_progress("a.py", {"sha256": "abc", "mutants": 9, "seconds": 60, "unmutated_tests_s": 2.0, "results": results}, progress)
    assert mutants.resumable("a.py", mutants.read_progress(progress), "abc") == results
    assert mutants.resumable("a.py", mutants.read_progress(progress), "changed") == [], "made of other contents: run again"
    assert mutants.resumable("b.py", mutants.read_progress(progress), "abc") == []
    mutants.save_progress("a.py", None, progress)
    assert not progress.exists()


def test_the_page_shows_a_pass_in_progress():
    name = next(iter(mutants.SCOPE))
    going = {"sha256": "abc", "mutants": 9, "seconds": 120, "unmutated_tests_s": 2.0,
             "results": [{"operator": "o", "occurrence": n, "line": 1, "outcome": outcome, "change": None, "seconds": 1.0}
                         for n, outcome in enumerate(["killed", "killed", "survived", "timed_out"])]}
    row = next(line for line in mutants.table({}, {name: going}).splitlines() if name.removeprefix("plugins/module_utils/") in line)
    assert row.endswith("| 9 | 2 | 1 | 1 | - | 2.0 | 2.0 s | in progress: 4 of 9 |")
