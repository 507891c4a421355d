"""What a run added to the working tree: the test runs and the Molecule scenarios write only into ignored places
(build/, the scenario's ephemeral directory, tmp), so `git status` after a run must show nothing the run did."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Tracked paths that are outputs of a run rather than sources (a report, a log, a build product), as git glob pathspecs.
RUN_OUTPUTS = ("**/reports/**", "**/*.log", "build/**", "collections/**", "tests/output/**", "**/*.pyc", "**/*.retry",
               "**/.pytest_cache/**", "**/molecule-*/**")


def status() -> set[str] | None:
    """`git status --porcelain` lines (untracked files one by one), or None outside a git checkout."""
    try:
        result = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
                                capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return set(result.stdout.splitlines())


def added_by_run(before: set[str] | None) -> list[str]:
    """The entries of `git status` that were not there before the run (modified or new files)."""
    after = status()
    if before is None or after is None:
        return []
    return sorted(after - before)


def tracked_run_outputs() -> list[str]:
    """Tracked files that a run produces: the next run would rewrite them."""
    result = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", *[f":(glob){pattern}" for pattern in RUN_OUTPUTS]],
                            capture_output=True, text=True, check=True, timeout=60)
    return result.stdout.splitlines()
