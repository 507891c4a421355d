"""A process that holds (simulated) GPU device files the way engine workers do; used by the tests and the lab.

It opens and/or maps the files it is given, optionally records simulated NVML memory for itself, then prints
"ready <pid>" and waits. Faults are switched on by flags: ignore SIGTERM, drain for a while on SIGTERM, fork a
child that inherits the files (NVML keeps listing the parent), exit the leader thread while a worker thread
keeps the files (a zombie leader with a live thread), change its comm, wait in killable D state (a vfork parent
whose child blocks before exec; glibc blocks every signal but SIGKILL meanwhile), hold a file on a hung mount
(--open-hung: stat() of that descriptor never returns), or wedge its own memory map (--wedged-mm, below).
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
    parser.add_argument("--open-hung", metavar="FILE", help="also keep FILE open without stat()ing it (a file on a hung mount)")
    parser.add_argument("--witness", metavar="FILE",
                        help="write the name of every catchable signal received to FILE, one a line, before acting on it (E9's witness)")
    parser.add_argument("--hung-first", action="store_true", help="open the --open-hung file before the devices (a lower descriptor)")
    parser.add_argument("--wedged-mm", metavar="FILE",
                        help="wedge the memory map lock on a page of FILE (on a mount that never answers reads); see wedge_memory_map")
    parser.add_argument("--thread", action="store_true", help="start a second thread before 'ready' (its id in /proc/<pid>/task)")
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


def wedge_memory_map(path: str) -> threading.Event:
    """As a thread stuck in a driver ioctl does: one thread faults a page of `path` in through /proc/self/mem, which
    holds this process's memory map lock for read while the mount does not answer; once we are ready, a second thread
    asks for the lock for write (mmap) and waits behind it. From then on no reader gets the lock: reading this
    process's /proc/<pid>/cmdline (and, where the kernel reads maps under the lock, maps) blocks, while the leader
    sleeps in an ordinary S state. The faulting thread ends only when the mount answers or is aborted."""
    libc = ctypes.CDLL(None, use_errno=True)
    address = map_then_close(path)
    locker = threading.Event()
    # created now: creating a thread maps its stack, which would wait for the lock too
    writer = threading.Thread(target=lambda: (locker.wait(), libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)),
                              daemon=True)
    writer.start()
    memory = os.open("/proc/self/mem", os.O_RDONLY)
    reader = threading.Thread(target=lambda: os.pread(memory, 1, address), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while read_wchan(reader.native_id) != "request_wait_answer":
        if time.monotonic() > deadline:
            raise SystemExit(f"the faulting thread never waited on {path} (wchan {read_wchan(reader.native_id)!r})")
        time.sleep(0.01)
    return locker


def read_wchan(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/wchan", encoding="ascii") as wchan:
        return wchan.read()


# every signal a process can catch (SIGKILL and SIGSTOP cannot be: their witnesses are death and the stopped state)
WITNESSED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGCONT", "SIGTSTP", "SIGTTIN",
             "SIGTTOU", "SIGWINCH", "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF")


def witness(path: str, ignore_term: bool) -> None:
    """Write down each catchable signal as it arrives, with its sender ("SIGTERM 4242", one a line); then act as the
    default would for SIGTERM and SIGINT (exit), unless told to ignore SIGTERM. Nothing else ends or stops the process:
    a stray signal is recorded, not obeyed. The signals are blocked in every thread and taken by sigwaitinfo(2) in a
    thread of its own: in the order the kernel queued them, with the sender's pid (a Python handler sees neither)."""
    record = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    watched = {getattr(signal, name) for name in WITNESSED}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # before any other thread starts: they inherit the mask

    def watch() -> None:
        while True:
            info = signal.sigwaitinfo(watched)
            os.write(record, f"{signal.Signals(info.si_signo).name} {info.si_pid}\n".encode())
            if info.si_signo == signal.SIGINT or (info.si_signo == signal.SIGTERM and not ignore_term):
                os._exit(0)

    threading.Thread(target=watch, name="signal-witness", daemon=True).start()


def on_term(drain: float):
    def handler(_signum, _frame):
        time.sleep(drain)
        os._exit(0)
    return handler


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.comm:
        ctypes.CDLL(None).prctl(PR_SET_NAME, args.comm.encode(), 0, 0, 0)
    if args.witness:
        witness(args.witness, args.ignore_term)
    elif args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif args.drain:
        signal.signal(signal.SIGTERM, on_term(args.drain))
    # os.open: Python's open() would stat() it, and wait forever
    early = [os.open(args.open_hung, os.O_RDONLY)] if args.open_hung and args.hung_first else []
    kept = early + hold(args)
    if args.open_hung and not args.hung_first:
        kept.append(os.open(args.open_hung, os.O_RDONLY))
    locker = wedge_memory_map(args.wedged_mm) if args.wedged_mm else None
    child = os.fork() if args.fork_child else None
    if child == 0:
        while True:
            time.sleep(3600)
    holders = [os.getpid()] + ([child] if child else [])
    if args.alloc:
        import nvml_sim

        for spec in args.alloc:
            gpu, mib = spec.split(":")
            try:
                nvml_sim.allocate(args.sim_root, int(gpu), int(mib), holders, reported_pid=os.getpid())
            except nvml_sim.OutOfMemory as exc:  # as a real GPU refuses it
                print(exc, file=sys.stderr, flush=True)
                sys.exit(1)
    if args.user:  # after the files and the simulated allocation, which need root
        account = pwd.getpwnam(args.user)
        os.setgroups([])
        os.setgid(account.pw_gid)
        os.setuid(account.pw_uid)
    if args.thread:
        threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()
    print("ready", *holders, flush=True)
    if locker is not None:
        locker.set()  # after the last line we print: from here on this process may wait on its memory map itself
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
