"""An independent witness of the signals a lab process receives: who sent which signal, when, written by the receiver.

The collection journals every signal it sends (plugins/module_utils/_processes/journal.py); the fault campaign (tests/chaos)
compares that journal with what the processes themselves saw. A Python signal handler cannot see the sender, so the
witness blocks the signals it watches in every thread and takes them with sigwaitinfo(2) in a thread of its own, which
gives the sender's pid and uid. SIGKILL and SIGSTOP cannot be caught: their witnesses are death and the stopped state.
SIGCONT's effect (a stopped process runs again) happens when it is sent, blocked or not; the witness only records it.

On a lab node the directory is /run/gpufleet-sim/signals (mode 1777, made at each boot by node_setup.py; the engine
units may write under /run/gpufleet-sim, and a restart of the node starts it empty).
Call install() before the process starts any other thread: threads inherit the blocked mask from their creator.
A child started afterwards inherits it too (the lab's engine workers install their own witness).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

WATCHED = (signal.SIGTERM, signal.SIGINT, signal.SIGCONT, signal.SIGHUP)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), as the journal records it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as name:
            return name.read().strip()
    except OSError:
        return None


def install(directory: str, role: str, on_signal) -> None:
    """Record each watched signal to a file of this process's own under ``directory`` (one JSON line, one append: the
    engines run as users of their own, and the directory is writable by all), then call ``on_signal(signum)``."""
    pid = os.getpid()
    started = start_time(pid)
    record = os.open(os.path.join(directory, f"{pid}-{started}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)

    def watch() -> None:
        while True:
            info = signal.sigwaitinfo(WATCHED)
            line = {"at": round(time.time(), 6), "pid": pid, "start_time": started, "role": role,
                    "signal": signal.Signals(info.si_signo).name, "sender": info.si_pid, "sender_uid": info.si_uid,
                    "sender_comm": comm(info.si_pid) if info.si_pid else None}
            os.write(record, (json.dumps(line, sort_keys=True) + "\n").encode())
            on_signal(info.si_signo)

    threading.Thread(target=watch, name="signal-witness", daemon=True).start()


def read(directory: str) -> list[dict]:
    """Every signal witnessed under ``directory``, in the order they came."""
    lines = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                for text in handle:
                    try:
                        lines.append(json.loads(text))
                    except ValueError:
                        continue  # a line cut by a crash mid-write
        except OSError:
            continue
    return sorted(lines, key=lambda line: line["at"])
