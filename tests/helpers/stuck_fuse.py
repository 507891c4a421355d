"""A FUSE filesystem that stops answering: the kernel-level hang of a wedged network or bucket mount.

Mounted over the raw /dev/fuse protocol (no libfuse), it serves two files:
- `pages`: lookup, attributes and open answer at once; every READ is held unanswered. A thread that faults one of
  its pages in through /proc/self/mem waits for the answer with its process's memory map lock held for read.
- `frozen`: lookup and open answer, but its attributes are never cached and every GETATTR is held: stat() of a
  descriptor open on it, from any process, waits forever.
A request we have taken is waited for past any signal, as with a real hung server.

    stuck_fuse.py MOUNTPOINT      prints "ready" once mounted; SIGTERM ends it

Ending it closes /dev/fuse, which aborts the connection: every held request fails and its waiter wakes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
import struct
import sys

FUSE_ROOT_ID = 1
PAGES_ID = 2
FROZEN_ID = 3
FILES = {b"pages": PAGES_ID, b"frozen": FROZEN_ID}
PAGES_SIZE = 1 << 20
MAX_WRITE = 1 << 17
READ_BUFFER = MAX_WRITE + 4096  # the kernel refuses a read into less than a whole write request
MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2

LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, OPENDIR, RELEASEDIR, INTERRUPT, BATCH_FORGET = (
    1, 2, 3, 14, 15, 18, 25, 26, 27, 29, 36, 42)
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)  # an interrupt of a held READ is ignored: the READ stays held

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode nlink uid gid rdev blksize flags
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # major minor max_readahead flags ... max_pages map_alignment flags2 depth


def attr(node: int) -> bytes:
    if node == FUSE_ROOT_ID:
        return ATTR.pack(node, 0, 0, 0, 0, 0, 0, 0, 0, stat.S_IFDIR | 0o755, 2, 0, 0, 0, 4096, 0)
    return ATTR.pack(node, PAGES_SIZE, PAGES_SIZE // 512, 0, 0, 0, 0, 0, 0, stat.S_IFREG | 0o644, 1, 0, 0, 0, 4096, 0)


def answer(device: int, unique: int, payload: bytes = b"", error: int = 0) -> None:
    os.write(device, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)


def serve(device: int) -> None:
    held = []  # the requests never answered
    while True:
        try:
            request = os.read(device, READ_BUFFER)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.ENOENT):  # ENOENT: an interrupted request was withdrawn
                continue
            if exc.errno == errno.ENODEV:  # unmounted
                return
            raise
        _length, opcode, unique, node, *_ids = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size:]
        if opcode in NO_REPLY:
            continue
        if opcode == INIT:
            major, minor = struct.unpack_from("<II", body)
            answer(device, unique, INIT_OUT.pack(major, min(minor, 31), 1 << 17, 0, 16, 12, MAX_WRITE, 1, 32, 0, 0, 0))
            print("ready", flush=True)
        elif opcode == LOOKUP:
            found = FILES.get(body.rstrip(b"\0")) if node == FUSE_ROOT_ID else None
            if found is None:
                answer(device, unique, error=errno.ENOENT)
            else:
                attr_valid = 0 if found == FROZEN_ID else 3600  # frozen: every stat() asks again
                answer(device, unique, struct.pack("<QQQQII", found, 0, 3600, attr_valid, 0, 0) + attr(found))
        elif opcode == GETATTR:
            if node == FROZEN_ID:
                held.append(unique)
            else:
                answer(device, unique, struct.pack("<QII", 3600, 0, 0) + attr(node))
        elif opcode in (OPEN, OPENDIR):
            answer(device, unique, struct.pack("<QIi", 0, 0, 0))
        elif opcode in (RELEASE, RELEASEDIR, FLUSH):
            answer(device, unique)
        elif opcode == READ:
            held.append(unique)  # never answered
        else:
            answer(device, unique, error=errno.ENOSYS)


def main(mountpoint: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    device = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = f"fd={device},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"gpufleet-stuck", mountpoint.encode(), b"fuse", MS_NOSUID | MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a FUSE filesystem on {mountpoint} failed")

    def finish(_signum, _frame):
        libc.umount2(mountpoint.encode(), MNT_DETACH)
        os._exit(0)  # closing /dev/fuse aborts the connection: the held READs fail, their waiters wake

    signal.signal(signal.SIGTERM, finish)
    serve(device)


if __name__ == "__main__":
    main(sys.argv[1])
