# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""model_stage's node side: the disk (the one seam tests replace), the hub download in a child process bounded by its
timeout, the verification and the rename into place, and the split GGUF merge. The decisions are _staging's; the
module only builds itself, calls stage() and returns."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import time
import traceback

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock
from ansible_collections.gpufleet.serving.plugins.module_utils._models import gguf, staging

try:
    import huggingface_hub
except ImportError:
    huggingface_hub = None
    HF_IMPORT_ERROR = traceback.format_exc()
else:
    HF_IMPORT_ERROR = None


# model_stage's options (the cutover checks its own staging against them)
OPTIONS = dict(
    source=dict(type="str", required=True),
    revision=dict(type="str", default="main"),
    dest=dict(type="path"),
    owner=dict(type="str", default=""),
    endpoint=dict(type="str", default=""),
    token_file=dict(type="path", no_log=False),
    margin_mib=dict(type="int", default=10240),
    models_root=dict(type="path"),
    keep=dict(type="list", elements="path", default=[]),
    prune=dict(type="bool", default=False),
    timeout=dict(type="float", default=14400),
    merge_gguf=dict(type="bool", default=False),
    quant=dict(type="str"),
    files=dict(type="list", elements="str"),
    files_optional=dict(type="bool", default=False),
    keep_parts=dict(type="bool", default=False),
    replaceable=dict(type="path"),
    replace=dict(type="str", default="never", choices=["never", "after_stop", "now"]),
)


class Disk:
    """What model_stage reads and writes on the node: the one seam tests replace."""

    def listing(self, directory: str) -> staging.Listing:
        files = {}
        for top, dirs, names in os.walk(directory):
            dirs[:] = [d for d in dirs if not (top == directory and d == ".cache")]  # huggingface_hub's own bookkeeping
            for name in names:
                path = os.path.join(top, name)
                files[os.path.relpath(path, directory)] = os.stat(path).st_size

        def read_head(name: str, count: int) -> bytes:
            with open(os.path.join(directory, name), "rb") as source:
                return source.read(count)
        return staging.Listing(files, read_head)

    def incomplete_bytes(self, partial: str) -> int:
        """Bytes huggingface_hub already holds of files it did not finish (its .incomplete files under .cache)."""
        total = 0
        for top, _dirs, names in os.walk(os.path.join(partial, ".cache")):
            total += sum(os.path.getsize(os.path.join(top, name)) for name in names if name.endswith(".incomplete"))
        return total

    def free_bytes(self, path: str) -> int:
        while not os.path.exists(path):
            path = os.path.dirname(path)
        status = os.statvfs(path)
        return status.f_bavail * status.f_frsize

    def model_directories(self, root: str) -> list[dict]:
        found = []
        for entry in os.scandir(root) if root and os.path.isdir(root) else []:
            if entry.is_dir(follow_symlinks=False):
                size = sum(os.path.getsize(os.path.join(top, name)) for top, _dirs, names in os.walk(entry.path) for name in names)
                found.append({"path": entry.path, "bytes": size, "used": entry.stat(follow_symlinks=False).st_atime})
        return found


def hub_files(params: dict, token: str | None) -> list[tuple[str, int]]:
    """Every file of the repository at the revision, with its size (the tree listing: mirrors such as olah leave the
    sizes out of the repository's own metadata)."""
    api = huggingface_hub.HfApi(endpoint=params["endpoint"] or None, token=token)
    entries = api.list_repo_tree(params["source"], revision=params["revision"], recursive=True)
    return [(entry.path, int(entry.size)) for entry in entries if isinstance(entry, huggingface_hub.hf_api.RepoFile)]


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    status = os.stat(path)
    if status.st_mode & 0o077:
        raise Error(f"token_file: {path} is readable by others (mode {status.st_mode & 0o777:04o}); make it 0600, owned by root")
    with open(path) as source:
        return source.read().strip() or None


PROGRESS_SECONDS = 1.0


def write_progress(path: str, done: int, total: int, started: float, first_done: int, step: str = "download") -> None:
    """Bytes done of the total, and the rate since this run began, for a download or a merge: read by
    gpufleet.serving.job_wait."""
    elapsed = time.monotonic() - started
    rate = (done - first_done) / elapsed / staging.MIB if elapsed > 0 else None
    partial = path + ".new"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump({"step": step, "bytes_done": done, "bytes_total": total, "seconds": round(elapsed, 1),
                   "rate_mib_s": round(rate, 1) if rate is not None else None}, handle)
    os.replace(partial, path)


RATES_FILE = ".gpufleet-rates.json"


def rates_path(dest: str) -> str:
    """Where the last measured download and merge rates of this models root are kept (a plan's estimate of a
    download inside the downtime reads them)."""
    return os.path.join(os.path.dirname(dest.rstrip("/")), RATES_FILE)


def read_rates(dest: str) -> dict:
    try:
        with open(rates_path(dest), encoding="utf-8") as handle:
            rates = json.load(handle)
    except (OSError, ValueError):
        return {}
    return rates if isinstance(rates, dict) else {}


def record_rates(dest: str, **measured: float | None) -> None:
    """Keep the rates just measured (the others as they were); never a reason to fail a staging."""
    rates = dict(read_rates(dest), **{name: value for name, value in measured.items() if value})
    with contextlib.suppress(OSError):
        partial = rates_path(dest) + ".new"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(dict(rates, at=round(time.time())), handle)
        os.replace(partial, rates_path(dest))


def download(params: dict, token: str | None, partial: str, fetch_bytes: int, disk: Disk, total_bytes: int = 0) -> float:
    """snapshot_download in a child process, so that the timeout holds (its worker threads go with it). While it runs,
    the bytes on the node are written to <dest>.progress every second (the switch's wait shows them)."""
    started = time.monotonic()
    progress = staging.progress_path(params["dest"])

    def on_node() -> int:
        return (sum(disk.listing(partial).files.values()) if os.path.isdir(partial) else 0) + disk.incomplete_bytes(partial)

    first_done, shown = on_node(), 0.0
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and its exit status
        os.close(reader)
        try:
            huggingface_hub.snapshot_download(params["source"], revision=params["revision"], local_dir=partial, token=token,
                                              endpoint=params["endpoint"] or None, etag_timeout=30,
                                              allow_patterns=params.get("allow") or None)
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the parent says it
            os.write(writer, f"{type(exc).__name__}: {exc}"[:2000].encode())
            os._exit(1)
        os._exit(0)
    os.close(writer)
    deadline = started + params["timeout"]
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() >= deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            os.close(reader)
            have = sum(disk.listing(partial).files.values()) if os.path.isdir(partial) else 0
            raise Error(f"{params['source']}: not downloaded within timeout {params['timeout']:g}s ({have / 2**30:.2f} of "
                        f"{fetch_bytes / 2**30:.2f} GiB in {partial}); a rerun resumes from there")
        if total_bytes and time.monotonic() - shown >= PROGRESS_SECONDS:
            shown = time.monotonic()
            with contextlib.suppress(OSError):  # progress is for the operator's eyes: never a reason to stop a download
                write_progress(progress, on_node(), total_bytes, started, first_done)
        time.sleep(0.2)
    message = os.read(reader, 4096).decode(errors="replace")
    os.close(reader)
    if os.waitstatus_to_exitcode(status) != 0:
        raise Error(f"{params['source']}: the download failed: {message or 'no message'}; a rerun resumes from {partial}")
    return time.monotonic() - started


def chown_tree(path: str, owner: str) -> None:
    entry = pwd.getpwnam(owner)
    for top, dirs, names in os.walk(path):
        for name in [top] + [os.path.join(top, n) for n in dirs + names]:
            os.lchown(name, entry.pw_uid, entry.pw_gid)


def check_reachable(dest: str, owner: str, check_mode: bool) -> None:
    """The engine's user must reach the staged model: every existing directory above it must let it through."""
    try:
        entry = pwd.getpwnam(owner)
    except KeyError:
        if check_mode:  # a plan: the switch creates the engine's user only when it really runs
            return
        raise Error(f"owner: no user {owner!r} on this node (the engine's user is created by the switch's preflight)") from None
    gids = {entry.pw_gid} | {group.gr_gid for group in grp.getgrall() if owner in group.gr_mem}
    parents, current = [], os.path.dirname(dest.rstrip("/"))
    while current not in ("", "/"):
        if os.path.exists(current):
            status = os.stat(current)
            parents.append((current, status.st_mode, status.st_uid, status.st_gid))
        current = os.path.dirname(current)
    blocked = staging.blocked_parent(list(reversed(parents)), entry.pw_uid, gids)
    if blocked:
        raise Error(f"dest: {owner} could not read the model at {dest}: it cannot pass through {blocked}; choose a directory "
                    "it can reach (switch_engine_models_root), nothing was fetched")


def stage_hub(params: dict, check_mode: bool, disk: Disk, result: dict) -> dict:
    """One run at a time per destination: a rerun while an interrupted run's download still goes on waits for it (the
    download's child process holds the lock too), then finds what it fetched."""
    dest = params["dest"]
    if params["owner"]:
        check_reachable(dest, params["owner"], check_mode)
    if check_mode:
        return plan_and_stage(params, check_mode, disk, result)
    os.makedirs(os.path.dirname(dest.rstrip("/")), mode=0o755, exist_ok=True)
    with host_lock(dest.rstrip("/") + ".lock", params["timeout"]):
        return plan_and_stage(params, check_mode, disk, result)


def plan_and_stage(params: dict, check_mode: bool, disk: Disk, result: dict) -> dict:
    dest = params["dest"]
    partial = staging.partial_path(dest)
    token = read_token(params["token_file"])
    # only the selected files (one quant of a repository of many, or files by pattern) are listed, counted and fetched
    source_files = staging.select_files(params["source"], hub_files(params, token), params.get("quant"), params.get("files"),
                                        params.get("files_optional", False))
    expected = dict(source_files)
    params = dict(params, allow=sorted(expected) if params.get("quant") or params.get("files") else None)
    # one GGUF model selected for an engine that loads a single file: served from <dest>/model.gguf, merged when split
    model_parts = staging.gguf_selection(list(expected)) if params.get("quant") or params.get("merge_gguf") else None
    if model_parts:
        result["gguf"] = {"file": os.path.join(dest, staging.GGUF_MODEL_FILE), "parts": len(model_parts),
                          "merge": len(model_parts) > 1}
        if gguf_model_present(dest, source_files) or gguf_model_present(partial, source_files):
            if not os.path.isdir(dest) and not check_mode:
                os.rename(partial, dest)  # an interrupted run merged and verified it, and stopped before the rename
                return dict(result, present=True, changed=True)
            return dict(result, present=True, changed=not os.path.isdir(dest))
    elif os.path.isdir(dest):
        problems = staging.checkpoint_problems(disk.listing(dest), expected, weights_expected(expected))
        if not problems:
            return dict(result, present=True)
        result["problems"] = problems
    have = disk.listing(partial).files if os.path.isdir(partial) else {}
    fetch = staging.plan_fetch(source_files, have)
    candidates = staging.prune_candidates(disk.model_directories(params["models_root"]), params["keep"] + [dest, partial],
                                          params["models_root"]) if params["models_root"] else []
    # a merge writes the whole model once more beside its parts before they go: room for both
    merge_bytes = sum(expected[name] for name in model_parts) if model_parts and len(model_parts) > 1 else 0
    room_for = fetch + ([("the merged model.gguf", merge_bytes)] if merge_bytes else [])
    margin = params["margin_mib"] * staging.MIB
    plan = staging.plan_room(room_for, disk.free_bytes(dest), margin, candidates, params["prune"])
    fetch_bytes = sum(size for _name, size in fetch)
    result.update(fetch=[{"name": name, "bytes": size} for name, size in fetch], bytes=fetch_bytes,
                  room={"free_bytes": plan.free_bytes, "needed_bytes": plan.needed_bytes, "ok": plan.room, "merge_bytes": merge_bytes},
                  removed=[{"path": c["path"], "bytes": c["bytes"]} for c in plan.remove])
    found = replacement(params, disk, plan, room_for, candidates, merge_bytes)
    if found:
        result["replace"] = {"path": found.path, "bytes": found.bytes, "estimate_s": found.estimate_s, "removed": False,
                             "message": staging.replace_message(params["source"], found)}
        result["room"]["replace_bytes"] = found.bytes
        if params["replace"] == "after_stop":
            # the previous engine still serves from it: nothing is removed or fetched before its stop
            return dict(result, deferred=True, changed=False)
        if params["replace"] == "now":
            plan = found.plan
            result["removed"] = [{"path": c["path"], "bytes": c["bytes"]} for c in plan.remove]
            if check_mode:
                return dict(result, changed=True)
            shutil.rmtree(found.path)
            result["replace"]["removed"] = True
    if not plan.room:
        # the way through, where there is one: asked for explicitly (the switch's switch_engine_replace_model)
        hint = f"; {result['replace']['message']} (replace: after_stop; switch_engine_replace_model: true)" if found else ""
        raise Error(f"{params['source']}: {plan.message}{hint}; nothing was written", **result)
    if check_mode:
        return dict(result, changed=bool(fetch) or bool(plan.remove) or not os.path.isdir(dest))
    return fetch_into_place(params, disk, result, plan, token, expected, model_parts)


def replacement(params: dict, disk: Disk, plan: staging.StagePlan, room_for: list, candidates: list, merge_bytes: int) -> staging.Replacement | None:
    """The room made by removing the model this one replaces, where the plan has none and that is enough."""
    replaceable = params.get("replaceable")
    if not replaceable or plan.room:
        return None
    problem = staging.replaceable_problem(replaceable, params["dest"], params["models_root"])
    if problem:
        raise Error(problem)
    sizes = {os.path.normpath(d["path"]): d["bytes"] for d in disk.model_directories(params["models_root"])}
    return staging.replacement(plan, room_for, params["margin_mib"] * staging.MIB, candidates, params["prune"], os.path.normpath(replaceable),
                               sizes.get(os.path.normpath(replaceable), 0), merge_bytes, read_rates(params["dest"]))


MANIFEST = ".gguf-model.json"


def weights_expected(expected: dict) -> bool:
    """Whether the selected files are a model (some weights) or not (a tokenizer and config staged alone)."""
    return any(name.endswith(staging.WEIGHT_SUFFIXES) for name in expected)


def gguf_model_present(directory: str, source_files: list[tuple[str, int]]) -> bool:
    """<directory>/model.gguf made from exactly these source files (its manifest says so) and of the length it had."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
        size = os.path.getsize(os.path.join(directory, staging.GGUF_MODEL_FILE))
    except (OSError, ValueError):
        return False
    return manifest.get("parts") == [[name, size_] for name, size_ in source_files] and manifest.get("bytes") == size


def make_gguf_model(partial: str, parts: list[str], source_files: list[tuple[str, int]], keep_parts: bool, owner: str,
                    source: str, progress: str | None = None) -> dict:
    """<partial>/model.gguf from the downloaded parts: merged (verified by its header read back) or the one file renamed;
    the parts removed unless kept; a manifest naming what it was made from."""
    target = os.path.join(partial, staging.GGUF_MODEL_FILE)
    paths = [os.path.join(partial, name) for name in parts]
    report = {"parts": len(parts), "merged": len(parts) > 1, "seconds": 0.0}
    if len(parts) == 1:
        os.replace(paths[0], target)
        report["bytes"] = os.path.getsize(target)
    else:
        report.update(merge_parts(paths, target, owner, source, progress))
        if not keep_parts:
            for path in paths:
                os.unlink(path)
    for directory in sorted({os.path.dirname(path) for path in paths}, reverse=True):
        if directory != partial.rstrip("/"):
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # a quant's own folder, empty now
    with open(os.path.join(partial, MANIFEST), "w", encoding="utf-8") as handle:
        json.dump({"parts": [[name, size] for name, size in source_files], "bytes": os.path.getsize(target)}, handle)
    return report


def fetch_into_place(params: dict, disk: Disk, result: dict, plan: staging.StagePlan, token: str | None, expected: dict,
                     model_parts: list[str] | None = None) -> dict:
    """Make room, download into <dest>.partial, verify, hand it to the owner and rename it to dest."""
    dest = params["dest"]
    partial = staging.partial_path(dest)
    for candidate in plan.remove:
        shutil.rmtree(candidate["path"])
    # an interrupted run's half-fetched files: huggingface_hub resumes them with Range requests, so this run fetches less
    resumed = disk.incomplete_bytes(partial)
    try:
        seconds = download(params, token, partial, plan.fetch_bytes, disk, total_bytes=sum(expected.values()))
    finally:
        if os.path.exists(staging.progress_path(dest)):
            os.unlink(staging.progress_path(dest))
    listing = disk.listing(partial)
    problems = staging.checkpoint_problems(staging.Listing({name: size for name, size in listing.files.items() if name in expected},
                                                           listing.read_head), expected, weights_expected(expected))
    if problems:
        raise Error(f"{params['source']}: the download is incomplete ({'; '.join(problems[:5])}); a rerun resumes it", **result)
    if model_parts:
        try:
            result["gguf"].update(make_gguf_model(partial, model_parts, sorted(expected.items()), params.get("keep_parts", False),
                                                  params["owner"], params["source"], staging.progress_path(dest)))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging.progress_path(dest))
    if params["owner"]:
        chown_tree(partial, params["owner"])
    if os.path.isdir(dest):
        shutil.rmtree(dest)  # an incomplete copy (problems above), never the complete one
    os.rename(partial, dest)
    fetched = max(0, plan.fetch_bytes - resumed)
    rate = fetched / seconds / staging.MIB if seconds > 0 and fetched else None
    record_rates(dest, download_mib_s=round(rate, 4) if rate else None,
                 merge_mib_s=(result.get("gguf") or {}).get("rate_mib_s") if (result.get("gguf") or {}).get("merged") else None)
    return dict(result, changed=True, bytes=fetched, resumed_bytes=resumed, seconds=round(seconds, 3), rate_mib_s=round(rate, 1) if rate else None)


def split_gguf_parts(source: str) -> tuple[str, list[str]]:
    """The merged file's path and the parts of the split GGUF at ``source`` (its directory, or one of its parts)."""
    directory = source if os.path.isdir(source) else os.path.dirname(source)
    wanted = staging.SPLIT_GGUF.match(os.path.basename(source)) if not os.path.isdir(source) else None
    stems: dict[str, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        match = staging.SPLIT_GGUF.match(name)
        if match and (wanted is None or match["stem"] == wanted["stem"]):
            stems.setdefault(match["stem"], []).append(os.path.join(directory, name))
    if len(stems) != 1:
        raise Error(f"merge_gguf: {source} holds {'no split GGUF' if not stems else 'several split GGUFs: ' + ', '.join(sorted(stems))}; "
                    "give one of its parts as source")
    stem, parts = next(iter(stems.items()))
    return os.path.join(directory, f"{stem}.gguf"), parts


def merge_split_gguf(params: dict, check_mode: bool, disk: Disk) -> dict:
    """One GGUF beside the parts (engines such as vLLM load a single file): written through <merged>.partial, renamed
    once whole; a merged file whose header and size are the plan's is left alone."""
    merged, names = split_gguf_parts(params["source"])
    parts: list = []
    for name in names:
        with open(name, "rb") as handle:
            parts.append(gguf.read_part(handle, name, os.path.getsize(name)))
    plan = gguf.plan_merge(parts)
    report = {"merged": {"path": merged, "parts": len(names), "bytes": plan.size}}
    if os.path.isfile(merged) and os.path.getsize(merged) == plan.size:
        with open(merged, "rb") as existing:
            if existing.read(len(plan.header)) == plan.header:
                return report
    free, needed = disk.free_bytes(merged), plan.size + params["margin_mib"] * staging.MIB
    report["room"] = {"free_bytes": free, "needed_bytes": needed, "ok": free >= needed}
    if free < needed:
        raise Error(f"merge_gguf: {merged} needs {needed / 2**30:.2f} GiB (with the margin), {free / 2**30:.2f} GiB free; nothing was written")
    if check_mode:
        return dict(report, changed=True)
    written = write_merge(plan, parts, merged, params["owner"])
    return dict(report, changed=True, seconds=written["seconds"])


def merge_parts(paths: list[str], merged: str, owner: str, source: str, progress: str | None = None) -> dict:
    """The parts of one split GGUF merged into ``merged``; refused naming the problem when they are not one whole set."""
    parts = []
    for path in paths:
        with open(path, "rb") as handle:
            parts.append(gguf.read_part(handle, path, os.path.getsize(path)))
    try:
        plan = gguf.plan_merge(parts)
    except Error as exc:
        raise Error(f"{source}: {exc.msg}") from None
    return write_merge(plan, parts, merged, owner, progress)


MERGE_CHUNK = 16 * staging.MIB


def write_merge(plan: gguf.MergePlan, parts: list, merged: str, owner: str, progress: str | None = None) -> dict:
    """Written through <merged>.partial, its header read back and held against the plan (its length, every tensor of
    every part once, each at its planned offset), then renamed; a failure leaves no partial file. With ``progress``,
    the bytes written and the rate go there every second, as a download's do."""
    started = time.monotonic()
    partial = merged + ".partial"
    written, shown = 0, started
    try:
        with open(partial, "wb") as out:
            out.write(plan.header)
            for (name, start, length), pad in zip(plan.copies, plan.pads):
                with open(name, "rb") as source:
                    source.seek(start)
                    left = length
                    while left > 0:
                        chunk = source.read(min(MERGE_CHUNK, left))
                        if not chunk:
                            break  # a part shorter than its header says: the read-back below names it
                        out.write(chunk)
                        left -= len(chunk)
                        written += len(chunk)
                        if progress and time.monotonic() - shown >= PROGRESS_SECONDS:
                            shown = time.monotonic()
                            with contextlib.suppress(OSError):
                                write_progress(progress, written + len(plan.header), plan.size, started, 0, step="merge")
                out.write(bytes(pad))
            out.flush()
            os.fsync(out.fileno())
        with open(partial, "rb") as written:
            problems = gguf.merged_problems(gguf.read_part(written, partial, os.path.getsize(partial)), plan, parts)
        if problems:
            raise Error(f"merge_gguf: {'; '.join(problems)}; nothing was renamed")
        if owner:
            entry = pwd.getpwnam(owner)
            os.chown(partial, entry.pw_uid, entry.pw_gid)
        os.rename(partial, merged)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
    seconds = time.monotonic() - started
    return {"bytes": plan.size, "seconds": round(seconds, 3), "rate_mib_s": round(plan.size / seconds / staging.MIB, 1) if seconds > 0 else None}


class MissingHubClient(Exception):
    """huggingface_hub is not installed on the node (the module says so the way Ansible says a library is missing)."""


def stage(params: dict, check_mode: bool, disk: Disk) -> dict:
    """model_stage's work: a local source verified where it is (and, asked, a split GGUF merged), or a hub repository
    staged at dest. Raises Error, with the result so far as its context."""
    kind = staging.parse_source(params["source"])
    if params["margin_mib"] < 0 or params["timeout"] <= 0:
        raise Error("margin_mib must be at least 0 and timeout greater than 0")
    result = dict(changed=False, kind=kind, dest=params["dest"] or params["source"], present=False, fetch=[], bytes=0, seconds=0.0,
                  rate_mib_s=None, room={}, removed=[], problems=[])
    if kind == "path":
        if params["dest"]:
            raise Error("dest: a local source is verified where it is; give dest only with a hub source")
        if not os.path.exists(params["source"]):
            raise Error(f"{params['source']} does not exist", **result)
        if os.path.isdir(params["source"]) or params["merge_gguf"]:  # a part of a split GGUF: all of its directory
            listing = disk.listing(params["source"] if os.path.isdir(params["source"]) else os.path.dirname(params["source"]))
        else:
            listing = staging.Listing({os.path.basename(params["source"]): os.path.getsize(params["source"])})
        result["problems"] = staging.checkpoint_problems(listing)
        if result["problems"]:
            raise Error(f"{params['source']} is not a complete checkpoint: {'; '.join(result['problems'][:10])}", **result)
        result["present"] = True
        if params["merge_gguf"]:
            result.update(merge_split_gguf(params, check_mode, disk))
        return result
    if params["merge_gguf"] and not (params.get("quant") or params.get("files")):
        raise Error("merge_gguf: for a hub repository, select its one GGUF model with quant or files (a local split GGUF: give its path)")
    if not params["dest"] or not os.path.isabs(params["dest"]):
        raise Error("dest: an absolute path is required for a hub source (the directory the engine's unit will read)")
    if huggingface_hub is None:
        raise MissingHubClient(HF_IMPORT_ERROR)
    return stage_hub(params, check_mode, disk, result)
