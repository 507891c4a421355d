# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""How switch_engine.yml rolls across the fleet: its batches, read from what operators type, and its failure gate."""

from __future__ import annotations

import json
import math
import os
import re
import socket

SWITCH_SUCCESSES = ("switched", "unchanged")
NOT_REACHED = "not_reached"
BATCHES_FORMS = "a node count (1), a share (\"25%\"), or a list of them: -e switch_engine_serial=1,4 or -e '{\"switch_engine_serial\": [1, \"25%\"]}'"
PERCENT = re.compile(r"^(\d+(?:\.\d+)?)%$")


# <UTC stamp>-<controller>-<pid>.<start time>-<token>: the run's ansible-playbook process, so that a later run of the same
# controller can tell an interrupted run (its process gone) from a live one.
RUN_OWNER = re.compile(r"^(?P<stamp>\d{8}T\d{6})-(?P<controller>.+)-(?P<pid>\d+)\.(?P<start>\d+)-(?P<token>\d+)$")


class RolloutError(ValueError):
    pass


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def run_owner(stamp: str, token, controller_pid: int | None = None) -> str:
    """This run's lease owner. Templating runs in a worker forked from ansible-playbook: its parent is the run."""
    pid = controller_pid or os.getppid()
    return f"{stamp}-{socket.gethostname()}-{pid}.{_start_time(pid) or 0}-{token}"


def run_owner_gone(owner: str) -> bool:
    """True only for a run of this controller whose ansible-playbook process is gone (interrupted, killed).

    A run of another controller, or an owner in another form, is never judged: its lease is waited for or expires.
    """
    match = RUN_OWNER.match(str(owner or ""))
    if not match or match.group("controller") != socket.gethostname():
        return False
    return _start_time(int(match.group("pid"))) != match.group("start")


def lease_wait(holder: dict | None, run_id: str, seconds, working: str | None = None, slice_seconds: float = 15.0) -> dict:
    """How a run waits for the node's one lease - the switch's and the cleanup's one rule - from the holder the node
    answered (``working``: the pid of work the last holder left running, a cutover). ``wait``: another run holds it (or
    none does and this run did not take it yet). ``break_owner``: the holder, where it is a run of this controller
    known gone - its lease is taken over once the work it left ended; any other holder is waited for until it gives
    the lease back or its lease expires. The wait runs in ``slices`` of ``slice_seconds`` at most (a wait whose
    controller is gone ends within one) - ``retries`` of them fill ``seconds``. ``text`` says what it waits for."""
    owner = str((holder or {}).get("owner") or "")
    seconds = float(seconds)
    if seconds < 0:
        raise RolloutError(f"the lease wait must be at least 0 s, got {seconds:g}")
    one = min(slice_seconds, seconds)
    gone = bool(owner) and owner != run_id and run_owner_gone(owner)
    text = f"waiting up to {seconds:g} s for the node's lease - " + (f"held by {owner}" if owner else "given back")
    if gone:
        text += " (a run of this controller that is gone: taken over once the work it left ended)"
    if working:
        text += f"; the cutover of the run before (pid {working}) still runs on the node"
    return {"wait": owner != run_id, "break_owner": owner if gone else None, "slice": one,
            "retries": max(1, math.ceil(seconds / one)) if one > 0 else 1, "text": text}


def _batch(item, raw):
    """One batch: a positive node count, or a share of the fleet from 1 % to 100 %."""
    if isinstance(item, bool):
        raise RolloutError(f"switch_engine_serial: {raw!r} - {item!r} is not a batch; give {BATCHES_FORMS}")
    text = str(item).strip()
    share = PERCENT.match(text)
    if share:
        if not 0 < float(share.group(1)) <= 100:
            raise RolloutError(f"switch_engine_serial: {raw!r} - a share must be above 0 % and at most 100 %, got {text}")
        return text
    try:
        count = int(text)
    except ValueError:
        raise RolloutError(f"switch_engine_serial: {raw!r} - {text!r} is neither a node count nor a share; give {BATCHES_FORMS}") from None
    if count < 1:
        raise RolloutError(f"switch_engine_serial: {raw!r} - a batch needs at least 1 node (0 would switch every node at once, "
                           f"with no canary), got {count}")
    return count


def rollout_batches(value) -> list:
    """The batches as Ansible's ``serial`` takes them, from every form the README and playbook header show.

    A list ([1, "25%"]), a JSON or YAML list typed as a string ("[1, 4]"), a comma-separated string ("1,4"), or one
    batch (2, "25%"). Anything else, zero, negatives and shares outside (0, 100] are refused before a node is touched.
    """
    raw = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text.replace("'", '"'))
            except ValueError:
                raise RolloutError(f"switch_engine_serial: {raw!r} is not a list; give {BATCHES_FORMS}") from None
        else:
            value = [part for part in text.split(",") if part.strip()] if "," in text else [text]
    elif isinstance(value, (int, float)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RolloutError(f"switch_engine_serial: {raw!r} is not a batch or a list of batches; give {BATCHES_FORMS}")
    return [_batch(item, raw) for item in value]


def rollout_gate(reports: dict, max_fail_percentage) -> dict:
    """Whether the next batch may start: the failed share of the hosts tried so far against the allowed share.

    Hosts left ``not_reached`` by the gate itself were never tried and count neither way; hosts that became unreachable
    during their switch are reported ``unreachable`` and count as failed.
    """
    try:
        allowed = float(max_fail_percentage)
    except (TypeError, ValueError):
        raise RolloutError(f"switch_engine_max_fail_percentage: {max_fail_percentage!r} is not a number") from None
    if not 0 <= allowed <= 100:
        raise RolloutError(f"switch_engine_max_fail_percentage: must be between 0 and 100, got {max_fail_percentage!r}")
    tried = {host: report for host, report in (reports or {}).items() if report and report.get("result") != NOT_REACHED}
    failed = sorted(host for host, report in tried.items() if report.get("result") not in SWITCH_SUCCESSES)
    share = 100.0 * len(failed) / len(tried) if tried else 0.0
    stop = bool(failed) and share > allowed
    message = None
    if stop:
        named = ", ".join(f"{host} ({tried[host].get('result')})" for host in failed)
        message = (f"rollout stopped: {len(failed)} of {len(tried)} node(s) tried so far did not switch ({named}); "
                   f"{share:.0f} % is above switch_engine_max_fail_percentage {allowed:g} %")
    return {"stop": stop, "tried": len(tried), "failed": failed, "failed_percentage": round(share, 1), "message": message}
