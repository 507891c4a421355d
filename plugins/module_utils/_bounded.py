# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Reads of /proc that a wedged process can block forever, each given a time box.

Reading another process's maps or cmdline takes its memory map's lock: a thread of that process stuck in the kernel
with the lock held (a hung driver ioctl, a fault on a hung network or FUSE mount), or queued for it behind such a
thread, blocks the reader too; stat()ing a file it holds on a hung FUSE mount blocks in the filesystem, past any
signal once the server has the request. A task's own state says nothing of this: its other threads hold the lock.
So a pass over many processes runs in a child process, which is left behind where it blocks (killed, never waited
for, holding none of our output) while a new one goes on after the item it blocked on; a single killable read
(cmdline, under the lock) runs in a thread instead.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A /proc read takes microseconds; one that takes half a second is waiting on something that may never come.
BOX_SECONDS = 0.5
POLL_SECONDS = 0.05
PROGRESS = struct.Struct("<qq")  # (item index, stage within it), written by the child, read by the parent


@dataclass
class PassResult:
    values: list[tuple[int, Any]] = field(default_factory=list)  # (item index, value sent), in the order sent
    blocked: dict[int, int] = field(default_factory=dict)  # item index -> the stage it blocked in


def run_pass(items: list, work: Callable[[Any, Callable[[Any], None], Callable[[int], None]], None],
             box: float = BOX_SECONDS) -> PassResult:
    """Call work(item, send, stage) for each item in a child process.

    send(value) hands a JSON value to the parent at once, so that what was found survives the child blocking later;
    stage(n) marks how far within the item the child got. An item that makes no progress for `box` seconds is given
    up (PassResult.blocked records it with its stage) and a new child goes on with the next one.
    """
    result = PassResult()
    start = 0
    while start < len(items):
        stuck = _one_child(items, start, work, box, result)
        if stuck is None:
            break
        result.blocked[stuck[0]] = stuck[1]
        start = stuck[0] + 1
    return result


def _one_child(items: list, start: int, work, box: float, result: PassResult) -> tuple[int, int] | None:
    progress = mmap.mmap(-1, PROGRESS.size)
    PROGRESS.pack_into(progress, 0, start, 0)
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # never returns into the caller
        _child(items, start, work, progress, from_child, to_parent)
    os.close(to_parent)
    try:
        return _follow(pid, from_child, progress, box, result)
    finally:
        os.close(from_child)
        progress.close()


def _child(items: list, start: int, work, progress: mmap.mmap, from_child: int, to_parent: int) -> None:
    code = 0
    try:
        os.close(from_child)
        # a child left blocked must hold none of the module's output open: whoever waits for its end would wait too
        devnull = os.open(os.devnull, os.O_RDWR)
        for descriptor in (0, 1, 2):
            os.dup2(devnull, descriptor)
        # nor anything else of the module's: a pipe to its NVML worker kept open would keep that worker waiting too
        # (the open ones, listed: closing up to the descriptor limit can be a million calls where close_range is missing)
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in (0, 1, 2, to_parent):
                with contextlib.suppress(OSError):
                    os.close(int(name))
        for index in range(start, len(items)):
            PROGRESS.pack_into(progress, 0, index, 0)

            def send(value, _index=index):
                _write_all(to_parent, json.dumps([_index, value]).encode() + b"\n")

            def stage(number, _index=index):
                PROGRESS.pack_into(progress, 0, _index, number)

            work(items[index], send, stage)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        code = 1
        with contextlib.suppress(OSError):
            _write_all(to_parent, json.dumps([-1, f"{type(exc).__name__}: {exc}"]).encode() + b"\n")
    finally:
        os._exit(code)


def _write_all(descriptor: int, data: bytes) -> None:
    while data:
        data = data[os.write(descriptor, data):]


def _follow(pid: int, from_child: int, progress: mmap.mmap, box: float, result: PassResult) -> tuple[int, int] | None:
    """Collect what the child sends until it ends (None), or give it up where it stopped moving ((index, stage))."""
    buffer = b""
    position = PROGRESS.unpack_from(progress, 0)
    moved = time.monotonic()
    while True:
        if select.select([from_child], [], [], POLL_SECONDS)[0]:
            chunk = os.read(from_child, 65536)
            if not chunk:
                _reap(pid, block=True)
                _take_lines(buffer + b"\n", result)
                return None
            buffer = _take_lines(buffer + chunk, result)
        now = time.monotonic()
        current = PROGRESS.unpack_from(progress, 0)
        if current != position:
            position, moved = current, now
        elif now - moved > box:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid, block=False)  # one stuck in the kernel is left to init once the module exits
            # what it sent before it blocked is still in the pipe (it holds the pipe open: no end of file to wait for)
            while select.select([from_child], [], [], 0)[0]:
                chunk = os.read(from_child, 65536)
                if not chunk:
                    break
                buffer += chunk
            _take_lines(buffer, result)
            return position


def _take_lines(buffer: bytes, result: PassResult) -> bytes:
    *lines, rest = buffer.split(b"\n")
    for line in lines:
        if not line:
            continue
        index, value = json.loads(line)
        if index < 0:
            raise RuntimeError(f"reading /proc failed in the scanning process: {value}")
        result.values.append((index, value))
    return rest


def _reap(pid: int, block: bool) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0 if block else os.WNOHANG)


def call_boxed(function: Callable[[], Any], box: float = BOX_SECONDS) -> tuple[bool, Any]:
    """(True, function()) - or (False, None) when it did not return within `box` seconds (its thread is left to
    finish or to die with the process: for reads whose wait a fatal signal ends). Its exceptions propagate."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="boxed-read").start()
    if not done.wait(box):
        return False, None
    if "error" in outcome:
        raise outcome["error"]
    return True, outcome["value"]
