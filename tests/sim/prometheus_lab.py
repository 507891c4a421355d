"""A real Prometheus (Debian's) beside the lab, scraping each node's node_exporter through its port published on
127.0.0.1 and loading the alert rules the collection ships; every second, so that a scenario sees a run's metrics and
alerts within seconds.

    prometheus_lab.py start INVENTORY --port PORT    (writes BUILD/prometheus/, waits until it is ready)
    prometheus_lab.py stop INVENTORY
    prometheus_lab.py query INVENTORY EXPR           (prints the instant query's result as JSON)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "roles" / "monitoring" / "files" / "gpufleet-serving.rules.yml"


def nodes(inventory: Path) -> tuple[Path, dict[str, int]]:
    """The lab's directory and each node's published node_exporter port (gpufleet_lab_metrics_port)."""
    text = inventory.read_text()
    ports = {match[0]: int(match[1]) for match in re.findall(r"^(\S+) .*gpufleet_lab_metrics_port=(\d+)", text, re.M)}
    if not ports:
        raise SystemExit(f"{inventory}: no node publishes node_exporter (start the lab with --metrics-port)")
    return inventory.parent, ports


def start(inventory: Path, port: int) -> None:
    lab_dir, ports = nodes(inventory)
    work = lab_dir / "prometheus"
    stop(inventory)
    with socket.socket() as probe:  # another Prometheus there would answer our readiness check with its own data
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SystemExit(f"prometheus: 127.0.0.1:{port} is taken ({exc.strerror}); stop what listens there") from None
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    targets = [{"targets": [f"127.0.0.1:{node_port}"], "labels": {"instance": name}} for name, node_port in sorted(ports.items())]
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
              "scrape_configs": [{"job_name": "gpu_nodes", "static_configs": targets}]}
    (work / "prometheus.yml").write_text(json.dumps(config, indent=1))  # JSON is YAML
    log = (work / "prometheus.log").open("w")
    process = subprocess.Popen([shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={work / 'prometheus.yml'}",
                                f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (work / "pid").write_text(f"{process.pid}\n")
    (work / "port").write_text(f"{port}\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"prometheus exited {process.returncode}: {(work / 'prometheus.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as reply:
                if reply.status == 200:
                    print(f"prometheus: ready on 127.0.0.1:{port}, scraping {', '.join(sorted(ports))}")
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("prometheus did not become ready within 60 s")


def stop(inventory: Path) -> None:
    pid_file = inventory.parent / "prometheus" / "pid"
    if pid_file.exists():
        with contextlib.suppress(OSError, ValueError):  # gone already, or the file damaged
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20  # its port is free for the next lab once it has exited
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                time.sleep(0.1)
        pid_file.unlink()


def query(inventory: Path, expr: str) -> list:
    port = int((inventory.parent / "prometheus" / "port").read_text())
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)["data"]["result"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["start", "stop", "query"])
    parser.add_argument("inventory", type=Path)
    parser.add_argument("expr", nargs="?")
    parser.add_argument("--port", type=int, default=19090)
    args = parser.parse_args(argv)
    if args.command == "start":
        start(args.inventory, args.port)
    elif args.command == "stop":
        stop(args.inventory)
    else:
        print(json.dumps(query(args.inventory, args.expr)))


if __name__ == "__main__":
    main(sys.argv[1:])
