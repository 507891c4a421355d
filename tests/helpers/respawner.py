"""A parent that starts its command again whenever it exits: an engine's escaped worker under a supervisor of the
engine's user that restarts it (a launcher, a Ray raylet, an elastic agent that outlived the unit). The fault
campaign's respawning worker, and the tests' (tests/functional/test_gpu_holders_kill.py).

    respawner.py [--witness FILE] [--pids FILE] [--user NAME] -- COMMAND...

Prints "ready <own pid> <first child's pid>" once the first child runs. Each catchable signal the parent receives is
written to --witness before it acts on it; SIGTERM, SIGINT and SIGHUP end the parent alone (its child gets its own
signals, as a real supervisor's does). Each child's pid is appended to --pids. With --user (started as root), the
parent runs as that user and keeps root only as its saved uid, to start each child as root: a child that opens root's
files before it drops to the user itself (gpu_holder.py --user) - the tests' stand-in device files are root's.
"""

from __future__ import annotations

import argparse
import os
import pwd
import signal
import subprocess
import sys
import time

RESPAWN_PAUSE = 0.2  # seconds between a child's exit and its successor's start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--witness")
    parser.add_argument("--pids")
    parser.add_argument("--user")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to keep running")

    # opened before a drop to --user: the files may be root's to reach
    witness = open(args.witness, "a", encoding="ascii") if args.witness else None  # noqa: SIM115 - kept open for its life
    pids = open(args.pids, "a", encoding="ascii") if args.pids else None  # noqa: SIM115

    def on_signal(signum, _frame):
        if witness:
            witness.write(signal.Signals(signum).name + "\n")
            witness.flush()
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os._exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(signum, on_signal)
    restore_root = None
    if args.user:
        account = pwd.getpwnam(args.user)
        os.setresgid(account.pw_gid, account.pw_gid, 0)
        os.setresuid(account.pw_uid, account.pw_uid, 0)

        def restore_root():
            os.setresuid(0, 0, 0)
            os.setresgid(0, 0, 0)
    first = True
    while True:
        child = subprocess.Popen(command, stdout=subprocess.PIPE if first else subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                 preexec_fn=restore_root)  # pylint: disable=subprocess-popen-preexec-fn  # regains root before its exec
        if pids:
            pids.write(f"{child.pid}\n")
            pids.flush()
        if first:
            child.stdout.readline()  # the child's own "ready" line: it holds what it was asked to
            print(f"ready {os.getpid()} {child.pid}", flush=True)
            first = False
        child.wait()
        time.sleep(RESPAWN_PAUSE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
