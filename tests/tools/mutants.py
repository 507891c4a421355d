"""Mutation testing of the kill path: `make mutants [FILES=...]` (not part of the gate; docs/testing.md).

    python tests/tools/mutants.py [--workers 2] [--limit N] [FILE ...]   run the files due (or those named)
    python tests/tools/mutants.py --stale                                 list the files whose ledger entry is stale
    python tests/tools/mutants.py --survivors FILE ...                     run a file's survivors again (after new tests;
                                                                          those accounted for as equivalent stay as they are)
    python tests/tools/mutants.py --table                                 the ledger as docs/results/mutation.md shows it
    python tests/tools/mutants.py --page                                  write that page again from the ledger

The tool is cosmic-ray (PyPI): it mutates the source file on disk and runs a test command per mutant, so the
functional tests - which run the modules in processes of their own, as Ansible does - see each mutant; a tool that
switches mutants inside one Python process (mutmut 3's trampolines) would not reach them. Its own runner is not used:
this driver enumerates the mutants with `cosmic-ray init`, then applies each with cosmic-ray's mutate_and_test in a
throwaway copy of the tree per worker (two workers, one per core), runs only the tests that exercise the file
(fail-fast), and counts a run past its time bound as detected.

Sandbox: each mutant's tests run as PID 1's children in a PID and mount namespace of their own
(`unshare --pid --fork --mount-proc --kill-child`): a mutant that signals every process it can see, or PID 1, reaches
only its own run; when the run ends or times out, the namespace's PID 1 dies and the kernel kills everything in it.
tests/unit/lab/test_mutants.py proves it with `kill -9 -1` and `kill -9 1` beside a process outside.

The ledger (tests/mutation/ledger.json, committed) keeps per file: its sha256, mutants, killed, survived, timed out,
incompetent, seconds, and each survivor with its diff line. A survivor is accounted for in tests/mutation/accounted.yml
(file, operator, occurrence -> equivalent or not worth a test, one line why) or killed by a new test. A file whose hash
changed is due again.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
LEDGER = REPO / "tests" / "mutation" / "ledger.json"
ACCOUNTED = REPO / "tests" / "mutation" / "accounted.yml"
# a file's pass cut short (Ctrl-C, the end of a sitting): its results so far, at its hash; the next run goes on from them
IN_PROGRESS = REPO / "tests" / "mutation" / "in_progress.json"
SAVE_EVERY = 5  # mutants between two saves of a pass in progress
WORK = REPO / "build" / "mutants"
MODULE_UTILS = "plugins/module_utils"

# each file of the kill path and the tests that exercise it (the rest of the suite does not import it)
SCOPE: dict[str, list[str]] = {
    f"{MODULE_UTILS}/_processes/procfs.py": [
        "tests/unit/plugins/module_utils/test_procfs.py",
        "tests/unit/plugins/module_utils/test_pure_logic.py",
        "tests/unit/plugins/module_utils/test_signals.py",
        "tests/functional/test_gpu_holders_kill.py",
    ],
    f"{MODULE_UTILS}/_processes/signals.py": [
        "tests/unit/plugins/module_utils/test_signaller.py",
        "tests/unit/plugins/module_utils/test_signals.py",
        "tests/functional/test_gpu_holders_kill.py",
    ],
    f"{MODULE_UTILS}/_processes/journal.py": [
        "tests/unit/plugins/module_utils/test_journal.py",
        "tests/unit/plugins/module_utils/test_signals.py",
        "tests/functional/test_gpu_holders_kill.py::test_the_signals_processes_received_are_the_journal_and_the_plan",
        "tests/functional/test_gpu_holders_kill.py::test_a_journal_that_cannot_be_written_refuses_the_run_before_any_signal",
    ],
    f"{MODULE_UTILS}/_gpus/holders.py": [
        "tests/unit/plugins/module_utils/test_holders.py",
        "tests/unit/plugins/module_utils/test_pure_logic.py",
        "tests/functional/test_gpu_holders_kill.py",
    ],
    f"{MODULE_UTILS}/_gpus/holders_kill.py": [
        "tests/unit/plugins/module_utils/test_holders_kill.py",
        "tests/unit/plugins/module_utils/test_pure_logic.py",
        "tests/unit/plugins/module_utils/test_preflight.py",
        "tests/functional/test_gpu_holders_kill.py",
    ],
    f"{MODULE_UTILS}/_gpus/memory.py": [
        "tests/unit/plugins/module_utils/test_memory_judgement.py",
        "tests/unit/plugins/module_utils/test_pure_logic.py",
        "tests/functional/test_gpu_memory_assert.py",
    ],
    f"{MODULE_UTILS}/_systemd/stop.py": ["tests/unit/plugins/module_utils/test_stop_plan.py", "tests/unit/plugins/module_utils/test_systemd.py"],
    f"{MODULE_UTILS}/_systemd/cgroup.py": [
        "tests/unit/plugins/module_utils/test_cgroup_files.py",
        "tests/functional/test_cgroups.py",
        "tests/unit/plugins/module_utils/test_systemd.py",
    ],
    f"{MODULE_UTILS}/_systemd/systemctl.py": [
        "tests/unit/plugins/module_utils/test_systemctl.py",
        "tests/unit/plugins/module_utils/test_systemd.py",
        "tests/functional/test_gpu_holders_kill.py::test_a_holder_that_is_the_main_process_of_a_restarting_service_is_refused_by_what_systemctl_says",
    ],
    f"{MODULE_UTILS}/_node/lease.py": [
        "tests/unit/plugins/module_utils/test_lease.py",
        "tests/unit/plugins/module_utils/test_lease_and_engine_http.py",
        "tests/unit/plugins/module_utils/test_readiness.py",
    ],
    f"{MODULE_UTILS}/_teardown/node.py": ["tests/unit/plugins/module_utils/test_teardown_node.py", "tests/functional/test_node_teardown.py"],
    f"{MODULE_UTILS}/_teardown/options.py": ["tests/unit/plugins/module_utils/test_teardown_parts.py", "tests/functional/test_node_teardown.py"],
    f"{MODULE_UTILS}/_teardown/run.py": ["tests/unit/plugins/module_utils/test_teardown_run.py", "tests/functional/test_node_teardown.py"],
    f"{MODULE_UTILS}/_teardown/steps.py": [
        "tests/unit/plugins/module_utils/test_teardown_parts.py",
        "tests/functional/test_node_teardown.py",
        "tests/unit/plugins/module_utils/test_cutover.py",
    ],
}
# a run of a file's tests that takes this many times the unmutated run (and at least MIN_BOUND seconds) is a hang
BOUND_FACTOR, MIN_BOUND = 3.0, 60.0
SANDBOX = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
# the host locks and leases (/run/lock) of the sandbox's own, in its mount namespace: a mutant's lock is never this
# machine's, and a lock held outside never blocks a mutant
PRIVATE_LOCKS = "mount -t tmpfs gpufleet-mutant-locks /run/lock"


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_ledger(path: Path = LEDGER) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def stale(ledger: dict, root: Path = REPO, scope: tuple[str, ...] = tuple(SCOPE)) -> list[str]:
    """The files of the scope whose ledger entry is missing or was made from other contents: due again."""
    return [name for name in scope if (ledger.get(name) or {}).get("sha256") != file_hash(root / name)]


def accounted(path: Path = ACCOUNTED) -> dict[tuple[str, str, int], str]:
    """(file, operator, occurrence) -> why a survivor needs no test (equivalent, or not worth one)."""
    entries = yaml.safe_load(path.read_text()) if path.exists() else None
    return {(entry["file"], entry["operator"], int(entry["occurrence"])): entry["why"] for entry in entries or []}


def copy_tree(destination: Path) -> Path:
    """The tracked and untracked-but-not-ignored files in a throwaway directory: mutants never touch this checkout."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    packed = subprocess.run(["tar", "--null", "-cf", "-", "-T", "-"], cwd=REPO, input=names, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-xf", "-"], cwd=destination, input=packed, check=True)
    (destination / ".venv").symlink_to(REPO / ".venv")
    return destination


def test_command(tree: Path, tests: list[str]) -> str:
    """Fail-fast, quiet, in the sandbox, in the worker's own tree (the collection imported from it: conftest links it
    there). The directory is part of the command, never the driver's cwd - one for every worker thread. pytest runs
    under a shell that is the namespace's PID 1 - never PID 1 itself, as outside: tests read their own parent. Tests that
    need the host's PIDs (NVML's) cannot run in a PID namespace and are left out: unit tests cover that logic."""
    pytest_run = shlex.join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not host_pid_namespace", *tests])
    return shlex.join([*SANDBOX, "sh", "-c", f"{PRIVATE_LOCKS} && cd {shlex.quote(str(tree))} && {pytest_run}; exit $?"])


def mutations(tree: Path, name: str) -> list[dict]:
    """Every mutation cosmic-ray makes of the file: [{operator_name, occurrence, start_pos, ...}]."""
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "cr.toml"
        config.write_text(f'[cosmic-ray]\nmodule-path = "{tree / name}"\ntimeout = 60.0\nexcluded-modules = []\n'
                          'test-command = "true"\n\n[cosmic-ray.distributor]\nname = "local"\n')
        session = Path(scratch) / "session.sqlite"
        subprocess.run([str(Path(sys.executable).parent / "cosmic-ray"), "init", str(config), str(session)], check=True, capture_output=True)
        dump = subprocess.run([str(Path(sys.executable).parent / "cosmic-ray"), "dump", str(session)], check=True, capture_output=True, text=True)
    found = [json.loads(line)[0]["mutations"][0] for line in dump.stdout.splitlines() if line.strip()]
    return sorted(found, key=lambda item: (item["start_pos"], item["operator_name"], item["occurrence"]))


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the file's annotations are, when `from __future__ import annotations` keeps them from ever being
    evaluated: a mutant there cannot change behaviour (equivalent), so it is not run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    postponed = any(isinstance(node, ast.ImportFrom) and node.module == "__future__" and any(alias.name == "annotations" for alias in node.names)
                    for node in tree.body)
    if not postponed:
        return []
    annotations = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign) and not isinstance(node.target, ast.Attribute):
            annotations.append(node.annotation)
    return [((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)) for node in annotations]


def in_annotation(item: dict, spans) -> bool:
    start, end = tuple(item["start_pos"]), tuple(item["end_pos"])
    return any(first <= start and end <= last for first, last in spans)


def run_one(tree: Path, name: str, item: dict, tests: list[str], bound: float) -> dict:
    """One mutant in its worker's tree: applied by cosmic-ray, its tests run in the sandbox, the file restored."""
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_item import MutationSpec

    target = tree / name
    original = target.read_bytes()
    spec = MutationSpec(module_path=target, operator_name=item["operator_name"], occurrence=item["occurrence"],
                        start_pos=tuple(item["start_pos"]), end_pos=tuple(item["end_pos"]))
    started = time.monotonic()
    try:
        result = mutate_and_test([spec], test_command(tree, tests), bound)
    finally:
        target.write_bytes(original)  # whatever happened, the next mutant starts from the file as it is
    seconds = time.monotonic() - started
    outcome = str(result.test_outcome.value) if result.test_outcome else str(result.worker_outcome.value)
    if outcome == "killed" and (result.output or "") == "timeout":
        outcome = "timed_out"
    changed = [line for line in (result.diff or "").splitlines() if line.startswith("+") and not line.startswith("+++")]
    return {"operator": item["operator_name"], "occurrence": item["occurrence"], "line": item["start_pos"][0], "outcome": outcome,
            "change": changed[0][1:].strip() if changed else None, "seconds": round(seconds, 1)}


def baseline(tree: Path, tests: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run(shlex.split(test_command(tree, tests)), capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})  # as cosmic-ray runs them: no stale .pyc
    if done.returncode != 0:
        raise SystemExit(f"the unmutated tests fail in the sandbox ({' '.join(tests)}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started


def read_progress(path: Path = IN_PROGRESS) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def save_progress(name: str, progress: dict | None, path: Path = IN_PROGRESS) -> None:
    """Keep (or, with None, drop) a file's pass in progress."""
    every = read_progress(path)
    if progress is None:
        every.pop(name, None)
    else:
        every[name] = progress
    if every:
        path.write_text(json.dumps(dict(sorted(every.items())), indent=1) + "\n")
    else:
        path.unlink(missing_ok=True)


def resumable(name: str, progress: dict, digest: str) -> list[dict]:
    """The results a pass cut short left for this file, if they were made of its contents as they are now."""
    earlier = progress.get(name) or {}
    return list(earlier.get("results", [])) if earlier.get("sha256") == digest else []


def run_file(name: str, workers: int, limit: int | None, log, only: set[tuple[str, int]] | None = None, work: Path = WORK) -> dict:
    """Every mutant of one file (or ``only`` those (operator, occurrence)), `workers` at a time, each worker its own
    tree under `work`; its ledger entry. A whole pass saves its results as it goes (tests/mutation/in_progress.json)
    and, run again after it was cut short, goes on from them."""
    tests = SCOPE[name]
    whole_pass = only is None and limit is None
    digest = file_hash(REPO / name)
    progress = read_progress()
    done = resumable(name, progress, digest) if whole_pass else []
    earlier = progress.get(name, {}) if done else {}
    trees = [copy_tree(work / f"worker-{index}") for index in range(workers)]
    unmutated = baseline(trees[0], tests)
    bound = max(MIN_BOUND, BOUND_FACTOR * unmutated)
    spans = annotation_spans(REPO / name)
    every = mutations(trees[0], name)
    runnable = [item for item in every if not in_annotation(item, spans)]
    annotations = len(every) - len(runnable)
    finished = {(result["operator"], result["occurrence"]) for result in done}
    items = [item for item in runnable if (only is None or (item["operator_name"], item["occurrence"]) in only)
             and (item["operator_name"], item["occurrence"]) not in finished][:limit]
    log(f"{name}: {len(items)} mutants ({annotations} more in annotations, never evaluated: not run"
        + (f"; {len(done)} done in a pass cut short before" if done else "") + f"), the unmutated tests "
        f"{unmutated:.1f} s (bound {bound:.0f} s), {workers} workers")
    free = list(trees)
    results = list(done)
    started = time.monotonic() - earlier.get("seconds", 0)

    def save() -> None:
        if whole_pass:
            save_progress(name, {"sha256": digest, "mutants": len(runnable), "seconds": round(time.monotonic() - started),
                                 "unmutated_tests_s": round(unmutated, 1), "results": results})
            PAGE.write_text(PAGE_HEAD + table(read_ledger()))

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        def job(item: dict) -> dict:
            tree = free.pop()
            try:
                return run_one(tree, name, item, tests, bound)
            finally:
                free.append(tree)
        try:
            for index, outcome in enumerate(pool.map(job, items), 1):
                results.append(outcome)
                if outcome["outcome"] not in ("killed", "timed_out"):
                    log(f"  {index}/{len(items)} line {outcome['line']} {outcome['operator']} #{outcome['occurrence']}: {outcome['outcome']}"
                        f" ({outcome['change']})")
                if index % SAVE_EVERY == 0:
                    save()
        except BaseException:
            save()  # Ctrl-C or a stop: the next run goes on from here
            pool.shutdown(wait=False, cancel_futures=True)  # the mutants not begun are not run; those running end at their bound
            raise
    entry = dict(ledger_entry(name, results, time.monotonic() - started, unmutated, annotations), workers=workers)
    if whole_pass:
        save_progress(name, None)
    return entry


def rechecked(name: str, entry: dict, rerun: dict, kept: list[dict] = ()) -> dict:
    """The file's entry after its survivors ran again against today's tests: those now detected counted so. `kept`:
    survivors accounted for (equivalent, not worth a test) that were not run again - they stay survivors as they were."""
    survivors = rerun["survivors"] + list(kept)
    merged = dict(entry, survived=rerun["survived"] + len(kept), seconds=entry["seconds"] + rerun["seconds"], date=rerun["date"],
                  killed=entry["killed"] + rerun["killed"], timed_out=entry["timed_out"] + rerun["timed_out"],
                  survivors=sorted(survivors, key=lambda survivor: (survivor["line"], survivor["operator"], survivor["occurrence"])),
                  accounted=sum(1 for survivor in survivors if survivor["accounted"]), tests=SCOPE[name])
    assessed = merged["mutants"] - merged["incompetent"] - merged["accounted"]
    merged["score"] = round((merged["killed"] + merged["timed_out"]) / assessed, 3) if assessed else None
    return merged


def ledger_entry(name: str, results: list[dict], seconds: float, unmutated: float, annotations: int = 0) -> dict:
    counts = {outcome: sum(1 for result in results if result["outcome"] == outcome) for outcome in ("killed", "timed_out", "survived", "incompetent")}
    reasons = accounted()
    survivors = [dict(operator=result["operator"], occurrence=result["occurrence"], line=result["line"], change=result["change"],
                      accounted=reasons.get((name, result["operator"], result["occurrence"])))
                 for result in results if result["outcome"] == "survived"]
    equivalent = sum(1 for survivor in survivors if survivor["accounted"])
    detected = counts["killed"] + counts["timed_out"]
    assessed = len(results) - counts["incompetent"] - equivalent
    return {"sha256": file_hash(REPO / name), "tests": SCOPE[name], "mutants": len(results), **counts, "accounted": equivalent,
            "in_annotations": annotations,
            "score": round(detected / assessed, 3) if assessed else None, "seconds": round(seconds), "unmutated_tests_s": round(unmutated, 1),
            "date": time.strftime("%Y-%m-%d"), "survivors": survivors}


PAGE = REPO / "docs" / "results" / "mutation.md"
PAGE_HEAD = """# Mutation testing of the kill path: the ledger

`make mutants [FILES=...]` (docs/testing.md, "Breaking the kill path on purpose") lets cosmic-ray break each file of
the kill path one small change at a time and runs the file's own tests against each mutant, sandboxed in a PID and
mount namespace, two workers on 2 cores. The ledger, `tests/mutation/ledger.json`, keeps per file the figures below;
each survivor is either killed by a test since, or listed in `tests/mutation/accounted.yml` with one line why it is
equivalent or not worth a test. Score: mutants detected (killed, or their tests past their time bound) over mutants
assessed (all, less those that do not compile and those accounted for). Mutants inside annotations that are never
evaluated (`from __future__ import annotations`) are not run.

This page is written by `tests/tools/mutants.py` with the ledger, each time a file's run ends, and as a pass cut
short is kept (`tests/mutation/in_progress.json`, "in progress": the next run goes on from it); a test holds the page
to the ledger. "at" is the day of the file's run; `python tests/tools/mutants.py --stale` names the files changed
since, due again.

"""


def write_ledger(ledger: dict) -> None:
    """The ledger and the results page that shows it, written together."""
    LEDGER.parent.mkdir(parents=True, exist_ok=True)
    LEDGER.write_text(json.dumps(dict(sorted(ledger.items())), indent=1) + "\n")
    PAGE.write_text(PAGE_HEAD + table(ledger))


def table(ledger: dict, progress: dict | None = None) -> str:
    """The ledger as docs/results/mutation.md shows it: a row per file of the scope (which are due again: --stale), a
    pass in progress (tests/mutation/in_progress.json) where one was cut short."""
    progress = read_progress() if progress is None else progress
    rows = ["| file | mutants | killed | timed out | survived (accounted) | score | minutes (workers, on 2 cores) | its tests, unmutated | at |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in SCOPE:
        entry = ledger.get(name)
        short = name.removeprefix(f"{MODULE_UTILS}/")
        going = progress.get(name)
        if going and (entry is None or entry["sha256"] != going["sha256"]):
            counts = {outcome: sum(1 for result in going["results"] if result["outcome"] == outcome) for outcome in ("killed", "timed_out", "survived")}
            rows.append(f"| `{short}` | {going['mutants']} | {counts['killed']} | {counts['timed_out']} | {counts['survived']} | - | "
                        f"{going['seconds'] / 60:.1f} | {going['unmutated_tests_s']} s | in progress: {len(going['results'])} of {going['mutants']} |")
            continue
        if entry is None:
            rows.append(f"| `{short}` | - | - | - | - | - | - | - | not yet run |")
            continue
        rows.append(f"| `{short}` | {entry['mutants']} | {entry['killed']} | {entry['timed_out']} | {entry['survived']} ({entry['accounted']}) "
                    f"| {entry['score']:.1%} | {entry['seconds'] / 60:.1f} ({entry.get('workers', 2)}) | {entry['unmutated_tests_s']} s | "
                    f"{entry['date']} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="files of the scope (default: those due)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work", type=Path, default=WORK,
                        help=f"where the workers' trees go (default {WORK.relative_to(REPO)}; another one for a second run beside the first)")
    parser.add_argument("--limit", type=int, help="only the first N mutants of each file (a try; not written to the ledger)")
    parser.add_argument("--stale", action="store_true", help="list the files due again and exit")
    parser.add_argument("--table", action="store_true", help="print the ledger as a Markdown table and exit")
    parser.add_argument("--page", action="store_true", help="write docs/results/mutation.md from the ledger and exit")
    parser.add_argument("--survivors", action="store_true",
                        help="run only the ledger's survivors of each file again (its contents unchanged), after new tests")
    args = parser.parse_args(argv)
    ledger = read_ledger()
    due = stale(ledger)
    if args.table:
        print(table(ledger), end="")
        return 0
    if args.page:
        PAGE.write_text(PAGE_HEAD + table(ledger))
        return 0
    if args.stale:
        print("\n".join(due) or "every file of the scope is in the ledger at its current hash")
        return 0
    unknown = [name for name in args.files if name not in SCOPE]
    if unknown:
        raise SystemExit(f"not in the mutation scope: {', '.join(unknown)}; the scope: {', '.join(SCOPE)}")
    with_survivors = [name for name, entry in ledger.items() if entry["survived"] > entry["accounted"] and name not in due]
    for name in args.files or (with_survivors if args.survivors else due):
        if args.survivors:
            if name in due:
                raise SystemExit(f"{name} changed since its ledger entry: run all of its mutants again")
            previous = ledger[name]
            reasons = accounted()
            # an equivalent mutant survives every test by definition: only the ones a new test may detect run again
            kept = [dict(survivor, accounted=reasons[(name, survivor["operator"], survivor["occurrence"])]) for survivor in previous["survivors"]
                    if (name, survivor["operator"], survivor["occurrence"]) in reasons]
            only = {(survivor["operator"], survivor["occurrence"]) for survivor in previous["survivors"]} - {
                (survivor["operator"], survivor["occurrence"]) for survivor in kept}
            rerun = run_file(name, args.workers, None, lambda line: print(line, flush=True), only, args.work) if only else None
            entry = rechecked(name, previous, rerun or {"survived": 0, "seconds": 0, "date": time.strftime("%Y-%m-%d"), "killed": 0,
                                                        "timed_out": 0, "survivors": []}, kept)
        else:
            entry = run_file(name, args.workers, args.limit, lambda line: print(line, flush=True), work=args.work)
        print(f"{name}: {entry['mutants']} mutants, {entry['killed']} killed, {entry['timed_out']} timed out, {entry['survived']} survived "
              f"({entry['accounted']} accounted for), score {entry['score']}, {entry['seconds']} s", flush=True)
        if args.limit is None:
            ledger = read_ledger()
            ledger[name] = entry
            write_ledger(ledger)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
