"""Traffic for the simulated lab: HAProxy in front of the nodes, and a bounded load generator. Loopback only.

    python tests/sim/traffic.py haproxy-start INVENTORY --port 18000   HAProxy on 127.0.0.1:PORT, a server per node
    python tests/sim/traffic.py haproxy-stop INVENTORY
    python tests/sim/traffic.py load --url http://127.0.0.1:18000 --out RESULT.json [--clients 6] [--max-requests 20000]
                                     [--max-seconds 600] [--stop-file PATH]

HAProxy (Debian's, run as a plain process) reads the nodes from the lab inventory (each node's engine port published on
127.0.0.1, gpufleet_lab_http_port); its runtime API socket (level admin) is <lab dir>/haproxy.sock, where
community.general.haproxy drives it. Health checks (GET /health every second) take a dead server out as a balancer
would; connection failures are retried on another server (option redispatch), but a request an engine dies in the
middle of is the client's failure, as in production.

The load generator sends completions through HAProxy from --clients threads until --max-requests were sent,
--max-seconds passed or --stop-file exists, whichever comes first, and writes {sent, ok, failed, errors, seconds}.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

HAPROXY_CONFIG = """global
    stats socket {socket} mode 600 level admin
    pidfile {pidfile}
    daemon

defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 3
    option redispatch

frontend engines
    bind 127.0.0.1:{port}
    default_backend engines

backend engines
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server inter 1s fall 2 rise 1
{servers}
"""


def lab_nodes(inventory: Path) -> tuple[Path, dict[str, int]]:
    """The lab directory and each node's published engine port, from the lab's inventory."""
    nodes, lab_dir = {}, inventory.parent
    for line in inventory.read_text().splitlines():
        words = line.split()
        settings = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        if "gpufleet_lab_http_port" in settings:
            nodes[words[0]] = int(settings["gpufleet_lab_http_port"])
        if line.startswith("gpufleet_lab_dir="):
            lab_dir = Path(line.split("=", 1)[1])
    if not nodes:
        raise SystemExit(f"{inventory}: no node publishes its engine port (start the lab with --http-port)")
    return lab_dir, nodes


def haproxy_start(inventory: Path, port: int) -> None:
    lab_dir, nodes = lab_nodes(inventory)
    haproxy_stop(inventory, quiet=True)
    servers = "\n".join(f"    server {name} 127.0.0.1:{node_port} check" for name, node_port in sorted(nodes.items()))
    config = lab_dir / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(socket=lab_dir / "haproxy.sock", pidfile=lab_dir / "haproxy.pid", port=port, servers=servers))
    subprocess.run(["haproxy", "-c", "-q", "-f", str(config)], check=True)
    subprocess.run(["haproxy", "-f", str(config)], check=True)
    print(f"haproxy: 127.0.0.1:{port} -> {', '.join(f'{n} 127.0.0.1:{p}' for n, p in sorted(nodes.items()))}; socket {lab_dir / 'haproxy.sock'}")


def haproxy_stop(inventory: Path, quiet: bool = False) -> None:
    lab_dir, _nodes = lab_nodes(inventory)
    pidfile = lab_dir / "haproxy.pid"
    if pidfile.exists():
        for pid in pidfile.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)
        pidfile.unlink()
        if not quiet:
            print("haproxy: stopped")


class Load:
    def __init__(self, url: str, model: str, max_requests: int, max_seconds: float, stop_file: Path | None):
        parts = urlsplit(url)
        if not ipaddress.ip_address(parts.hostname).is_loopback:
            raise SystemExit(f"--url must be a loopback address, got {parts.hostname}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.model, self.max_requests, self.max_seconds, self.stop_file = model, max_requests, max_seconds, stop_file
        self.lock = threading.Lock()
        self.sent = self.ok = self.failed = 0
        self.errors: dict[str, int] = {}
        self.failures: list[dict] = []
        self.started = time.monotonic()
        self.body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 8}).encode()

    def more(self) -> bool:
        with self.lock:
            if self.sent >= self.max_requests or time.monotonic() - self.started >= self.max_seconds:
                return False
            if self.stop_file is not None and self.stop_file.exists():
                return False
            self.sent += 1
            return True

    def record(self, error: str | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
                return
            self.failed += 1
            self.errors[error] = self.errors.get(error, 0) + 1
            if len(self.failures) < 20:
                self.failures.append({"at_s": round(time.monotonic() - self.started, 2), "error": error})

    def client(self) -> None:
        connection = None
        while self.more():
            try:
                if connection is None:
                    connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
                connection.request("POST", "/v1/completions", self.body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                self.record(None if response.status == 200 else f"HTTP {response.status}")
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                self.record(type(exc).__name__)
                if connection is not None:
                    connection.close()
                connection = None

    def run(self, clients: int) -> dict:
        threads = [threading.Thread(target=self.client, daemon=True) for _client in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {"sent": self.sent, "ok": self.ok, "failed": self.failed, "errors": self.errors, "first_failures": self.failures,
                "seconds": round(time.monotonic() - self.started, 2), "clients": clients}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("haproxy-start", "haproxy-stop"):
        command = sub.add_parser(name)
        command.add_argument("inventory", type=Path)
        if name == "haproxy-start":
            command.add_argument("--port", type=int, default=18000)
    load = sub.add_parser("load")
    load.add_argument("--url", required=True)
    load.add_argument("--model", default="llama70b")
    load.add_argument("--out", type=Path, required=True)
    load.add_argument("--clients", type=int, default=6)
    load.add_argument("--max-requests", type=int, default=20000)
    load.add_argument("--max-seconds", type=float, default=600)
    load.add_argument("--stop-file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "haproxy-start":
        haproxy_start(args.inventory, args.port)
    elif args.command == "haproxy-stop":
        haproxy_stop(args.inventory)
    else:
        if not 1 <= args.clients <= 64 or args.max_requests < 1 or args.max_seconds <= 0:
            parser.error("--clients 1-64, --max-requests at least 1, --max-seconds above 0")
        result = Load(args.url, args.model, args.max_requests, args.max_seconds, args.stop_file).run(args.clients)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({key: result[key] for key in ("sent", "ok", "failed", "seconds")}))


if __name__ == "__main__":
    main()
