# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A host-wide flock with a bounded wait; the kernel drops it when its holder dies, so it never goes stale."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import LockTimeout
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, Deadline

LOCK_DIRECTORY = "/run/lock" if os.path.isdir("/run/lock") else "/tmp"
RETRY_SECONDS = 0.05


def lock_path(name: str) -> str:
    return os.path.join(LOCK_DIRECTORY, f"gpufleet-serving.{name}.lock")


@contextmanager
def host_lock(path: str, timeout: float, clock: Clock | None = None):
    """Hold an exclusive flock on path; raise LockTimeout naming the holder after `timeout` seconds."""
    clock = clock or Clock()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = Deadline(timeout, clock)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise LockTimeout(f"another run holds {path} (pid {holder}); waited {timeout:g}s", lock_path=path, lock_holder=holder) from None
                clock.sleep(min(RETRY_SECONDS, deadline.remaining()))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
