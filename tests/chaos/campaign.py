"""A seeded fault campaign on a simulated lab: operations an operator runs, a fault at a random moment of each, the
recovery an operator would make, then the checker (tests/chaos/invariants.py) on the nodes' real state.

    python tests/chaos/campaign.py --seed 1000 --runs 20 [--out docs/results/chaos_....json]
    python tests/chaos/campaign.py --seeds 1003,1017        (the runs of these seeds only: a replay)
    python tests/chaos/campaign.py --short                  (the gate's short schedule: schedule.covering(1000))

The lab is GPUFLEET_LAB=chaos (3 nodes; `make chaos` starts it). Each run, from its seed (schedule.py): an operation
(a switch to the engine not serving, with or without park_previous=auto, a cleanup, a --check, two switches at once),
two faults on each node and on some runs one on the controller, each at the start of one of the operation's phases plus
a random delay, or at a plain delay. Then:
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
WORKDIR = REPO / "build" / "chaos-runs" / LAB  # the runs' reports and logs: one lab's campaign beside another's


def lab_nodes() -> tuple[str, ...]:
    """The lab's nodes, as its inventory names them (a campaign's runs are drawn for as many nodes)."""
    names = [line.split()[0] for line in INVENTORY.read_text().splitlines() if re.match(r"node\d+ ", line)] if INVENTORY.exists() else []
    return tuple(sorted(names, key=lambda name: int(name[4:]))) or schedule.NODES


NODES = lab_nodes()
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
RUN_TIMEOUT = 900  # seconds a playbook may run before it counts as hung
SETTLE_TIMEOUT = 120
SETTLE_POLL = 6  # seconds between two reads of every node while something moves (a read costs each node a Python start)
FOREIGN_FILE = "/run/gpufleet-chaos/foreign.json"  # read by node_state.py
FOREIGN_WITNESS = "/run/gpufleet-chaos/alice.witness"
ESCAPED_FILE = "/run/gpufleet-chaos/escaped.json"
ESCAPED_WITNESS = "/run/gpufleet-chaos/escaped.witness"
RESPAWNED_PIDS = "/run/gpufleet-chaos/respawned.pids"
# each node's model hub (tests/sim/hf_endpoint.py, 4 MiB/s): SGLang's model is staged from it by every switch
HUB_MODEL = "lab/tiny-sglang"
HUB_PORT = 8090
HUB_UNIT = "gpufleet-lab-hub.service"
HUB_STAGED = "/var/lib/gpufleet-models/lab--tiny-sglang"
HUB_SETUP = (f"mkdir -p /srv/hub/{HUB_MODEL} && cp -n /models/Llama-3.3-70B-Instruct/* /srv/hub/{HUB_MODEL}/ && "
             f"printf '[Service]\\nExecStart=/usr/bin/python3 /opt/gpufleet-tests/sim/hf_endpoint.py --root /srv/hub --port {HUB_PORT} "
             f"--rate-mib 4\\n[Install]\\nWantedBy=multi-user.target\\n' > /etc/systemd/system/{HUB_UNIT} && "
             f"systemctl daemon-reload && systemctl enable --now {HUB_UNIT}")
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
            # two batches whatever the lab's size: a rollout stopped between them leaves the nodes apart
            "-e", f"switch_engine_serial={(len(NODES) + 1) // 2}", "-e", "vllm_sleep_mode=true", "-e", "sglang_memory_saver=true",
            # a target whose readiness hangs is given up after 60 s, not the lab's 300 (a campaign's runs add up)
            "-e", "vllm_ready_timeout=60", "-e", "sglang_ready_timeout=60"]
    # SGLang's model comes from each node's hub: staged by the switch before its drain (a hub_fail fault stops the hub)
    argv += ["-e", f"sglang_model={HUB_MODEL}", "-e", f"switch_engine_hub_endpoint=http://127.0.0.1:{HUB_PORT}"]
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
    """One fault of a run - on a node, or on the controller: inject() at its moment, undo() as the operator's recovery.
    A node's two faults are injected one at a time (a restart must not cut the other's start short)."""

    node_locks: dict[str | None, threading.Lock] = defaultdict(threading.Lock)

    def __init__(self, spec: schedule.Fault, playbook: Playbook | None, target: str, previous: dict[str, str | None]):
        self.spec, self.playbook, self.target = spec, playbook, target
        self.node = spec.where if spec.where != schedule.CONTROLLER else None
        self.previous = previous.get(self.node) if self.node else None
        self.injected: list[dict] = []  # {pid, signal}: what the campaign itself sent (the witness sees them too)
        self.detail = ""
        self.injected_at: float | None = None
        self.landed_phase: str | None = None
        self.hit_engine = False
        self.error: str | None = None  # the campaign's own failure to inject it

    @property
    def kind(self) -> str:
        return self.spec.kind

    def run(self, sh: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return node_exec(self.node, sh, timeout=timeout)

    def _signal(self, pid: int, name: str) -> None:
        self.run(f"kill -{name.removeprefix('SIG')} {pid}")
        self.injected.append({"pid": pid, "signal": name})

    def _engine_pid(self) -> tuple[str, int]:
        """The engine the fault lands on: the target once its unit runs, else the one serving (or parked) before."""
        for engine in (self.target, self.previous):
            if engine and (pid := main_pid(self.node, engine)):
                return engine, pid
        return "", 0

    def prepare(self) -> None:
        """Before the operation: a hub failure needs a download to fail - SGLang's staged model is removed where it
        is the target and does not run (a new model, as an operator stages one)."""
        if self.kind == "hub_fail" and self.target == "sglang" and not main_pid(self.node, "sglang"):
            self.run(f"rm -rf {HUB_STAGED} {HUB_STAGED}.partial")
            self.detail = "SGLang's model to be staged again"

    def inject(self) -> None:
        self.injected_at = time.time()
        kind = self.kind
        if kind == "controller_kill":
            self.playbook.signal(signal.SIGKILL)
        elif kind == "controller_int":
            self.playbook.signal(signal.SIGINT)
        elif kind == "module_kill":
            # a module runs as `python3` under Ansible's `sh -c '/usr/bin/python3 && sleep 0'` (pipelining)
            # most of a run is the controller's: the first module that runs from the moment on (10 s at most)
            listed = self.run("for i in $(seq 100); do for p in $(pgrep -x python3); do pp=$(ps -o ppid= -p $p | tr -d ' '); "
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
            restart(self.node)
            self.hit_engine = True
        elif kind == "partition":
            self.run("systemctl stop ssh.socket ssh.service 2>/dev/null; pkill -KILL -f 'sshd: ' ; true")
        elif kind in ("escaped_worker", "escaped_respawn"):
            # an engine's user: the serving engine's, else the target's (a fresh node has neither until a switch made it)
            candidates = [name for name in dict.fromkeys([self.previous, self.target, "vllm", "sglang"]) if name]
            user = next((name for name in candidates if self.run(f"id -u {name}").returncode == 0), None)
            if user is None:
                self.injected_at, self.detail = None, "no engine user on the node yet"
                return
            # over the teardown's 512 MiB a GPU: a worker that came back fails the memory assertion, not slips under it
            record = self._start_holder(user, "escaped-worker", "/dev/nvidia6", "6:1024", ESCAPED_WITNESS, ESCAPED_FILE,
                                        respawn=kind == "escaped_respawn")
            self.detail = f"{user}'s escaped worker pid {record['pid']}" + (" (respawning)" if kind == "escaped_respawn" else "")
        elif kind == "foreign_job":
            record = self._start_holder("alice", "alices-job", "/dev/nvidia7", "7:2048", FOREIGN_WITNESS, FOREIGN_FILE)
            self.detail = f"alice's job pid {record['pid']}"
        elif kind == "disk_full":
            # the collection's state and its signal journal on a filesystem of their own, filled to the last byte
            script = "".join(f"mkdir -p /run/chaos-disk{index}; cp -a {path}/. /run/chaos-disk{index}/ 2>/dev/null; "
                             f"stat -c %a {path} > /run/chaos-disk{index}.mode; "
                             f"mount -t tmpfs -o size=4m,mode=$(cat /run/chaos-disk{index}.mode) chaos-disk {path} && "
                             f"cp -a /run/chaos-disk{index}/. {path}/ && chmod $(cat /run/chaos-disk{index}.mode) {path} && "
                             f"(dd if=/dev/zero of={path}/.chaos-fill bs=64k 2>/dev/null; true); "
                             for index, path in enumerate(FULL_DISKS))
            self.run(f"mkdir -p {' '.join(FULL_DISKS)}; {script} df -k {' '.join(FULL_DISKS)} | tail -n +2")
            self.detail = f"{', '.join(FULL_DISKS)} full"
        elif kind == "readiness_hang":
            self.run(f"echo '{{\"{self.target}\": {{\"health_never_green\": true}}}}' > /etc/gpufleet-sim/faults.json")
            self.detail = f"{self.target}'s health stays 503"
        elif kind == "hub_fail":
            partial = self.run(f"du -sm {HUB_STAGED}.partial 2>/dev/null | cut -f1").stdout.strip()
            self.run(f"systemctl kill -s KILL {HUB_UNIT}; systemctl stop {HUB_UNIT}")
            self.detail = (f"the hub stopped with {partial} MiB of the download in {HUB_STAGED}.partial" if partial
                           else "the hub stopped, no download in flight")

    def _start_holder(self, user: str, name: str, device: str, alloc: str, witness: str, record_file: str, respawn: bool = False) -> dict:
        """A process of ``user`` outside any engine unit (a session of its own), holding ``device`` and simulated GPU
        memory, recording each signal it gets; its pid and start time written where node_state.py reads them. With
        ``respawn``, under a parent of the same user that starts it again whenever it dies: the parent is the record."""
        holder = (f"python3 /opt/gpufleet-tests/helpers/gpu_holder.py {name} --open {device} /dev/nvidiactl "
                  f"--sim-root /run/gpufleet-sim/nvml --alloc {alloc}")
        if respawn:
            command = f"python3 /opt/gpufleet-tests/helpers/respawner.py --witness {witness} --pids {RESPAWNED_PIDS} -- {holder}"
            wanted = "[r]espawner.py"
        else:
            command = f"{holder} --witness {witness}"
            wanted = f"[{name[0]}]{name[1:]}"
        script = ("id alice >/dev/null 2>&1 || useradd -M alice; mkdir -p /run/gpufleet-chaos; chmod 1777 /run/gpufleet-chaos; "
                  f"rm -f {witness} {RESPAWNED_PIDS if respawn else ''}; "
                  f"setsid -f runuser -u {user} -- {command} >/dev/null 2>&1; "
                  f"for i in $(seq 50); do p=$(pgrep -n -u {user} -f '{wanted}'); h=$(pgrep -n -u {user} -f '[{name[0]}]{name[1:]}'); "
                  f"[ -n \"$p\" ] && [ -n \"$h\" ] && ls -l /proc/$h/fd | grep -q {device.rsplit('/', 1)[1]} && break; sleep 0.1; done; "
                  "echo $p $(cut -d' ' -f22 /proc/$p/stat)")
        started = self.run(script).stdout.split()
        if len(started) != 2:
            raise RuntimeError(f"{name} did not start on {self.node} as {user}")
        pid, start_time = started
        record = {"pid": int(pid), "start_time": int(start_time), "witness": witness, "respawns": respawn}
        self.run(f"echo {shlex.quote(json.dumps([record]))} > {record_file}")
        return record

    def undo(self) -> None:
        """The operator's recovery of the fault's own damage (the rerun comes after)."""
        kind = self.kind
        if self.injected_at is None or self.node is None:
            return
        if kind in ("partition", "engine_stop"):
            time.sleep(max(0.0, self.injected_at + self.spec.fault_seconds - time.time()))
        if kind == "engine_stop":
            for sent in list(self.injected):
                if sent["signal"] == "SIGSTOP":
                    self._signal(sent["pid"], "SIGCONT")
        elif kind == "partition":
            self.run("systemctl start ssh.service")
        elif kind == "readiness_hang":
            self.run("echo '{}' > /etc/gpufleet-sim/faults.json")
        elif kind == "hub_fail":
            self.run(f"systemctl start {HUB_UNIT}")
        elif kind == "disk_full":
            # room again: what was written meanwhile is kept (a node restart has already dropped the mounts)
            script = "".join(f"if mountpoint -q {path}; then rm -f {path}/.chaos-fill; mkdir -p /run/chaos-keep{index}; "
                             f"cp -a {path}/. /run/chaos-keep{index}/; umount {path}; cp -a /run/chaos-keep{index}/. {path}/; "
                             f"chmod $(cat /run/chaos-disk{index}.mode) {path}; rm -rf /run/chaos-keep{index} /run/chaos-disk{index}*; fi; "
                             for index, path in enumerate(FULL_DISKS))
            self.run(script)
        wait_reachable(self.node)

    def end_escaped_worker(self) -> None:
        """One a run left (a --check, a refused switch) is ended by the campaign after the checks, journalled here; a
        respawning one with its parent first."""
        if self.kind not in ("escaped_worker", "escaped_respawn") or self.injected_at is None:
            return
        for job in json.loads(self.run(f"cat {ESCAPED_FILE} 2>/dev/null || echo []").stdout or "[]"):
            if self.run(f"cut -d' ' -f22 /proc/{job['pid']}/stat 2>/dev/null").stdout.strip() == str(job["start_time"]):
                self._signal(job["pid"], "SIGKILL")
        if self.kind == "escaped_respawn":
            for pid in self.run(f"cat {RESPAWNED_PIDS} 2>/dev/null").stdout.split():
                self.run(f"kill -KILL {pid} 2>/dev/null")  # a child of the campaign's own parent: not an engine process
        self.run(f"rm -f {ESCAPED_FILE}")

    def end_foreign_job(self) -> None:
        """The other user's job ends by itself (its owner's business): the campaign SIGKILLs it, journalled here."""
        if self.kind != "foreign_job" or self.injected_at is None:
            return
        pid = self.run("pgrep -n -u alice -f '[a]lices-job'").stdout.strip()
        if pid:
            self._signal(int(pid), "SIGKILL")
        self.run(f"rm -f {FOREIGN_FILE}")

    def record(self) -> dict:
        return {**self.spec.to_dict(), "landed_phase": self.landed_phase, "delivered": self.injected_at is not None, "detail": self.detail,
                "injected": self.injected, "error": self.error}


def restart(node: str) -> None:
    """The node's container restarted as a power cycle; a container runc cannot exec in afterwards is started again."""
    subprocess.run(["podman", "restart", "-t", "0", container(node)], capture_output=True, check=False, timeout=120)
    for _attempt in range(30):
        if node_exec(node, "true", timeout=20).returncode == 0:
            return
        time.sleep(1)
    subprocess.run(["podman", "stop", "-t", "0", container(node)], capture_output=True, check=False, timeout=120)
    subprocess.run(["podman", "start", container(node)], capture_output=True, check=False, timeout=120)


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
        time.sleep(SETTLE_POLL)


def summary(states: dict[str, dict]) -> dict:
    """What the run record keeps of the nodes: who serves, who is parked, each unit's state."""
    return {node: {"serving": invariants.serving(state), "parked": invariants.parked(state),
                   "units": {engine: f"{unit['active']}/{unit['sub']}" for engine, unit in state["units"].items()}}
            for node, state in states.items()}


def target_for(states: dict[str, dict]) -> tuple[str, dict[str, str | None]]:
    """The run's target: the engine the first node does not serve; and each node's engine before it."""
    previous = {node: (invariants.serving(state) or [None])[0] for node, state in states.items()}
    return ("sglang" if previous[NODES[0]] == "vllm" else "vllm"), previous


def deliver(fault: Fault, operation: str) -> None:
    """Wait for the fault's moment - the drawn phase, or the first one after it that this path enters, plus its delay;
    or its plain delay - and inject it (a controller's fault only while the operation still runs)."""
    names = list(schedule.phases_of(operation))
    phases = list(schedule.phases_of(operation).items())[names.index(fault.spec.phase):] if fault.spec.phase else []
    if phases:
        found = fault.playbook.wait_task([marker for _phase, marker in phases], RUN_TIMEOUT)
        if not found:
            return
        reached, fault.landed_phase = found[0], phases[found[1]][0]
    else:
        reached = fault.playbook.started
    # the hub mid-download: once the node's download has begun (its .partial directory; the stage's first seconds are
    # the hub's metadata and the room check, on each batch's own clock), a quarter of the drawn delay later
    if (fault.kind == "hub_fail" and fault.landed_phase == "stage" and fault.node
            and node_exec(fault.node, f"for i in $(seq 180); do [ -d {HUB_STAGED}.partial ] && exit 0; sleep 0.5; done; exit 1",
                          timeout=120).returncode == 0):
        reached = time.time() - fault.spec.delay * 0.75
    time.sleep(max(0.0, reached + fault.spec.delay - time.time()))
    if fault.playbook.process.poll() is None or fault.kind in schedule.WORLD_FAULTS:
        inject(fault)


def inject(fault: Fault) -> None:
    """The fault injected; a failure of the campaign's own injection is the run's record (and fails it), not a thread's
    traceback."""
    try:
        with Fault.node_locks[fault.node]:
            fault.inject()
    except Exception as exc:  # noqa: BLE001 - any error of the campaign's own is reported with the run
        fault.error = f"{type(exc).__name__}: {exc}"


def one_run(run: schedule.Run, index: int) -> dict:
    started = time.time()
    before = settle(started - 1)
    target, previous = target_for(before)
    operation = run.operation
    waking = {node: target in invariants.parked(before[node]) for node in NODES}  # a switch back to the parked engine wakes it
    argv = command(operation, target)
    logs = WORKDIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    faults = [Fault(spec, None, target, previous) for spec in run.faults]
    for fault in faults:
        fault.prepare()
    playbook = Playbook(argv, logs / f"{run.seed}-run.log")
    second = None
    if operation == "overlap":
        time.sleep(2)  # the second switch a moment after the first
        second = Playbook(argv, logs / f"{run.seed}-overlap.log")
    for fault in faults:
        fault.playbook = playbook
    deliveries = [threading.Thread(target=deliver, args=(fault, operation), daemon=True) for fault in faults]
    for delivery in deliveries:
        delivery.start()
    codes = [playbook.wait(), *([second.wait()] if second else [])]
    for delivery in deliveries:
        delivery.join(SETTLE_TIMEOUT)
    for fault in faults:
        if fault.injected_at is None and fault.kind in schedule.WORLD_FAULTS:
            inject(fault)  # the node's world does not wait for a phase: the operation ended first, the fault comes now
            fault.landed_phase = "end"
    for fault in faults:
        fault.undo()
    recovery_started = time.time()
    on_node = {node: [fault for fault in faults if fault.node == node] for node in NODES}
    violations: list[str] = [f"the campaign could not inject {fault.kind} on {fault.spec.where}: {fault.error}" for fault in faults if fault.error]
    if None in codes:
        violations.append(f"the operation ran past {RUN_TIMEOUT} s (hung)")
    after_fault = settle(started)
    for node in NODES:
        violations += invariants.foreign_untouched(node, after_fault[node])
        if operation == "check":
            violations += invariants.untouched(node, before[node], after_fault[node], any(fault.hit_engine for fault in on_node[node]))
        elif operation != "cleanup":
            before_here = invariants.serving(before[node])  # each node's own: a stopped rollout leaves them apart
            # a node restarted starts the engine enabled at boot (a cleanup stops engines, it does not disable them)
            rebooted = invariants.enabled_at_boot(before[node]) if invariants.restarted(before[node], after_fault[node]) else []
            allowed = tuple(dict.fromkeys([target, *before_here, *rebooted]))
            violations += [f"after the fault: {problem}"
                           for problem in invariants.one_engine(node, after_fault[node], allowed, none_before=not before_here)]
    for fault in faults:
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
        violations += invariants.leftovers(node, state, holds_not_ours=tuple(before[node].get("holds", [])) if operation == "check" else ())
        violations += invariants.gpu_memory(node, state, escaped_left=operation == "check")
        violations += invariants.signals_journalled(node, state, [sent for fault in on_node[node] for sent in fault.injected])
        violations += invariants.escaped_worker(node, state, torn_down=operation != "check")
        if operation != "check":
            violations += invariants.report_matches(node, state, rerun_report) if operation != "cleanup" else []
    if rerun_code not in (0,) and operation != "check":
        violations.append(f"the rerun exited {rerun_code} (logs/{run.seed}-rerun.log)")
    for fault in faults:
        fault.end_escaped_worker()
    if operation != "check":
        Playbook(argv, logs / f"{run.seed}-converged.log").wait()
        second_report = report_of(operation)
        for node in NODES:
            violations += invariants.converged(node, operation, second_report)
    return {**run.to_dict(), "faults": [fault.record() for fault in faults], "index": index, "target": target, "previous": previous,
            "wakes": [node for node, wakes in waking.items() if wakes], "exit_codes": codes, "recovery_s": recovery_s,
            "after_fault": summary(after_fault), "after_rerun": summary(recovered),
            "seconds": round(time.time() - started, 1), "violations": violations}


def landed(fault: dict) -> bool:
    """The fault did something: it came before the operation's end (or is of the node's world), and a fault aimed at
    a process found one (no module running at that moment, no engine at all: a miss)."""
    if fault["kind"] == "hub_fail":
        return fault["delivered"] and "MiB of the download" in (fault["detail"] or "")
    return fault["delivered"] and not (fault["kind"] in ("module_kill", "engine_kill", "engine_stop") and not fault["injected"])


def faults_of(runs: list[dict]) -> list[tuple[dict, dict]]:
    """Each fault of the runs with its run (a run of schedule version 3 had one, on node1)."""
    pairs = []
    for run in runs:
        if "faults" in run:
            pairs += [(fault, run) for fault in run["faults"]]
        else:
            pairs.append(({"where": "node1", "kind": run["fault"], "phase": run["phase"], "delay": run["delay"], "landed_phase": run["landed_phase"],
                           "delivered": run["delivered"], "detail": run.get("fault_detail"), "injected": run["injected"]}, run))
    return pairs


def moment(fault: dict) -> str:
    return fault["landed_phase"] or fault["phase"] or "delay"


def markdown(runs: list[dict]) -> list[str]:
    """The campaign's table for docs/testing.md: each fault kind's faults per phase it landed in, those delivered, the
    runs it was in with a violation (the violations of a run are its faults' together), and the mean recovery."""
    phases = [*schedule.SWITCH_PHASES, "facts", "teardown", "end", "delay"]
    pairs = faults_of(runs)
    cells: dict[tuple[str, str], int] = defaultdict(int)
    for fault, _run in pairs:
        cells[(fault["kind"], moment(fault))] += 1
    used = [phase for phase in phases if any(key[1] == phase for key in cells)]
    lines = ["| fault | " + " | ".join(used) + " | faults (delivered) | runs with a violation | recovery s, mean |", "|---" * (len(used) + 4) + "|"]
    for kind in schedule.FAULTS:
        mine = [(fault, run) for fault, run in pairs if fault["kind"] == kind]
        if not mine:
            continue
        counts = [str(cells[(kind, phase)] or "") for phase in used]
        delivered = sum(landed(fault) for fault, _run in mine)
        failing = sum(bool(run["violations"]) for _fault, run in mine)
        lines.append(f"| {kind} | " + " | ".join(counts) + f" | {len(mine)} ({delivered}) | {failing} | "
                     f"{sum(run['recovery_s'] for _fault, run in mine) / len(mine):.1f} |")
    return lines


def table(runs: list[dict]) -> list[str]:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for fault, run in faults_of(runs):
        cells[(fault["kind"], moment(fault))].append(run)
    lines = [f"{'fault':16} {'phase':10} {'faults':>6} {'in runs with a violation':>24} {'recovery s (mean)':>18}"]
    for (kind, phase), group in sorted(cells.items()):
        mean = sum(run["recovery_s"] for run in group) / len(group)
        lines.append(f"{kind:16} {phase:10} {len(group):6} {sum(bool(run['violations']) for run in group):24} {mean:18.1f}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1000, help="the first run's seed (run i has seed + i)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", help="comma-separated seeds to run instead (a replay)")
    parser.add_argument("--short", action="store_true", help="the short schedule: the seeds from 1000 that reach every fault and operation (the gate's)")
    parser.add_argument("--out", type=Path, help="the campaign's JSON (default: build/chaos-runs/LAB/campaign-SEED-RUNS.json)")
    parser.add_argument("--summarize", nargs="+", type=Path, metavar="JSON", help="print the table of these campaigns' runs (markdown), run nothing")
    args = parser.parse_args(argv)
    if args.summarize:
        runs = [run for path in args.summarize for run in json.loads(path.read_text())["runs"]]
        print("\n".join(markdown(runs)))
        operations = defaultdict(int)
        for run in runs:
            operations[run["operation"] + (" (a wake)" if run.get("wakes") and run["operation"] != "cleanup" else "")] += 1
        pairs = faults_of(runs)
        print(f"\n{len(runs)} runs, {len(pairs)} faults, {sum(landed(fault) for fault, _run in pairs)} delivered, "
              f"{sum(len(run['violations']) for run in runs)} violations; operations: "
              + ", ".join(f"{name} {count}" for name, count in sorted(operations.items())))
        return 0
    if not INVENTORY.exists():
        parser.error(f"no lab at {INVENTORY}: start it with `make chaos` (or GPUFLEET_LAB={LAB} python tests/sim/lab.py up --nodes {len(NODES)})")
    seeds = (schedule.covering(1000, NODES) if args.short else [int(word) for word in args.seeds.split(",")] if args.seeds
             else [args.seed + index for index in range(args.runs)])
    WORKDIR.mkdir(parents=True, exist_ok=True)
    out = args.out or WORKDIR / f"campaign-{seeds[0]}-{len(seeds)}.json"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return campaign(seeds, out)
    finally:
        for playbook in list(Playbook.running):
            playbook.signal(signal.SIGKILL)


def reset_lab() -> None:
    """What a campaign cut short (Ctrl-C, a kill) left of its faults, undone before the first run: another user's jobs
    and escaped workers (with their parents) ended, their records gone, faults cleared, stopped engines continued, a
    full disk given room, sshd and the hub running. Signals sent here come before the first run's start."""
    disks = "".join(f"if mountpoint -q {path}; then rm -f {path}/.chaos-fill; mkdir -p /run/chaos-keep{index}; "
                    f"cp -a {path}/. /run/chaos-keep{index}/; umount {path}; cp -a /run/chaos-keep{index}/. {path}/; "
                    f"rm -rf /run/chaos-keep{index}; fi; " for index, path in enumerate(FULL_DISKS))
    script = ("pkill -KILL -u alice; pkill -KILL -f '[r]espawner.py'; pkill -KILL -f '[e]scaped-worker'; "
              "rm -f /run/gpufleet-chaos/*.json /run/gpufleet-chaos/*.witness /run/gpufleet-chaos/*.pids; "
              "echo '{}' > /etc/gpufleet-sim/faults.json; "
              "for p in $(pgrep -f 'engine_double|sglang.launch_server'); do grep -q '^State:.*T' /proc/$p/status && kill -CONT $p; done; "
              f"{disks}systemctl start ssh.service; true")
    for node in NODES:
        node_exec(node, script, timeout=120)
        wait_reachable(node)


def ensure_hubs() -> None:
    """Each node's model hub, as a unit enabled at boot (a node restart brings it back)."""
    for node in NODES:
        if node_exec(node, f"systemctl is-active -q {HUB_UNIT}").returncode != 0:
            node_exec(node, HUB_SETUP, check=True, timeout=120)


def campaign(seeds: list[int], out: Path) -> int:
    reset_lab()
    ensure_hubs()
    results: list[dict] = []
    campaign_started = time.time()
    for index, seed in enumerate(seeds):
        run = schedule.plan(seed, NODES)
        result = one_run(run, index)
        results.append(result)
        verdict = "ok" if not result["violations"] else f"{len(result['violations'])} VIOLATION(S)"
        operation = f"{run.operation} (wakes on {', '.join(result['wakes'])})" if result["wakes"] and run.operation != "cleanup" else run.operation
        print(f"run {index + 1}/{len(seeds)} seed {seed}: {operation}: {verdict}, recovered in {result['recovery_s']} s, "
              f"{result['seconds']} s in all", flush=True)
        for fault in result["faults"]:
            at = fault["phase"] if fault["landed_phase"] in (None, fault["phase"]) else f"{fault['phase']}->{fault['landed_phase']}"
            what = ((fault["detail"] or "delivered") if fault["delivered"]
                    else f"not delivered: {fault['detail'] or fault['error'] or 'the run ended before its moment'}")
            print(f"    {fault['where']}: {fault['kind']} at {at or 'delay'}+{fault['delay']}s ({what})", flush=True)
        for violation in result["violations"]:
            print(f"    VIOLATION {violation}", flush=True)
        record = {"schedule_version": schedule.SCHEDULE_VERSION, "seeds": seeds, "lab": {"nodes": len(NODES)}, "started": campaign_started,
                  "seconds": round(time.time() - campaign_started, 1), "runs": results,
                  "failed_seeds": [item["seed"] for item in results if item["violations"]]}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(table(results)))
    failed = [item["seed"] for item in results if item["violations"]]
    print(f"chaos: {len(results)} run(s), {sum(len(item['violations']) for item in results)} violation(s)"
          + (f"; replay: make chaos CHAOS_NODES={len(NODES)} SEEDS={','.join(map(str, failed))}" if failed else "") + f"; {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
