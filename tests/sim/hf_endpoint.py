"""A Hugging Face compatible endpoint on 127.0.0.1 serving local model repositories, for the real huggingface_hub client.

    python tests/sim/hf_endpoint.py --root DIR [--port 0] [--rate-mib 0] [--log FILE] [--hold FILE]

DIR/<org>/<name>/ holds a repository's files (revision "main"). What the client asks for: the repository's metadata
(GET /api/models/<org>/<name>[/revision/<rev>]: commit sha and every file with its size), and each file
(its tree: GET /api/models/<org>/<name>/tree/<rev>; HEAD and GET /<org>/<name>/resolve/<rev>/<file>, with ETag,
the commit and Range for resumed downloads). --rate-mib slows every response down to that many MiB/s, so that a
download can be interrupted halfway. While the --hold file exists, each file body stops once it has sent the MiB the
file says (none: at once) - a test holds a download halfway whatever its machine's pace. Prints "listening PORT".
Serves loopback only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

REPO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
CHUNK = 1 << 16


def commit_of(directory: Path) -> str:
    """A stable 40-hex commit for a repository: its file names and sizes."""
    digest = hashlib.sha1()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            digest.update(f"{path.relative_to(directory)}:{path.stat().st_size}\n".encode())
    return digest.hexdigest()


def etag_of(path: Path) -> str:
    status = path.stat()
    return hashlib.sha256(f"{path}:{status.st_size}:{status.st_mtime_ns}".encode()).hexdigest()


class Handler(BaseHTTPRequestHandler):
    root: Path
    rate: float  # bytes per second; 0 for no limit
    log: Path | None  # one line per file body sent: "<repo> <file>" (which files a client fetched)
    hold: Path | None  # while this file exists, file bodies stop where they are (a test's pause, no race with a pace)

    def log_message(self, *_args) -> None:  # quiet
        return

    def repository(self, repo: str) -> Path | None:
        directory = (self.root / repo).resolve()
        return directory if directory.is_dir() and self.root.resolve() in directory.parents else None

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self.answer(body=False)

    def answer(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        info = REPO.match(path)
        if info:
            directory = self.repository(info["repo"])
            if directory is None:
                return self.fail(404, "Repository not found")
            siblings = [{"rfilename": str(p.relative_to(directory)), "size": p.stat().st_size}
                        for p in sorted(directory.rglob("*")) if p.is_file()]
            document = json.dumps({"id": info["repo"], "modelId": info["repo"], "sha": commit_of(directory), "private": False,
                                   "siblings": siblings, "usedStorage": sum(s["size"] for s in siblings)}).encode()
            return self.send(200, {"Content-Type": "application/json"}, document if body else None, len(document))
        tree = TREE.match(path)
        if tree:
            directory = self.repository(tree["repo"])
            if directory is None:
                return self.fail(404, "Repository not found")
            entries = [{"type": "file", "path": str(p.relative_to(directory)), "size": p.stat().st_size, "oid": etag_of(p)[:40]}
                       for p in sorted(directory.rglob("*")) if p.is_file()]
            document = json.dumps(entries).encode()
            return self.send(200, {"Content-Type": "application/json"}, document if body else None, len(document))
        resolve = RESOLVE.match(path)
        if not resolve:
            return self.fail(404, "Entry not found")
        directory = self.repository(resolve["repo"])
        target = (directory / resolve["file"]).resolve() if directory else None
        if target is None or not target.is_file() or directory not in target.parents:
            return self.fail(404, "Entry not found")
        size = target.stat().st_size
        start = 0
        ranged = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if ranged:
            start = min(int(ranged[1]), size)
        headers = {"ETag": f'"{etag_of(target)}"', "X-Repo-Commit": commit_of(directory), "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if ranged:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        self.send(206 if ranged else 200, headers, None, size - start)
        if body:
            if self.log:
                with self.log.open("a", encoding="utf-8") as log:
                    log.write(f"{resolve['repo']} {resolve['file']}\n")
            self.stream(target, start)

    def held_after(self) -> int | None:
        """Bytes a body may send before it stops, while the hold file exists (its content: MiB; empty: none)."""
        if self.hold is None:
            return None
        try:
            words = self.hold.read_text(encoding="ascii").split()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError):
            return 0
        return int(float(words[0]) * 2**20) if words and words[0].replace(".", "", 1).isdigit() else 0

    def stream(self, target: Path, start: int) -> None:
        with target.open("rb") as source:
            source.seek(start)
            began, sent = time.monotonic(), 0
            while chunk := source.read(CHUNK):
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return
                sent += len(chunk)
                while (held := self.held_after()) is not None and sent >= held:
                    time.sleep(0.1)
                    began += 0.1  # the pause is not owed to the rate
                if self.rate:
                    ahead = sent / self.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    def send(self, status: int, headers: dict, document: bytes | None, length: int) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if document:
            self.wfile.write(document)

    def fail(self, status: int, message: str) -> None:
        document = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Code", "RepoNotFound" if "Repository" in message else "EntryNotFound")
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", str(len(document)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(document)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rate-mib", type=float, default=0)
    parser.add_argument("--log", help="append '<repo> <file>' for each file body sent")
    parser.add_argument("--hold", help="while this file exists, file bodies stop after the MiB it says (none: where they are)")
    args = parser.parse_args(argv)
    handler = type("RepositoryHandler", (Handler,), {"root": Path(args.root), "rate": args.rate_mib * (1 << 20),
                                                     "log": Path(args.log) if args.log else None,
                                                     "hold": Path(args.hold) if args.hold else None})
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    print(f"listening {server.server_address[1]}", flush=True)
    os.environ.pop("HF_TOKEN", None)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
