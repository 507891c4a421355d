# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""HAProxy's runtime API (the admin socket): put a server back in rotation now, without waiting for its health checks.

The caller has just seen the engine serve (readiness and a completion): forcing the server's health up spares the
`rise x inter` seconds HAProxy's own checks would take to find that out; the checks keep running and take the server
out again if it stops answering.
"""

from __future__ import annotations

import csv
import io
import socket

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, poll_until

NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


def checked_name(kind: str, name: str) -> str:
    """HAProxy proxy and server names; anything else could smuggle a second command onto the socket."""
    if not name or not set(name) <= NAME_CHARACTERS:
        raise InvalidInput(f"{kind}: {name!r} is not a HAProxy name (letters, digits, '-', '_', '.', ':')")
    return name


class AdminSocket:
    """One command per connection, as HAProxy's non-interactive mode answers it."""

    def __init__(self, path: str, timeout: float = 5.0):
        self.path = path
        self.timeout = timeout

    def command(self, line: str) -> str:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.settimeout(self.timeout)
                connection.connect(self.path)
                connection.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
        except OSError as exc:
            raise CommandFailed(f"HAProxy admin socket {self.path}: {exc}") from None
        return b"".join(chunks).decode(errors="replace")


def server_status(stat_csv: str, backend: str, server: str) -> str | None:
    """The `status` column of `show stat` for backend/server (UP, UP 1/2, DOWN, MAINT, DRAIN, NOLB ...); None if absent."""
    text = stat_csv.lstrip("# ")
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") == backend and row.get("svname") == server:
            return row.get("status")
    return None


def serving(status: str | None) -> bool:
    """UP, or going down but still taking requests (`UP 1/2`: one check failed of fall)."""
    return bool(status) and status.split(" ")[0] == "UP"


def join(admin: AdminSocket, backend: str, server: str, timeout: float, clock: Clock | None = None) -> dict:
    """Out of maintenance or drain, health forced up, then wait (to ``timeout``) until HAProxy shows it serving."""
    before = server_status(admin.command("show stat"), backend, server)
    if before is None:
        raise CheckFailed(f"HAProxy has no server {backend}/{server}", status=None)
    for line in (f"set server {backend}/{server} state ready", f"set server {backend}/{server} health up"):
        answer = admin.command(line).strip()
        if answer:  # HAProxy answers these with nothing on success
            raise CommandFailed(f"HAProxy refused '{line}': {answer}", status=before)
    outcome = poll_until(lambda: server_status(admin.command("show stat"), backend, server), serving, timeout, 0.1, clock=clock)
    result = {"status_before": before, "status": outcome.value, "changed": before != outcome.value, "elapsed": outcome.elapsed}
    if not outcome.satisfied:
        raise CheckFailed(f"HAProxy shows {backend}/{server} {outcome.value} {outcome.elapsed:.1f} s after it was put back in rotation", **result)
    return result
