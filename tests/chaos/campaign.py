"""A seeded fault campaign on a simulated lab: operations an operator runs, a fault at a random moment of each, the
recovery an operator would make, then the checker (tests/chaos/invariants.py) on the nodes' real state.

    python tests/chaos/campaign.py --seed 1000 --runs 20 [--out docs/results/chaos_....json]
    python tests/chaos/campaign.py --seeds 1003,1017        (the runs of these seeds only: a replay)

The lab is GPUFLEET_LAB=chaos (2 nodes; `make chaos` starts it). Each run, from its seed (schedule.py): an operation
(a switch to the engine not serving, with or without park_previous=auto, a cleanup, a --check, two switches at once)
and a fault on node1 at the start of one of its phases plus a random delay, or at a plain delay. Then:
1. the operation ends (or is ended by the fault), the fault is undone (SIGCONT, sshd started, the node back), the
   node settles; checked: one engine serves (or none after a cleanup, the same as before after a --check or a refused
   run), another user's job untouched;
2. the operator's rerun - the same command; checked: the target serves, nothing left (lease, parked hold, partial
   model), the rerun's report matches the nodes, GPU memory held only by the serving or parked engine, every signal a
   process saw is in the node's journal (or came from systemd, its own engine, or this campaign's fault);
3. a second plain rerun: nothing to do (converged).
Runs follow each other on one lab: each starts from what the one before left, as a fleet's days do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import invariants  # noqa: E402
import schedule  # noqa: E402

LAB = os.environ.get("GPUFLEET_LAB") or "chaos"
INVENTORY = REPO / "build" / LAB / "inventory.ini"
WORKDIR = REPO / "build" / "chaos-runs"
NODES = ("node1", "node2")
FAULTED = "node1"
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
RUN_TIMEOUT = 900  # seconds a playbook may run before it counts as hung
SETTLE_TIMEOUT = 120
FOREIGN_FILE = "/run/gpufleet-chaos/foreign.json"  # read by node_state.py
FOREIGN_WITNESS = "/run/gpufleet-chaos/alice.witness"
ESCAPED_FILE = "/run/gpufleet-chaos/escaped.json"
ESCAPED_WITNESS = "/run/gpufleet-chaos/escaped.witness"
FULL_DISKS = ("/var/lib/gpufleet-serving", "/var/log/gpufleet-serving")  # the node's records and its signal journal


def container(node: str) -> str:
    return f"gpufleet-{LAB}-{node}"


def node_exec(node: str, script: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    """A command on the node through podman, the lab's out-of-band channel (it works while sshd is down)."""
    return subprocess.run(["podman", "exec", container(node), "sh", "-c", script], capture_output=True, text=True, check=check,
                          timeout=timeout)


def probe(node: str, since: float) -> dict:
    shown = node_exec(node, f"python3 /opt/gpufleet-tests/chaos/node_state.py {since}", timeout=60)
    if shown.returncode != 0:
        raise RuntimeError(f"{node}: node_state.py failed: {shown.stderr[-2000:]}")
    return json.loads(shown.stdout)


def probe_all(since: float) -> dict[str, dict]:
    return {node: probe(node, since) for node in NODES}


class Playbook:
    """ansible-playbook in a process group of its own, its output kept, the start of each task noted."""

    running: set[Playbook] = set()  # ended with the campaign, however it ends

    def __init__(self, argv: list[str], log: Path):
        self.log = log.open("w")
        self.tasks: list[tuple[float, str]] = []
        self.started = time.time()
        env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
        self.process = subprocess.Popen(argv, cwd=WORKDIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True, env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        Playbook.running.add(self)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.log.write(line)
            if line.startswith("TASK ["):
                self.tasks.append((time.time(), line))
        self.log.flush()

    def wait_task(self, markers: list[str], timeout: float) -> tuple[float, int] | None:
        """When the first task whose name holds one of ``markers`` started, and which; None when the run ended (or timed
        out) without one."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for at, line in self.tasks[seen:]:
                for index, marker in enumerate(markers):
                    if marker in line:
                        return at, index
            seen = len(self.tasks)
            if self.process.poll() is not None and not self.reader.is_alive():
                return None
            time.sleep(0.05)
        return None

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int | None:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()
            code = None
        self.reader.join(10)
        self.log.close()
        Playbook.running.discard(self)
        return code


def command(operation: str, target: str) -> list[str]:
    if operation == "cleanup":
        return [str(PLAYBOOK), "-i", str(INVENTORY), str(REPO / "playbooks" / "gpu_cleanup.yml")]
    # both engines started so that a switch can park them (always: a plain switch must not change their units back)
    argv = [str(PLAYBOOK), "-i", str(INVENTORY), str(REPO / "playbooks" / "switch_engine.yml"), "-e", f"target={target}",
            "-e", "switch_engine_serial=2", "-e", "vllm_sleep_mode=true", "-e", "sglang_memory_saver=true",
            # a target whose readiness hangs is given up after 60 s, not the lab's 300 (a campaign's runs add up)
            "-e", "vllm_ready_timeout=60", "-e", "sglang_ready_timeout=60"]
    if operation == "switch_park":
        argv += ["-e", "switch_engine_park_previous=auto"]
    if operation == "check":
        argv += ["--check"]
    return argv


def report_of(operation: str) -> dict | None:
    path = WORKDIR / "reports" / ("gpu_cleanup.json" if operation == "cleanup" else "switch_engine.json")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main_pid(node: str, engine: str) -> int:
    shown = node_exec(node, f"systemctl show {engine}.service -p MainPID --value")
    return int(shown.stdout.strip() or 0)


class Fault:
    """One fault on node1 (or on the controller): inject() at the moment, undo() as the operator's recovery."""

    def __init__(self, run: schedule.Run, playbook: Playbook, target: str, previous: str | None):
        self.run, self.playbook, self.target, self.previous = run, playbook, target, previous
        self.injected: list[dict] = []  # {pid, signal}: what the campaign itself sent (the witness sees them too)
        self.detail = ""
        self.injected_at: float | None = None
        self.hit_engine = False

    def _signal(self, pid: int, name: str) -> None:
        node_exec(FAULTED, f"kill -{name.removeprefix('SIG')} {pid}")
        self.injected.append({"pid": pid, "signal": name})

    def _engine_pid(self) -> tuple[str, int]:
        """The engine the fault lands on: the target once its unit runs, else the one serving (or parked) before."""
        for engine in (self.target, self.previous):
            if engine and (pid := main_pid(FAULTED, engine)):
                return engine, pid
        return "", 0

    def inject(self) -> None:
        self.injected_at = time.time()
        kind = self.run.fault
        if kind == "controller_kill":
            self.playbook.signal(signal.SIGKILL)
        elif kind == "controller_int":
            self.playbook.signal(signal.SIGINT)
        elif kind == "module_kill":
            # a module runs as `python3` under Ansible's `sh -c '/usr/bin/python3 && sleep 0'` (pipelining)
            # most of a run is the controller's: the first module that runs from the moment on (10 s at most)
            listed = node_exec(FAULTED, "for i in $(seq 100); do for p in $(pgrep -x python3); do pp=$(ps -o ppid= -p $p | tr -d ' '); "
                                        "grep -q 'sleep 0' /proc/$pp/cmdline 2>/dev/null && echo $p; done | grep . && break; "
                                        "sleep 0.1; done").stdout.split()
            for pid in listed:
                self._signal(int(pid), "SIGKILL")
            self.detail = f"module pids {listed or 'none running'}"
        elif kind in ("engine_kill", "engine_stop"):
            engine, pid = self._engine_pid()
            if pid:
                self._signal(pid, "SIGKILL" if kind == "engine_kill" else "SIGSTOP")
                self.hit_engine = True
            self.detail = f"{engine or 'no engine'} main pid {pid or '-'}"
        elif kind == "node_restart":
            subprocess.run(["podman", "restart", "-t", "0", container(FAULTED)], capture_output=True, check=False, timeout=120)
            self.hit_engine = True
        elif kind == "partition":
            node_exec(FAULTED, "systemctl stop ssh.socket ssh.service 2>/dev/null; pkill -KILL -f 'sshd: ' ; true")
        elif kind == "escaped_worker":
            user = self.previous or "vllm"
            record = self._start_holder(user, "escaped-worker", "/dev/nvidia6", "6:512", ESCAPED_WITNESS, ESCAPED_FILE)
            self.detail = f"{user}'s escaped worker pid {record['pid']}"
        elif kind == "foreign_job":
            script = ("id alice >/dev/null 2>&1 || useradd -M alice; mkdir -p /run/gpufleet-chaos; chmod 1777 /run/gpufleet-chaos; "
                      f"rm -f {FOREIGN_WITNESS}; setsid -f runuser -u alice -- python3 /opt/gpufleet-tests/helpers/gpu_holder.py alices-job "
                      f"--open /dev/nvidia7 /dev/nvidiactl --sim-root /run/gpufleet-sim/nvml --alloc 7:2048 --witness {FOREIGN_WITNESS} "
                      ">/dev/null 2>&1; for i in $(seq 50); do p=$(pgrep -n -u alice -f '[a]lices-job'); "
                      "[ -n \"$p\" ] && ls -l /proc/$p/fd | grep -q nvidia7 && break; sleep 0.1; done; echo $p $(cut -d' ' -f22 /proc/$p/stat)")
            pid, start_time = node_exec(FAULTED, script).stdout.split()
            record = json.dumps([{"pid": int(pid), "start_time": int(start_time), "witness": FOREIGN_WITNESS}])
            node_exec(FAULTED, f"echo {shlex.quote(record)} > {FOREIGN_FILE}")
            self.detail = f"alice's job pid {pid}"
        elif kind == "disk_full":
            # the collection's state and its signal journal on a filesystem of their own, filled to the last byte
            script = "".join(f"mkdir -p /run/chaos-disk{index}; cp -a {path}/. /run/chaos-disk{index}/ 2>/dev/null; "
                             f"stat -c %a {path} > /run/chaos-disk{index}.mode; "
                             f"mount -t tmpfs -o size=4m,mode=$(cat /run/chaos-disk{index}.mode) chaos-disk {path} && "
                             f"cp -a /run/chaos-disk{index}/. {path}/ && chmod $(cat /run/chaos-disk{index}.mode) {path} && "
                             f"(dd if=/dev/zero of={path}/.chaos-fill bs=64k 2>/dev/null; true); "
                             for index, path in enumerate(FULL_DISKS))
            node_exec(FAULTED, f"mkdir -p {' '.join(FULL_DISKS)}; {script} df -k {' '.join(FULL_DISKS)} | tail -n +2")
            self.detail = f"{', '.join(FULL_DISKS)} full"
        elif kind == "readiness_hang":
            node_exec(FAULTED, f"echo '{{\"{self.target}\": {{\"health_never_green\": true}}}}' > /etc/gpufleet-sim/faults.json")
            self.detail = f"{self.target}'s health stays 503"

    def _start_holder(self, user: str, name: str, device: str, alloc: str, witness: str, record_file: str) -> dict:
        """A process of ``user`` outside any engine unit (a session of its own), holding ``device`` and simulated GPU
        memory, recording each signal it gets; its pid and start time written where node_state.py reads them."""
        script = (f"mkdir -p /run/gpufleet-chaos; chmod 1777 /run/gpufleet-chaos; rm -f {witness}; "
                  f"setsid -f runuser -u {user} -- python3 /opt/gpufleet-tests/helpers/gpu_holder.py {name} --open {device} /dev/nvidiactl "
                  f"--sim-root /run/gpufleet-sim/nvml --alloc {alloc} --witness {witness} >/dev/null 2>&1; "
                  f"for i in $(seq 50); do p=$(pgrep -n -u {user} -f '[{name[0]}]{name[1:]}'); "
                  f"[ -n \"$p\" ] && ls -l /proc/$p/fd | grep -q {device.rsplit('/', 1)[1]} && break; sleep 0.1; done; "
                  "echo $p $(cut -d' ' -f22 /proc/$p/stat)")
        pid, start_time = node_exec(FAULTED, script).stdout.split()
        record = {"pid": int(pid), "start_time": int(start_time), "witness": witness}
        node_exec(FAULTED, f"echo {shlex.quote(json.dumps([record]))} > {record_file}")
        return record

    def undo(self) -> None:
        """The operator's recovery of the fault's own damage (the rerun comes after)."""
        kind = self.run.fault
        if self.injected_at is None:
            return
        if kind in ("partition", "engine_stop"):
            time.sleep(max(0.0, self.injected_at + self.run.fault_seconds - time.time()))
        if kind == "engine_stop":
            for sent in list(self.injected):
                if sent["signal"] == "SIGSTOP":
                    self._signal(sent["pid"], "SIGCONT")
        elif kind == "partition":
            node_exec(FAULTED, "systemctl start ssh.service")
        elif kind == "readiness_hang":
            node_exec(FAULTED, "echo '{}' > /etc/gpufleet-sim/faults.json")
        elif kind == "disk_full":
            # room again: what was written meanwhile is kept (a node restart has already dropped the mounts)
            script = "".join(f"if mountpoint -q {path}; then rm -f {path}/.chaos-fill; mkdir -p /run/chaos-keep{index}; "
                             f"cp -a {path}/. /run/chaos-keep{index}/; umount {path}; cp -a /run/chaos-keep{index}/. {path}/; "
                             f"chmod $(cat /run/chaos-disk{index}.mode) {path}; rm -rf /run/chaos-keep{index} /run/chaos-disk{index}*; fi; "
                             for index, path in enumerate(FULL_DISKS))
            node_exec(FAULTED, script)
        wait_reachable(FAULTED)

    def end_escaped_worker(self) -> None:
        """One a run left (a --check, a refused switch) is ended by the campaign after the checks, journalled here."""
        if self.run.fault != "escaped_worker" or self.injected_at is None:
            return
        for job in json.loads(node_exec(FAULTED, f"cat {ESCAPED_FILE} 2>/dev/null || echo []").stdout or "[]"):
            if node_exec(FAULTED, f"cut -d' ' -f22 /proc/{job['pid']}/stat 2>/dev/null").stdout.strip() == str(job["start_time"]):
                self._signal(job["pid"], "SIGKILL")
        node_exec(FAULTED, f"rm -f {ESCAPED_FILE}")

    def end_foreign_job(self) -> None:
        """The other user's job ends by itself (its owner's business): the campaign SIGKILLs it, journalled here."""
        if self.run.fault != "foreign_job" or self.injected_at is None:
            return
        pid = node_exec(FAULTED, "pgrep -n -u alice -f '[a]lices-job'").stdout.strip()
        if pid:
            self._signal(int(pid), "SIGKILL")
        node_exec(FAULTED, f"rm -f {FOREIGN_FILE}")


def ssh_port(node: str) -> int:
    for line in INVENTORY.read_text().splitlines():
        if line.startswith(node + " "):
            return int(re.search(r"ansible_port=(\d+)", line).group(1))
    raise RuntimeError(f"{node} is not in {INVENTORY}")


def wait_reachable(node: str, timeout: float = SETTLE_TIMEOUT) -> bool:
    """Booted (its GPUs set up) and answering SSH, as the next run will reach it."""
    deadline = time.monotonic() + timeout
    key = REPO / "build" / LAB / "id_ed25519"
    port = ssh_port(node)
    while time.monotonic() < deadline:
        ready = node_exec(node, "test -e /run/gpufleet-sim/ready && systemctl is-active ssh.service", timeout=20)
        if ready.returncode == 0:
            options = ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR", "ConnectTimeout=5", "BatchMode=yes"]
            probe_ssh = subprocess.run(["ssh", "-i", str(key), "-p", str(port), *[word for name in options for word in ("-o", name)],
                                        "root@127.0.0.1", "true"], capture_output=True, check=False, timeout=30)
            if probe_ssh.returncode == 0:
                return True
        time.sleep(1)
    return False


def busy(state: dict) -> bool:
    """A run holds the lease, a unit starts or stops (a restart after a crash included), or an engine still loads."""
    loading = [engine for engine, unit in state["units"].items()
               if unit["active"] == "active" and engine not in invariants.serving(state) + invariants.parked(state)]
    return (any(lease.get("same_boot") and (lease.get("expires_in") or 0) > 0 for lease in state["leases"])
            or any(unit["active"] in ("activating", "deactivating", "reloading") for unit in state["units"].values()) or bool(loading))


def settle(since: float, timeout: float = SETTLE_TIMEOUT) -> dict[str, dict]:
    """The nodes once nothing is in motion on them (or at the deadline: what is still in motion then is judged)."""
    deadline = time.monotonic() + timeout
    while True:
        states = probe_all(since)
        if not any(busy(state) for state in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(2)


def summary(states: dict[str, dict]) -> dict:
    """What the run record keeps of the nodes: who serves, who is parked, each unit's state."""
    return {node: {"serving": invariants.serving(state), "parked": invariants.parked(state),
                   "units": {engine: f"{unit['active']}/{unit['sub']}" for engine, unit in state["units"].items()}}
            for node, state in states.items()}


def target_for(states: dict[str, dict]) -> tuple[str, str | None]:
    serving = invariants.serving(states[FAULTED])
    previous = serving[0] if serving else None
    return ("sglang" if previous == "vllm" else "vllm"), previous


def one_run(run: schedule.Run, index: int) -> dict:
    started = time.time()
    before = settle(started - 1)
    target, previous = target_for(before)
    operation = run.operation
    waking = target in invariants.parked(before[FAULTED])  # a switch back to the parked engine wakes it
    argv = command(operation, target)
    logs = WORKDIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    playbook = Playbook(argv, logs / f"{run.seed}-run.log")
    second = None
    if operation == "overlap":
        time.sleep(2)
        second = Playbook(argv, logs / f"{run.seed}-overlap.log")
    fault = Fault(run, playbook, target, previous)
    # the drawn phase, or the first one after it that this path enters
    phases = list(schedule.phases_of(operation).items())[list(schedule.phases_of(operation)).index(run.phase):] if run.phase else []
    landed_phase = None
    if phases:
        found = playbook.wait_task([marker for _phase, marker in phases], RUN_TIMEOUT)
        reached = found[0] if found else None
        landed_phase = phases[found[1]][0] if found else None
    else:
        reached = playbook.started
    if reached is not None:
        time.sleep(max(0.0, reached + run.delay - time.time()))
        if playbook.process.poll() is None or run.fault in schedule.NODE_FAULTS:
            fault.inject()
    codes = [playbook.wait(), *([second.wait()] if second else [])]
    if fault.injected_at is None and run.fault in schedule.NODE_FAULTS:
        fault.inject()  # the node's world does not wait for a phase: the operation ended first, the fault comes now
        landed_phase = "end"
    fault.undo()
    recovery_started = time.time()
    violations: list[str] = []
    if None in codes:
        violations.append(f"the operation ran past {RUN_TIMEOUT} s (hung)")
    after_fault = settle(started)
    for node in NODES:
        violations += invariants.foreign_untouched(node, after_fault[node])
        if operation == "check":
            violations += invariants.untouched(node, before[node], after_fault[node], fault.hit_engine)
        elif operation != "cleanup":
            before_here = invariants.serving(before[node])  # each node's own: a stopped rollout leaves them apart
            allowed = tuple(dict.fromkeys([target, *before_here]))
            violations += [f"after the fault: {problem}"
                           for problem in invariants.one_engine(node, after_fault[node], allowed, none_before=not before_here)]
    fault.end_foreign_job()
    # the operator's recovery: the same command again
    rerun_code = Playbook(argv, logs / f"{run.seed}-rerun.log").wait()
    rerun_report = report_of(operation)
    recovered = settle(started)
    recovery_s = round(time.time() - recovery_started, 1)
    for node in NODES:
        state = recovered[node]
        if operation in invariants.SWITCHES:
            violations += [f"after the rerun: {problem}" for problem in invariants.one_engine(node, state, (target,))]
        elif operation == "cleanup":
            violations += invariants.nothing_runs(node, state)
        violations += invariants.leftovers(node, state)
        violations += invariants.gpu_memory(node, state)
        violations += invariants.signals_journalled(node, state, fault.injected if node == FAULTED else [])
        violations += invariants.escaped_worker(node, state, torn_down=operation != "check")
        if operation != "check":
            violations += invariants.report_matches(node, state, rerun_report) if operation != "cleanup" else []
    if rerun_code not in (0,) and operation != "check":
        violations.append(f"the rerun exited {rerun_code} (logs/{run.seed}-rerun.log)")
    fault.end_escaped_worker()
    if operation != "check":
        Playbook(argv, logs / f"{run.seed}-converged.log").wait()
        second_report = report_of(operation)
        for node in NODES:
            violations += invariants.converged(node, operation, second_report)
    return {**run.to_dict(), "index": index, "target": target, "previous": previous, "wakes": waking, "reached": reached is not None,
            "landed_phase": landed_phase,
            "delivered": fault.injected_at is not None, "fault_detail": fault.detail, "injected": fault.injected, "exit_codes": codes, "recovery_s": recovery_s,
            "after_fault": summary(after_fault), "after_rerun": summary(recovered),
            "seconds": round(time.time() - started, 1), "violations": violations}


def landed(run: dict) -> bool:
    """The fault did something: it came before the operation's end (or is of the node's world), and a fault aimed at
    a process found one (no module running at that moment, no engine at all: a miss)."""
    return run["delivered"] and not (run["fault"] in ("module_kill", "engine_kill", "engine_stop") and not run["injected"])


def markdown(runs: list[dict]) -> list[str]:
    """The campaign's table for docs/testing.md: each fault kind's runs per phase it landed in (d: delivered of them),
    the violations, the mean recovery."""
    phases = [*schedule.SWITCH_PHASES, "facts", "teardown", "end", "delay"]
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for run in runs:
        cells[(run["fault"], run["landed_phase"] or run["phase"] or "delay")].append(run)
    used = [phase for phase in phases if any(key[1] == phase for key in cells)]
    lines = ["| fault | " + " | ".join(used) + " | runs (delivered) | violations | recovery s, mean |", "|---" * (len(used) + 4) + "|"]
    for fault in schedule.FAULTS:
        mine = [run for run in runs if run["fault"] == fault]
        if not mine:
            continue
        counts = [str(len(cells[(fault, phase)]) or "") for phase in used]
        delivered = sum(landed(run) for run in mine)
        violations = sum(len(run["violations"]) for run in mine)
        lines.append(f"| {fault} | " + " | ".join(counts) + f" | {len(mine)} ({delivered}) | {violations} | "
                     f"{sum(run['recovery_s'] for run in mine) / len(mine):.1f} |")
    return lines


def table(runs: list[dict]) -> list[str]:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for run in runs:
        cells[(run["fault"], run["landed_phase"] or run["phase"] or "delay")].append(run)
    lines = [f"{'fault':16} {'phase':10} {'runs':>4} {'violations':>10} {'recovery s (mean)':>18}"]
    for (fault, phase), group in sorted(cells.items()):
        mean = sum(run["recovery_s"] for run in group) / len(group)
        lines.append(f"{fault:16} {phase:10} {len(group):4} {sum(len(run['violations']) for run in group):10} {mean:18.1f}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1000, help="the first run's seed (run i has seed + i)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", help="comma-separated seeds to run instead (a replay, or the gate's short schedule)")
    parser.add_argument("--out", type=Path, help="the campaign's JSON (default: build/chaos-runs/campaign-SEED-RUNS.json)")
    parser.add_argument("--summarize", nargs="+", type=Path, metavar="JSON", help="print the table of these campaigns' runs (markdown), run nothing")
    args = parser.parse_args(argv)
    if args.summarize:
        runs = [run for path in args.summarize for run in json.loads(path.read_text())["runs"]]
        print("\n".join(markdown(runs)))
        operations = defaultdict(int)
        for run in runs:
            operations[run["operation"] + (" (a wake)" if run.get("wakes") and run["operation"] != "cleanup" else "")] += 1
        print(f"\n{len(runs)} runs, {sum(landed(run) for run in runs)} faults delivered, "
              f"{sum(len(run['violations']) for run in runs)} violations; operations: "
              + ", ".join(f"{name} {count}" for name, count in sorted(operations.items())))
        return 0
    if not INVENTORY.exists():
        parser.error(f"no lab at {INVENTORY}: start it with `make chaos` (or GPUFLEET_LAB={LAB} python tests/sim/lab.py up --nodes 2)")
    seeds = [int(word) for word in args.seeds.split(",")] if args.seeds else [args.seed + index for index in range(args.runs)]
    WORKDIR.mkdir(parents=True, exist_ok=True)
    out = args.out or WORKDIR / f"campaign-{seeds[0]}-{len(seeds)}.json"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return campaign(seeds, out)
    finally:
        for playbook in list(Playbook.running):
            playbook.signal(signal.SIGKILL)


def campaign(seeds: list[int], out: Path) -> int:
    results: list[dict] = []
    campaign_started = time.time()
    for index, seed in enumerate(seeds):
        run = schedule.plan(seed)
        result = one_run(run, index)
        results.append(result)
        verdict = "ok" if not result["violations"] else f"{len(result['violations'])} VIOLATION(S)"
        landed = (result["fault_detail"] or "delivered") if result["delivered"] else "not delivered: the run ended before its moment"
        at = run.phase if result["landed_phase"] in (None, run.phase) else f"{run.phase}->{result['landed_phase']}"
        operation = f"{run.operation} (a wake)" if result["wakes"] and run.operation != "cleanup" else run.operation
        print(f"run {index + 1}/{len(seeds)} seed {seed}: {operation} + {run.fault} at {at or 'delay'}+{run.delay}s"
              f" ({landed}): {verdict}, recovered in {result['recovery_s']} s, {result['seconds']} s in all", flush=True)
        for violation in result["violations"]:
            print(f"    {violation}", flush=True)
        record = {"schedule_version": schedule.SCHEDULE_VERSION, "seeds": seeds, "lab": {"nodes": len(NODES), "faulted": FAULTED}, "started": campaign_started,
                  "seconds": round(time.time() - campaign_started, 1), "runs": results,
                  "failed_seeds": [item["seed"] for item in results if item["violations"]]}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(table(results)))
    failed = [item["seed"] for item in results if item["violations"]]
    print(f"chaos: {len(results)} run(s), {sum(len(item['violations']) for item in results)} violation(s)"
          + (f"; replay: make chaos SEEDS={','.join(map(str, failed))}" if failed else "") + f"; {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
