# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The node's record of its parked engine, the start hold that keeps a dead one down, and what each engine's last park
left: read by a cleanup (which keeps or evicts the parked engine) and a switch, written by the cutover."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import boot_id

# the node's record of its parked engine (engine_observe reads it; engine_cutover writes and clears it)
RECORD_PATH = paths.PARKED_RECORD
# what each engine's last park on the node left: per GPU, with the GPUs' sizes (the planner checks the next park by it)
HISTORY_PATH = paths.PARK_HISTORY

# while a file named as the unit is here, systemd does not start that unit: the engine units' ConditionPathExists=!
# (engine.service.j2). A parked engine whose process dies is then not restarted cold beside the engine that serves; the
# next switch finds it dead and starts it cold itself. /run: a reboot clears it.
HOLD_DIR = paths.PARK_HOLD_DIR


def read_record(path: str | None) -> dict | None:
    """The node's parked engine as recorded, or None (none, or unreadable: then nothing is kept as parked)."""
    record = files.read_json_object(path)
    return record if record and record.get("unit") and record.get("engine") else None


def alive(record: dict | None, unit_properties: dict, boot: str | None = None) -> tuple[bool, str | None]:
    """Is the recorded parked engine still the unit's running invocation? (False, why) when the node restarted since,
    or it died or was restarted: a restarted engine serves cold, it is not the parked one. ``boot``: this boot's id
    (default: the kernel's)."""
    if not record:
        return False, None
    if record.get("boot_id") and record["boot_id"] != (boot or boot_id()):
        return False, f"the node restarted since {record['engine']} parked (another boot): a parked engine does not outlive a restart"
    state = unit_properties.get("ActiveState")
    if state != "active":
        return False, f"the parked {record['engine']} died ({record['unit']} is {state or 'unknown'})"
    if record.get("invocation_id") and unit_properties.get("InvocationID") != record["invocation_id"]:
        return False, f"the parked {record['engine']} was restarted since it parked ({record['unit']} has another invocation)"
    return True, None


def remove_record(path: str | None) -> bool:
    if path and os.path.lexists(path):
        os.unlink(path)
        return True
    return False


def hold_dir(record_path: str | None) -> str:
    """Where the start holds are, beside a record kept elsewhere than the node's (tests, a second collection)."""
    if not record_path or record_path == RECORD_PATH:
        return HOLD_DIR
    return os.path.join(os.path.dirname(record_path), "hold")


def hold(record_path: str | None, unit: str) -> None:
    """systemd starts ``unit`` no more (a parked engine that dies stays down) until release(); the only unit held."""
    directory = hold_dir(record_path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with open(os.path.join(directory, unit), "w", encoding="utf-8"):
        pass
    release(record_path, [held for held in os.listdir(directory) if held != unit])


def release(record_path: str | None, units: list[str] | None = None) -> list[str]:
    """systemd may start these units again (all held ones when None); the units released."""
    directory = hold_dir(record_path)
    try:
        held = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    released = []
    for unit in held if units is None else [unit for unit in units if unit in held]:
        try:
            os.unlink(os.path.join(directory, unit))
            released.append(unit)
        except FileNotFoundError:
            continue
    return released


def read_history(path: str | None) -> dict:
    """{engine: {leftover_mib, gpus, host_memory_bytes, park_s, at}} of each engine's last park here ({} when none)."""
    return files.read_json_object(path) or {}


def remembered(history: dict, engine: str, parked: dict) -> dict:
    """The history with ``engine``'s park as measured now."""
    keep = ("leftover_mib", "gpus", "host_memory_bytes", "seconds", "at")
    return dict(history, **{engine: {key: parked.get(key) for key in keep}})
