# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""An engine's files - its unit, its secrets, the switch's marks - compared and written in one step.

A file differs when its content, mode, owner or group does; a differing file is written whole to a temporary file
beside it and renamed over it (a reader never sees half a unit or half a key file). Secrets never appear in a diff.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import tempfile
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, InvalidInput

# The form of a file in the modules' options (engine_files writes them, engine_observe compares them).
FILE_OPTIONS = dict(name=dict(type="str"), path=dict(type="path", required=True), content=dict(type="str", required=True),
                    mode=dict(type="str", default="0644"), owner=dict(type="str", default="root"), group=dict(type="str", default="root"),
                    secret=dict(type="bool", default=False), reload=dict(type="bool", default=False))


def parse_mode(label: str, value: str) -> int:
    try:
        mode = int(str(value), 8)
    except ValueError:
        raise InvalidInput(f"{label} {value!r} is not an octal mode like 0644") from None
    if not 0 <= mode <= 0o7777:
        raise InvalidInput(f"{label} {value!r} is out of range")
    return mode


@dataclass(frozen=True)
class WantedFile:
    name: str
    path: str
    content: str
    mode: int
    owner: str = "root"
    group: str = "root"
    secret: bool = False
    reload: bool = False  # a change means systemd must reload its units

    @classmethod
    def from_params(cls, params: dict) -> WantedFile:
        path = params["path"]
        if not os.path.isabs(path) or path.endswith("/"):
            raise InvalidInput(f"files: give each file's absolute path, got {path!r}")
        mode = parse_mode(f"files: {path}: mode", params.get("mode") or "0644")
        return cls(name=params.get("name") or path, path=path, content=params["content"], mode=mode, owner=params.get("owner") or "root",
                   group=params.get("group") or "root", secret=bool(params.get("secret")), reload=bool(params.get("reload")))

    def ids(self) -> tuple[int, int]:
        try:
            uid = pwd.getpwnam(self.owner).pw_uid
        except KeyError:
            raise InvalidInput(f"files: {self.path}: no user {self.owner!r} on this host") from None
        try:
            gid = grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise InvalidInput(f"files: {self.path}: no group {self.group!r} on this host") from None
        return uid, gid


def difference(wanted: WantedFile) -> tuple[list[str], str | None]:
    """What differs ('absent', 'content', 'mode', 'owner'), and the file's current text (None when absent or unreadable)."""
    try:
        with open(wanted.path, "rb") as current:
            before = current.read()
            status = os.fstat(current.fileno())
    except FileNotFoundError:
        return ["absent"], None
    uid, gid = wanted.ids()
    differs = []
    if before != wanted.content.encode():
        differs.append("content")
    if stat.S_IMODE(status.st_mode) != wanted.mode:
        differs.append("mode")
    if (status.st_uid, status.st_gid) != (uid, gid):
        differs.append("owner")
    return differs, before.decode(errors="replace")


def write(wanted: WantedFile, directory_mode: int) -> None:
    """The whole file, its mode and owner set before it is renamed into place."""
    write_atomically(wanted.path, wanted.content, wanted.mode, *wanted.ids(), directory_mode=directory_mode)


def write_atomically(path: str, content: str, mode: int, uid: int = 0, gid: int = 0, directory_mode: int = 0o755) -> None:
    """``content`` at ``path``, whole or not at all: written, synced and given its mode and owner, then renamed."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=directory_mode, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        os.fchmod(descriptor, mode)
        os.fchown(descriptor, uid, gid)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content.encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def read_json_object(path: str | None) -> dict | None:
    """A node-local record (a JSON object), or None: no path, no file, unreadable or not an object. The records are
    for the next run's decisions and reports; a damaged one is no record, never a failure."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def unique_names(files: list[WantedFile]) -> list[str]:
    names = [wanted.name for wanted in files]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidInput(f"files: {', '.join(twice)} given more than once")
    return names


def compare(files: list[WantedFile]) -> dict[str, list[str]]:
    """By name, what differs for each file (nothing is written)."""
    unique_names(files)
    return {wanted.name: difference(wanted)[0] for wanted in files}


def converge(files: list[WantedFile], directory_mode: int, check_mode: bool, reload) -> dict:
    """Compare every file, write those that differ (unless check mode), reload systemd once when a file marked
    ``reload`` changed. Returns changed, files (by name: what differed), reloaded and the diffs of non-secret files.
    Raises Error naming the file that could not be read or written."""
    try:
        return _converge(files, directory_mode, check_mode, reload)
    except OSError as exc:
        raise Error(f"{exc.filename or 'a file'}: {exc.strerror}") from None


def _converge(files: list[WantedFile], directory_mode: int, check_mode: bool, reload) -> dict:
    names = unique_names(files)
    for wanted in files:
        wanted.ids()  # every owner and group exists before the first file is written
    found = {wanted.name: difference(wanted) for wanted in files}
    diffs = []
    for wanted in files:
        differs, before = found[wanted.name]
        if differs and not wanted.secret:
            diffs.append({"before_header": wanted.path, "after_header": wanted.path, "before": before or "", "after": wanted.content})
    changed = [wanted for wanted in files if found[wanted.name][0]]
    reloaded = False
    if not check_mode:
        for wanted in changed:
            write(wanted, directory_mode)
        if any(wanted.reload for wanted in changed):
            reload()
            reloaded = True
    return {"changed": bool(changed), "files": {name: found[name][0] for name in names}, "reloaded": reloaded, "diff": diffs}
