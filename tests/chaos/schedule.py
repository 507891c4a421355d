"""What each run of a fault campaign does, drawn from its seed alone: the operation, the fault, and the moment.

A run is replayed exactly by its seed (`make chaos SEED=S RUNS=1`): the draw uses nothing but random.Random(seed).
The moment is a phase of the operation, entered as the controller prints it (a task that starts the phase), plus a
random delay; or, for faults that do not wait for a phase, a plain random delay from the operation's start.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

# bumped whenever a change below draws other runs from the same seeds: a campaign's JSON names the version it replays on
SCHEDULE_VERSION = 3

# what an operator runs, and how often: "overlap" is two switches to one target at once, "check" a switch in --check
# mode; the switches (with and without a park, and so the wakes of the parked engine) are most of a fleet's days
OPERATIONS = {"switch": 35, "switch_park": 25, "cleanup": 15, "check": 15, "overlap": 10}
# each fault an operator meets; where it lands is the moment's business
FAULTS = (
    "controller_kill",  # the controller SIGKILLed (its whole process group: a closed laptop, an OOM kill)
    "controller_int",  # Ctrl-C: SIGINT to the controller's process group
    "module_kill",  # the module's Python process on node1 SIGKILLed
    "engine_kill",  # an engine's main process on node1 SIGKILLed (the serving one, the target or the parked one)
    "engine_stop",  # an engine's main process on node1 SIGSTOPped for longer than a stop or ready timeout
    "node_restart",  # node1 restarted (its container, as a power cycle)
    "partition",  # node1's sshd stopped and its sessions cut for a while (a network partition), then started again
    "foreign_job",  # another user's GPU job appears on node1
    "disk_full",  # the disk of node1's records (/var/lib/gpufleet-serving) and of its signal journal is full
    "escaped_worker",  # a worker of the serving engine's user outside its unit, holding a GPU (the teardown's to kill)
    "readiness_hang",  # the target's readiness never comes (its health stays 503)
)
# faults in the node's world, not the run's: delivered even when the operation has ended by their moment (at its end)
NODE_FAULTS = ("node_restart", "engine_kill", "engine_stop", "partition", "foreign_job", "disk_full", "readiness_hang", "escaped_worker")
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
# a fault that needs no phase (it is in the node's world, not the run's) may also come at a plain delay
DELAY_SECONDS = (0.0, 40.0)
# within a phase: the cutover runs on the node for several seconds, a wider spread reaches its inner phases
WITHIN_PHASE_SECONDS = {"cutover": 8.0}
DEFAULT_WITHIN_SECONDS = 1.5


@dataclass(frozen=True)
class Run:
    seed: int
    operation: str
    fault: str
    phase: str | None  # the phase whose start the fault waits for; None: a plain delay from the operation's start
    delay: float  # seconds after the phase's start (or after the operation's start)
    fault_seconds: float  # how long a partition or a stop lasts before the recovery ends it

    def to_dict(self) -> dict:
        return asdict(self)


def phases_of(operation: str) -> dict[str, str]:
    return CLEANUP_PHASES if operation == "cleanup" else SWITCH_PHASES


def plan(seed: int) -> Run:
    """The run a seed stands for."""
    draw = random.Random(seed)
    operation = draw.choices(list(OPERATIONS), weights=list(OPERATIONS.values()))[0]
    fault = draw.choice(FAULTS)
    phases = list(phases_of(operation))
    if operation == "check":
        phases = [phase for phase in phases if phase not in ("cutover", "finish")]  # --check has neither
    phase: str | None = draw.choice([*phases, None])
    spread = DELAY_SECONDS if phase is None else (0.0, WITHIN_PHASE_SECONDS.get(phase, DEFAULT_WITHIN_SECONDS))
    delay = round(draw.uniform(*spread), 1)
    fault_seconds = round(draw.uniform(15.0, 30.0), 1)
    return Run(seed, operation, fault, phase, delay, fault_seconds)


def campaign(first_seed: int, runs: int) -> list[Run]:
    return [plan(first_seed + index) for index in range(runs)]


def covering(first_seed: int, want: int = 0, limit: int = 10_000) -> list[int]:
    """The fewest seeds from first_seed on (greedily) that reach every fault kind and every operation at least once,
    then more up to ``want``: the gate's short schedule is such a list, fixed in the Makefile."""
    chosen: list[int] = []
    faults: set[str] = set()
    operations: set[str] = set()
    for seed in range(first_seed, first_seed + limit):
        run = plan(seed)
        if run.fault not in faults or run.operation not in operations or len(chosen) < want:
            chosen.append(seed)
            faults.add(run.fault)
            operations.add(run.operation)
        if faults == set(FAULTS) and operations == set(OPERATIONS) and len(chosen) >= want:
            return chosen
    raise ValueError(f"no {want} seeds from {first_seed} cover every fault and operation")
