"""What each run of a fault campaign does, drawn from its seed alone: the operation, and the faults with their moments.

A run is replayed exactly by its seed and the lab's size (`make chaos CHAOS_NODES=N SEEDS=S`): the draw uses nothing
but random.Random(seed). Each node of the lab gets two faults of its own world, of two kinds (its engine killed, its
disk full, a partition...), and a share of the runs a fault of the controller too (SIGKILL, Ctrl-C): faults that
overlap, as a fleet meets them (Jepsen's nemesis mixes them the same way). A fault's moment is a phase of the
operation, entered as the controller prints it (a task that starts the phase), plus a random delay; or a plain random
delay from the operation's start.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

# bumped whenever a change below draws other runs from the same seeds: a campaign's JSON names the version it replays on
SCHEDULE_VERSION = 6

# the gate's lab (the campaign draws for the nodes of its lab: a seed replays on a lab of the same size)
NODES = ("node1", "node2", "node3")
CONTROLLER = "controller"
# what an operator runs, and how often: "overlap" is two switches to one target at once, "check" a switch in --check
# mode; the switches (with and without a park, and so the wakes of the parked engine) are most of a fleet's days
OPERATIONS = {"switch": 35, "switch_park": 25, "cleanup": 15, "check": 15, "overlap": 10}
# the controller's faults: the whole run's (its process group)
CONTROLLER_FAULTS = (
    "controller_kill",  # the controller SIGKILLed (a closed laptop, an OOM kill)
    "controller_int",  # Ctrl-C: SIGINT to the controller's process group
)
CONTROLLER_SHARE = 0.3  # of the runs
FAULTS_PER_NODE = 2  # each node's own, of two kinds, each at its own moment: faults that overlap, as a bad day's do
# each node's faults
NODE_FAULTS = (
    "module_kill",  # the module's Python process on the node SIGKILLed
    "engine_kill",  # an engine's main process SIGKILLed (the serving one, the target or the parked one)
    "engine_stop",  # an engine's main process SIGSTOPped for longer than a stop or ready timeout
    "node_restart",  # the node restarted (its container, as a power cycle)
    "partition",  # the node's sshd stopped and its sessions cut for a while (a network partition), then started again
    "foreign_job",  # another user's GPU job appears
    "disk_full",  # the disk of the node's records (/var/lib/gpufleet-serving) and of its signal journal is full
    "escaped_worker",  # a worker of an engine's user outside its unit, holding a GPU (the teardown's to kill)
    "escaped_respawn",  # the same, under a parent of that user that starts it again whenever it dies
    "readiness_hang",  # the target's readiness never comes (its health stays 503)
    "hub_fail",  # the node's model hub stops mid-download (SGLang's model comes from it, staged again for this run)
)
FAULTS = CONTROLLER_FAULTS + NODE_FAULTS
# kinds that cannot be drawn for one node together (one escaped worker a node: the campaign records one)
EXCLUSIVE = ({"escaped_worker", "escaped_respawn"},)
# faults delivered even when the operation has ended by their moment (at its end): the node's world does not wait
WORLD_FAULTS = ("node_restart", "engine_kill", "engine_stop", "partition", "foreign_job", "disk_full", "readiness_hang", "escaped_worker",
                "escaped_respawn")
# the phases a switch enters, in order, as the controller prints them: the task that starts each one. A path that skips
# a phase (a wake has no preflight, stage or prewarm) gets the fault at the next phase it enters.
SWITCH_PHASES = {
    "lease": "Lease | One switch at a time on this node",
    "discover": "Discover | Enter the phase",
    "preflight": "Preflight | Enter the phase",
    "stage": "Stage | Enter the phase",
    "prewarm": "Prewarm | Read the target's weights",
    "cutover": "Cutover | Drain, stop every engine unit",  # drain, park, teardown, bring-up, answer check: on the node
    "finish": "Finish | Back in rotation, soak",
    "release": "Lease | Give the switch lease back",
    "report": "Gather every node's record into the run's report",
}
CLEANUP_PHASES = {
    "facts": "Facts | vLLM's unit, command line",
    "teardown": "Tear down - lease, decide, stop units",
    "report": "Gather every node's record into the run's report",
}
# a fault that needs no phase may also come at a plain delay
DELAY_SECONDS = (0.0, 40.0)
# within a phase: the cutover runs on the node for several seconds, a wider spread reaches its inner phases
WITHIN_PHASE_SECONDS = {"cutover": 8.0}
DEFAULT_WITHIN_SECONDS = 1.5
# the hub's failure aims at its download: the stage phase, within the download's 16 s (64 MiB at 4 MiB/s)
HUB_SECONDS = (1.0, 12.0)


@dataclass(frozen=True)
class Fault:
    where: str  # "controller", or the node it lands on
    kind: str
    phase: str | None  # the phase whose start it waits for; None: a plain delay from the operation's start
    delay: float  # seconds after the phase's start (or after the operation's start)
    fault_seconds: float  # how long a partition or a stop lasts before the recovery ends it

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Run:
    seed: int
    operation: str
    faults: tuple[Fault, ...]

    def to_dict(self) -> dict:
        return {"seed": self.seed, "operation": self.operation, "faults": [fault.to_dict() for fault in self.faults]}


def phases_of(operation: str) -> dict[str, str]:
    return CLEANUP_PHASES if operation == "cleanup" else SWITCH_PHASES


def _moment(draw: random.Random, operation: str, where: str, kind: str) -> Fault:
    if kind == "hub_fail" and operation != "cleanup":
        return Fault(where, kind, "stage", round(draw.uniform(*HUB_SECONDS), 1), round(draw.uniform(15.0, 30.0), 1))
    phases = list(phases_of(operation))
    if operation == "check":
        phases = [phase for phase in phases if phase not in ("cutover", "finish")]  # --check has neither
    phase: str | None = draw.choice([*phases, None])
    spread = DELAY_SECONDS if phase is None else (0.0, WITHIN_PHASE_SECONDS.get(phase, DEFAULT_WITHIN_SECONDS))
    delay = round(draw.uniform(*spread), 1)
    return Fault(where, kind, phase, delay, round(draw.uniform(15.0, 30.0), 1))


def plan(seed: int, nodes: tuple[str, ...] = NODES) -> Run:
    """The run a seed stands for: an operation, two faults on each node, and on some runs one on the controller."""
    draw = random.Random(seed)
    operation = draw.choices(list(OPERATIONS), weights=list(OPERATIONS.values()))[0]
    faults = []
    for node in nodes:
        kinds: list[str] = []
        while len(kinds) < FAULTS_PER_NODE:
            kind = draw.choice(NODE_FAULTS)
            if kind not in kinds and not any(kind in pair and set(kinds) & pair for pair in EXCLUSIVE):
                kinds.append(kind)
        faults += [_moment(draw, operation, node, kind) for kind in kinds]
    if draw.random() < CONTROLLER_SHARE:
        faults.append(_moment(draw, operation, CONTROLLER, draw.choice(CONTROLLER_FAULTS)))
    return Run(seed, operation, tuple(faults))


def campaign(first_seed: int, runs: int) -> list[Run]:
    return [plan(first_seed + index) for index in range(runs)]


def covering(first_seed: int, nodes: tuple[str, ...] = NODES, window: int = 400) -> list[int]:
    """Few seeds from first_seed on that together reach every fault kind and every operation: greedily, the seed of
    the window that adds the most not yet reached, ties to the lowest. The gate's short schedule is this list, fixed
    in the Makefile (a test keeps them equal)."""
    wanted = set(FAULTS) | {f"op:{name}" for name in OPERATIONS}
    reaches = {seed: {fault.kind for fault in run.faults} | {f"op:{run.operation}"}
               for seed in range(first_seed, first_seed + window) for run in [plan(seed, nodes)]}
    chosen: list[int] = []
    missing = set(wanted)
    while missing:
        best = max(reaches, key=lambda seed: (len(reaches[seed] & missing), -seed))
        if not reaches[best] & missing:
            raise ValueError(f"seeds {first_seed}-{first_seed + window - 1} never reach {', '.join(sorted(missing))}")
        chosen.append(best)
        missing -= reaches[best]
    return sorted(chosen)
