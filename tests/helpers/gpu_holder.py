"""A process that holds (simulated) GPU device files the way engine workers do; used by the tests and the lab.

It opens and/or maps the files it is given, optionally records simulated NVML memory for itself, then prints
"ready <pid>" and waits. Faults are switched on by flags: ignore SIGTERM, drain for a while on SIGTERM, fork a
child that inherits the files (NVML keeps listing the parent), exit the leader thread while a worker thread
keeps the files (a zombie leader with a live thread), change its comm, wait in killable D state (a vfork parent
whose child blocks before exec; glibc blocks every signal but SIGKILL meanwhile).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import pwd
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sim"))

PR_SET_NAME = 15


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--open", nargs="*", default=[], help="files to keep open")
    parser.add_argument("--mmap", nargs="*", default=[], help="files to map, then close")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--drain", type=float, default=0.0, help="seconds to keep running after SIGTERM")
    parser.add_argument("--comm", help="set the kernel command name (cut at 15 characters)")
    parser.add_argument("--sim-root", help="simulated NVML root for --alloc")
    parser.add_argument("--alloc", nargs="*", default=[], help="GPU:MIB to record as used by this process")
    parser.add_argument("--fork-child", action="store_true", help="fork a child that inherits everything; print both pids")
    parser.add_argument("--zombie-leader", action="store_true", help="leader thread exits, a worker thread keeps the files")
    parser.add_argument("--vfork-blocked", metavar="FIFO",
                        help="after 'ready', posix_spawn a child that blocks opening FIFO: the parent waits in killable D state")
    parser.add_argument("--user", help="once the files are held, run as this user (another user's job, an engine's worker)")
    parser.add_argument("extra", nargs="*", help="ignored words (decoys put engine names here)")
    return parser.parse_args(argv)


def hold(args: argparse.Namespace) -> list:
    kept = []
    for path in args.open:
        kept.append(open(path, "rb"))  # noqa: SIM115 - held for the process's lifetime
    for path in args.mmap:
        kept.append(map_then_close(path))
    return kept


def map_then_close(path: str) -> int:
    """mmap through libc: Python's mmap object keeps a dup of the fd, a real mmap-only holder does not."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open(path, os.O_RDONLY)
    address = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap {path} failed")
    return address


def on_term(drain: float):
    def handler(_signum, _frame):
        time.sleep(drain)
        os._exit(0)
    return handler


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.comm:
        ctypes.CDLL(None).prctl(PR_SET_NAME, args.comm.encode(), 0, 0, 0)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.drain:
        signal.signal(signal.SIGTERM, on_term(args.drain))
    kept = hold(args)
    child = os.fork() if args.fork_child else None
    if child == 0:
        while True:
            time.sleep(3600)
    holders = [os.getpid()] + ([child] if child else [])
    if args.alloc:
        import nvml_sim

        for spec in args.alloc:
            gpu, mib = spec.split(":")
            nvml_sim.allocate(args.sim_root, int(gpu), int(mib), holders, reported_pid=os.getpid())
    if args.user:  # after the files and the simulated allocation, which need root
        account = pwd.getpwnam(args.user)
        os.setgroups([])
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)
    print("ready", *holders, flush=True)
    if args.zombie_leader:
        worker = threading.Thread(target=lambda: (kept, time.sleep(1e6)))
        worker.start()
        ctypes.CDLL(None).pthread_exit(None)
    if args.vfork_blocked:
        # the child inherits the files and blocks in open() before exec; the parent sleeps in vfork until then
        os.posix_spawn("/bin/true", ["true"], os.environ, file_actions=[(os.POSIX_SPAWN_OPEN, 200, args.vfork_blocked, os.O_RDONLY, 0)])
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1:])
