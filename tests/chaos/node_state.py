"""What a lab node really is, read on the node by the fault campaign's checker (tests/chaos/campaign.py): one JSON
object on stdout. Run as root with the node's own Python:

    python3 /opt/gpufleet-tests/chaos/node_state.py

Nothing here reads the collection's reports; its node files (the lease, the parked hold, the journal) are read as
files, for what they are on disk. "serving" is an engine that answers a completion; "parked" one whose process lives
and refuses completions while its standby says so.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))
import nvml_sim  # noqa: E402
import signal_witness  # noqa: E402

ENGINES = {"vllm": 8000, "sglang": 30000}  # the engines' own default ports
NVML_ROOT = Path("/run/gpufleet-sim/nvml")
WITNESS_DIR = "/run/gpufleet-sim/signals"
JOURNAL = Path("/var/log/gpufleet-serving/signals.jsonl")
LOCK_DIR = Path("/run/lock")
HOLD_DIR = Path("/run/gpufleet-serving/parked")
PARKED_RECORD = Path("/var/lib/gpufleet-serving/parked.json")
FOREIGN = Path("/run/gpufleet-chaos/foreign.json")  # the campaign's foreign jobs: [{"pid", "start_time", "witness"}]
ESCAPED = Path("/run/gpufleet-chaos/escaped.json")  # the campaign's escaped engine workers, the same shape
RESPAWNED = Path("/run/gpufleet-chaos/respawned.pids")  # the workers a respawning one's parent started, one pid a line


def unit(name: str) -> dict:
    shown = subprocess.run(["systemctl", "show", name, "-p", "ActiveState,SubState,MainPID,UnitFileState,NRestarts,ExecStart,ControlGroup"],
                           capture_output=True, text=True, check=False).stdout
    fields = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    argv = re.search(r"argv\[\]=(.*?) ;", fields.get("ExecStart", ""))
    return {"active": fields.get("ActiveState"), "sub": fields.get("SubState"), "main_pid": int(fields.get("MainPID") or 0),
            "enabled": fields.get("UnitFileState"), "restarts": int(fields.get("NRestarts") or 0),
            "argv": shlex.split(argv.group(1)) if argv else [], "cgroup": fields.get("ControlGroup") or None}


def option(argv: list[str], name: str) -> str | None:
    for index, word in enumerate(argv):
        if word == name and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def api_key(engine: str) -> str | None:
    try:
        text = Path(f"/etc/gpufleet/{engine}.secrets").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^(?:VLLM_API_KEY|SGLANG_API_KEY|API_KEY)=(.+)$", text, re.MULTILINE)
    return match.group(1).strip().strip('"') if match else None


def answers(engine: str, argv: list[str]) -> dict:
    """Does it answer a completion (serving), and does its standby say it sleeps (parked)?"""
    port = int(option(argv, "--port") or ENGINES[engine])
    host = option(argv, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    key = option(argv, "--api-key") or api_key(engine)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    body = json.dumps({"model": option(argv, "--served-model-name") or "", "prompt": "ping", "max_tokens": 1}).encode()
    state = {"port": port, "completion": None, "sleeping": None}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/v1/completions", body, headers), timeout=3) as reply:
            state["completion"] = reply.status
    except urllib.error.HTTPError as exc:
        state["completion"] = exc.code
    except OSError:
        state["completion"] = None
    if engine == "vllm":
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/is_sleeping", headers=headers), timeout=3) as reply:
                state["sleeping"] = bool(json.loads(reply.read() or b"{}").get("is_sleeping"))
        except (OSError, ValueError):
            pass
    return state


def engine_processes() -> list[dict]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not any(b"engine_double.py" in word or b"sglang.launch_server" in word for word in cmdline):
                continue
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cgroup = Path(f"/proc/{pid}/cgroup").read_text().strip().split("::")[-1]
            uid = int(re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE).group(1))
        except (OSError, AttributeError):
            continue
        found.append({"pid": pid, "state": stat[0], "ppid": int(stat[1]), "start_time": int(stat[19]), "uid": uid, "cgroup": cgroup,
                      "worker": b"__worker__" in cmdline})
    return found


def gpu_memory() -> list[dict]:
    """Each allocation on the simulated GPUs that still counts (a holder lives, or it leaked), with its holders."""
    allocations = []
    for path in sorted((NVML_ROOT / "alloc").glob("[!.]*")):
        try:
            words = path.read_text(encoding="ascii").split()
        except OSError:
            continue
        fields = dict(word.split("=", 1) for word in words if "=" in word)
        holders = [word[len("holder="):] for word in words if word.startswith("holder=")]
        alive = [holder for holder in holders if nvml_sim._holder_alive(holder)]
        if alive or fields.get("leak") == "1":
            allocations.append({"gpu": int(fields.get("gpu", -1)), "mib": int(fields.get("mib", 0)), "holders": alive, "leak": fields.get("leak") == "1"})
    return allocations


def leases() -> list[dict]:
    held = []
    for path in LOCK_DIR.glob("gpufleet-serving.*.lease"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            held.append({"name": path.name, "unreadable": True})
            continue
        expires_in = round(record.get("expires", 0) - time.clock_gettime(time.CLOCK_BOOTTIME), 1)
        held.append({"name": path.name, "owner": record.get("owner"), "expires_in": expires_in,
                     "same_boot": record.get("boot_id") == Path("/proc/sys/kernel/random/boot_id").read_text().strip()})
    return held


def campaign_jobs(path: Path) -> list[dict]:
    """The processes the campaign started on the node, alive or not, and the signals each one's witness wrote down."""
    try:
        jobs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    for job in jobs:
        job["alive"] = signal_witness.start_time(job["pid"]) == job["start_time"]
        job["signals"] = witnessed_signals(Path(job["witness"]))
    return jobs


def witnessed_signals(path: Path) -> list[str]:
    """The signal names a witness wrote down, in order: a holder writes "SIGTERM <sender pid>", the respawner the name."""
    if not path.exists():
        return []
    return [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def journal(since: float) -> list[dict]:
    lines = []
    try:
        for text in JOURNAL.read_text(encoding="utf-8").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if line.get("time", 0) >= since:
                lines.append(line)
    except OSError:
        pass
    return lines


def main(argv: list[str]) -> None:
    since = float(argv[0]) if argv else 0.0
    units = {engine: unit(f"{engine}.service") for engine in ENGINES}
    state = {
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        # a lab node is a container: its restart keeps the host kernel's boot id, and starts its PID 1 again
        "init_start": Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19],
        "units": units,
        "answers": {engine: answers(engine, units[engine]["argv"]) for engine in ENGINES if units[engine]["active"] == "active"},
        "processes": engine_processes(),
        "gpu_memory": gpu_memory(),
        "leases": leases(),
        "holds": sorted(path.name for path in HOLD_DIR.glob("*")) if HOLD_DIR.is_dir() else [],
        "parked_record": json.loads(PARKED_RECORD.read_text()) if PARKED_RECORD.exists() else None,
        "foreign": campaign_jobs(FOREIGN),
        "escaped": campaign_jobs(ESCAPED),
        "respawned": [int(word) for word in RESPAWNED.read_text().split()] if RESPAWNED.exists() else [],
        "witness": [line for line in signal_witness.read(WITNESS_DIR) if line["at"] >= since],
        "journal": journal(since),
    }
    json.dump(state, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
