# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""model_stage without Ansible: is a checkpoint complete, how much must be fetched, is there room, what may be removed.

Everything here is a pure function of what was observed: a directory's files and their sizes (``Listing``), the first
bytes of a file when its own header says how long it must be (safetensors), the source's file list with sizes (a hub
repository's metadata), the free space, and the model directories under a models root. The module observes, these
decide.
"""

from __future__ import annotations

import json
import posixpath
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

MIB = 1 << 20
# a hub repository: org/name, as the hub spells them
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# llama.cpp's split GGUF: name-00001-of-00010.gguf
SPLIT_GGUF = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
# a safetensors header longer than this is garbage, not a header (the format's own limit is 100 MB)
MAX_SAFETENSORS_HEADER = 100 * MIB
PARTIAL_SUFFIX = ".partial"


@dataclass
class Listing:
    """A model directory as observed: relative file name -> bytes, and a reader of a file's first bytes."""

    files: dict[str, int]
    read_head: Callable[[str, int], bytes] = field(default=lambda _name, _count: b"", repr=False)


def parse_source(source: str) -> str:
    """'hub' for org/name, 'path' for an absolute path; anything else is refused naming the forms."""
    if source.startswith("/"):
        if "\0" in source or "\n" in source or "/../" in f"{source}/":
            raise InvalidInput(f"source: {source!r} is not a clean absolute path")
        return "path"
    if HUB_NAME.match(source) and ".." not in source:
        return "hub"
    raise InvalidInput(f"source: {source!r} is neither a hub repository (org/name) nor an absolute path")


# one quantization of a hub repository, as vLLM names it (its GGUF docs: unsloth/Qwen3-0.6B-GGUF:Q4_K_M)
HUB_QUANT = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}):(?P<quant>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
# the file a selected GGUF (one file, or a split set merged) is served from, in its staged directory
GGUF_MODEL_FILE = "model.gguf"


def hub_quant(model: str) -> tuple[str, str | None]:
    """(repository, quant) of ``org/name:QUANT``; (model, None) for anything else."""
    match = HUB_QUANT.match(model)
    return (match["repo"], match["quant"]) if match and ".." not in match["repo"] else (model, None)


def _quant_matches(name: str, quant: str) -> bool:
    """The quant as a whole word of the file's path (Q4_K is not Q4_K_M), case as the hub's names vary."""
    stem = name[: -len(".gguf")] if name.lower().endswith(".gguf") else name
    return re.search(rf"(^|[-_./]){re.escape(quant)}([-./]|$)", stem, re.IGNORECASE) is not None


def _gguf_groups(names: list[str]) -> dict[str, list[str]]:
    """GGUF files grouped as models: a split set by its stem, any other file alone."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        match = SPLIT_GGUF.match(posixpath.basename(name))
        key = posixpath.join(posixpath.dirname(name), match["stem"]) if match else name
        groups.setdefault(key, []).append(name)
    return groups


def _shown(names, limit: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "none"


# a tokenizer and the model's config, never weights: what a GGUF is served with from its base model's repository
TOKENIZER_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "*.tiktoken", "chat_template.*"]
TOKENIZER_NEEDS = ("tokenizer.json", "tokenizer.model", "vocab.json", ".tiktoken")


def select_files(source: str, source_files: list[tuple[str, int]], quant: str | None = None, patterns: list[str] | None = None,
                 optional: bool = False) -> list[tuple[str, int]]:
    """The files of a repository to stage: all of them, those matching ``patterns`` (globs on the path), or the GGUF
    files of one ``quant``, which must be one model (a single file or one complete split set). Refused naming what the
    repository does hold. ``optional``: a pattern may match nothing, as long as one matches something."""
    import fnmatch

    if not quant and not patterns:
        return list(source_files)
    names = [name for name, _size in source_files]
    selected: set[str] = set()
    for pattern in patterns or []:
        matched = {name for name in names if fnmatch.fnmatchcase(name, pattern)}
        if not matched and not optional:
            raise InvalidInput(f"{source}: the file pattern {pattern!r} matches none of its {len(names)} files ({_shown(names)})")
        selected |= matched
    if patterns and optional and not selected:
        raise InvalidInput(f"{source}: none of its {len(names)} files matches {', '.join(patterns)} ({_shown(names)})")
    if quant:
        ggufs = [name for name in names if name.lower().endswith(".gguf")]
        groups = _gguf_groups([name for name in ggufs if _quant_matches(name, quant)])
        if not groups:
            raise InvalidInput(f"{source}: no GGUF file of the quant {quant!r}; its GGUF files: {_shown(ggufs)}")
        if len(groups) > 1:
            raise InvalidInput(f"{source}: the quant {quant!r} names {len(groups)} GGUF models, not one split set: {_shown(groups)}; "
                               "name the files with a pattern")
        selected |= set(next(iter(groups.values())))
    return [(name, size) for name, size in source_files if name in selected]


def gguf_selection(files: list[str]) -> list[str] | None:
    """The selected files' one GGUF model (its parts in order), when the selection is exactly that; else None."""
    ggufs = [name for name in files if name.lower().endswith(".gguf")]
    groups = _gguf_groups(ggufs)
    return next(iter(groups.values())) if len(groups) == 1 and len(ggufs) == len(files) else None


def safetensors_size(head: bytes) -> int | None:
    """The length a safetensors file must have, from its first bytes (8-byte header length, then the JSON header);
    None where they are not a safetensors header."""
    if len(head) < 8:
        return None
    (header_length,) = struct.unpack("<Q", head[:8])
    if header_length > MAX_SAFETENSORS_HEADER or len(head) < 8 + header_length:
        return None
    try:
        header = json.loads(head[8:8 + header_length])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets") or []) == 2]
    return 8 + header_length + max(ends, default=0)


def header_bytes_needed(head: bytes) -> int:
    """How many leading bytes safetensors_size needs, from the first 8."""
    return 8 + struct.unpack("<Q", head[:8])[0] if len(head) >= 8 else 8


def checkpoint_problems(listing: Listing, expected_sizes: dict[str, int] | None = None, weights_expected: bool = True) -> list[str]:
    """Why a model directory is not a complete checkpoint; [] when it is.

    Every file an index names is there; every safetensors file has the length its own header gives; every part of
    a split GGUF is there; files whose size the source gave (expected_sizes) have exactly that size. Without
    ``weights_expected`` (a tokenizer staged without its model's weights) only the files and their sizes are held.
    """
    files = listing.files
    problems = []
    weights = [name for name in files if name.endswith(WEIGHT_SUFFIXES)]
    gguf_only = weights and all(name.endswith(".gguf") for name in weights)
    if "config.json" not in files and not gguf_only and weights_expected:
        problems.append("no config.json")
    if not weights and weights_expected:
        problems.append(f"no weight files ({', '.join('*' + suffix for suffix in WEIGHT_SUFFIXES)})")
    for index in INDEXES:
        if index in files:
            problems += _index_problems(listing, index)
    problems += _split_gguf_problems(files)
    for name in sorted(files):
        if name.endswith(".safetensors"):
            problem = _safetensors_problem(listing, name)
            if problem:
                problems.append(problem)
    for name, size in sorted((expected_sizes or {}).items()):
        if name not in files:
            problems.append(f"{name} is missing")
        elif files[name] != size:
            problems.append(f"{name} has {files[name]} bytes, the source has {size}")
    return list(dict.fromkeys(problems))


def _index_problems(listing: Listing, index: str) -> list[str]:
    try:
        weight_map = json.loads(listing.read_head(index, 64 * MIB)).get("weight_map") or {}
    except (ValueError, UnicodeDecodeError, AttributeError):
        return [f"{index} cannot be read as JSON"]
    return [f"{name}, named by {index}, is missing" for name in sorted(set(weight_map.values())) if name not in listing.files]


def _split_gguf_problems(files: dict[str, int]) -> list[str]:
    parts: dict[str, tuple[int, set[int]]] = {}
    for name in files:
        match = SPLIT_GGUF.match(posixpath.basename(name))
        if match:
            stem = posixpath.join(posixpath.dirname(name), match["stem"])
            count, seen = parts.get(stem, (int(match["count"]), set()))
            seen.add(int(match["part"]))
            parts[stem] = (max(count, int(match["count"])), seen)
    problems = []
    for stem, (count, seen) in sorted(parts.items()):
        missing = [part for part in range(1, count + 1) if part not in seen]
        if missing:
            shown = ", ".join(f"{part:05d}" for part in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            problems.append(f"split GGUF {stem}: part(s) {shown} of {count:05d} missing")
    return problems


def _safetensors_problem(listing: Listing, name: str) -> str | None:
    head = listing.read_head(name, 8)
    need = header_bytes_needed(head)
    if need > MAX_SAFETENSORS_HEADER + 8:
        return f"{name} is not a safetensors file (its header length is garbage)"
    expected = safetensors_size(listing.read_head(name, need))
    if expected is None:
        return f"{name} is not a safetensors file (no readable header)"
    if listing.files[name] != expected:
        return f"{name} has {listing.files[name]} bytes, its header says {expected} (cut short or padded)"
    return None


@dataclass
class StagePlan:
    """What staging would do: the files to fetch and their bytes, the room, the directories to remove."""

    fetch: list[tuple[str, int]]
    fetch_bytes: int
    free_bytes: int
    needed_bytes: int  # fetch_bytes plus the margin
    remove: list[dict]  # [{path, bytes}] under the models root, in the order they would go
    room: bool
    message: str


def plan_fetch(source_files: list[tuple[str, int]], present: dict[str, int]) -> list[tuple[str, int]]:
    """The source's files that are not already here with their size (a partial download keeps what it finished)."""
    return [(name, size) for name, size in source_files if present.get(name) != size]


def plan_room(fetch: list[tuple[str, int]], free_bytes: int, margin_bytes: int, candidates: list[dict], prune: bool) -> StagePlan:
    """Room for the fetch (plus a margin), using the removable directories only with the opt-in.

    candidates: model directories that may go (no engine configured on the node uses them), largest first is not
    assumed - they go in the order given until there is room, and no further.
    """
    fetch_bytes = sum(size for _name, size in fetch)
    needed = fetch_bytes + margin_bytes if fetch else 0
    remove, freed = [], 0
    if prune and free_bytes < needed:
        for candidate in candidates:
            if free_bytes + freed >= needed:
                break
            remove.append(candidate)
            freed += candidate["bytes"]
    room = free_bytes + freed >= needed
    if not room:  # removing models that still leave too little room would only lose them
        remove, freed = [], 0
    figures = (f"{_gib(fetch_bytes)} to fetch + {_gib(margin_bytes)} margin, {_gib(free_bytes)} free"
               + (f", {_gib(freed)} from removing {len(remove)} unused model director(y/ies)" if remove else ""))
    if room:
        message = figures
    elif candidates and not prune:
        message = (f"not enough room: {figures}; {len(candidates)} unused model director(y/ies) under the models root hold "
                   f"{_gib(sum(c['bytes'] for c in candidates))} (removed only with prune)")
    else:
        message = f"not enough room: {figures}"
    return StagePlan(fetch=fetch, fetch_bytes=fetch_bytes, free_bytes=free_bytes, needed_bytes=needed, remove=remove, room=room, message=message)


def prune_candidates(directories: list[dict], keep: list[str], models_root: str) -> list[dict]:
    """Model directories under models_root that may be removed: not kept (in use by an engine configured here, the
    running engine's, the target's), not above or below a kept path, directly under the root. Least recently used first.

    directories: [{path, bytes, used (last access, unix seconds)}] as observed.
    """
    root = posixpath.normpath(models_root)
    kept = [posixpath.normpath(path) for path in keep if path]
    removable = []
    for directory in directories:
        path = posixpath.normpath(directory["path"])
        if posixpath.dirname(path) != root or path == root:
            continue
        if any(path == k or k.startswith(path + "/") or path.startswith(k + "/") for k in kept):
            continue
        removable.append(dict(directory, path=path))
    return sorted(removable, key=lambda d: (d.get("used") or 0, d["path"]))


REPLACE_MODES = ("never", "after_stop", "now")


@dataclass(frozen=True)
class Replacement:
    """Room made by removing the model the target replaces (the previous engine's, once it is stopped)."""

    path: str
    bytes: int
    plan: StagePlan  # the room with its bytes counted free
    estimate_s: float | None  # the download and the merge at the last measured rates; None when none was measured


def replaceable_problem(replaceable: str, dest: str, models_root: str | None) -> str | None:
    """Only a model the switch staged (a directory directly under the models root, not the target's own) can be
    replaced: it can be staged again for a rollback. Why not, or None."""
    if not models_root:
        return "replaceable: give models_root (only a model staged under it can be replaced)"
    path, root = posixpath.normpath(replaceable), posixpath.normpath(models_root)
    if posixpath.dirname(path) != root or path == root:
        return f"replaceable: {replaceable} is not a model staged directly under {models_root}; it could not be staged again for a rollback"
    if path in (posixpath.normpath(dest), posixpath.normpath(partial_path(dest))):
        return f"replaceable: {replaceable} is the target's own directory"
    return None


def replacement(plan: StagePlan, room_for: list[tuple[str, int]], margin_bytes: int, candidates: list[dict], prune: bool,
                replaceable: str, replaceable_bytes: int, merge_bytes: int, rates: dict) -> Replacement | None:
    """Where the plan has no room: the room if the replaceable model went, when that is enough; else None."""
    if plan.room or not replaceable_bytes:
        return None
    with_replace = plan_room(room_for, plan.free_bytes + replaceable_bytes, margin_bytes, candidates, prune)
    if not with_replace.room:
        return None
    return Replacement(path=replaceable, bytes=replaceable_bytes, plan=with_replace,
                       estimate_s=fetch_estimate(plan.fetch_bytes, merge_bytes, rates))


def fetch_estimate(fetch_bytes: int, merge_bytes: int, rates: dict) -> float | None:
    """Seconds to fetch (and merge) at the last measured rates of this models root; None without a measured download."""
    download = rates.get("download_mib_s")
    if not download or download <= 0:
        return None
    seconds = fetch_bytes / MIB / download
    if merge_bytes:
        merge = rates.get("merge_mib_s") or download  # no merge measured yet: at most the download's rate is a fair guess
        seconds += merge_bytes / MIB / merge
    return round(seconds, 1)


def replace_message(source: str, found: Replacement) -> str:
    estimate = (f"about {found.estimate_s:.0f} s at the last measured rate" if found.estimate_s is not None
                else "its length unknown: no download measured under this models root yet")
    return (f"removing the model it replaces, {found.path} ({_gib(found.bytes)}), after the previous engine's stop makes room "
            f"({found.plan.message}); {source} would then be fetched inside the downtime ({estimate}), and a rollback stages "
            "the previous model again")


def progress_path(dest: str) -> str:
    """Where a download in progress says how far it got (bytes on the node, the total, the rate)."""
    return dest.rstrip("/") + ".progress"


def partial_path(dest: str) -> str:
    """Where a download goes until it is complete: never taken for a model (the engines are pointed at dest)."""
    return dest.rstrip("/") + PARTIAL_SUFFIX


def _gib(count: int) -> str:
    return f"{count / 2**30:.2f} GiB"


def blocked_parent(parents: list[tuple[str, int, int, int]], uid: int, gids: set[int]) -> str | None:
    """The first directory on the way to a model that its engine's user cannot pass through (no search permission),
    described; None when every one lets it. ``parents``: (path, mode, owner uid, group gid) of each existing one."""
    for path, mode, owner, group in parents:
        if uid == 0:
            return None
        bit = 0o100 if owner == uid else 0o010 if group in gids else 0o001
        if not mode & bit:
            return f"{path} (mode {mode & 0o7777:04o}, owner uid {owner}, group gid {group})"
    return None


def tokenizer_problem(names: list[str]) -> str | None:
    """Why a staged tokenizer directory cannot serve as one (no tokenizer file), or None."""
    if any(name.endswith(TOKENIZER_NEEDS) for name in names):
        return None
    return f"no tokenizer file ({', '.join(TOKENIZER_NEEDS)}) among {_shown(sorted(names))}"
