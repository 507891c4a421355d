# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The switch's node-local critical path as one step: (when asked) the target's preflight and files, then drain, stop
every engine unit hard, kill what still holds the GPUs, assert every GPU free, start the target and wait until it
serves (and, when asked, keeps serving through a soak) - or, when the target does not come up or crashes in its soak,
tear it down and start the previous engine again.

With a park (switch_engine_park_previous), the previous engine is parked after its drain instead of stopped: its
weights go to host memory, its process stays, the teardown keeps it, and a rollback wakes it instead of starting it.
Switching back to a parked engine (wake) stops the engine serving and wakes the parked one instead of starting it.

Everything with a side effect goes through one seam, NodeOps, which the module builds from the other module_utils
(_systemd, _holders_kill, _memory, _readiness) and tests replace. Phase times are the node's monotonic clock, turned into
unix seconds once (the controller's marks are unix seconds too), so the report's phases are measured where they happen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils import _phases as phases
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers, park
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import TeardownFailed, TeardownOps, teardown
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative

# the node's record of its last cutover (engine_observe reads it back for the next run's report)
RECORD_PATH = paths.LAST_CUTOVER


class NotServing(Error):
    """The target (or, in the rollback, the previous engine) did not serve within its bound."""


class NotParked(Error):
    """The previous engine parked but left too much on a GPU for the target: it is woken again."""


@dataclass
class Engine:
    """An engine as the cutover starts, probes or drains it."""
    engine: str
    unit: str
    url: str
    model: str
    api_key: str | None = None
    ready_timeout: float = 600.0

    @classmethod
    def from_params(cls, name: str, params: dict | None) -> Engine | None:
        if not params:
            return None
        missing = [key for key in ("engine", "unit", "url", "model") if not params.get(key)]
        if missing:
            raise InvalidInput(f"{name}: missing {', '.join(missing)}")
        if params["engine"] not in ("vllm", "sglang"):
            raise InvalidInput(f"{name}.engine: {params['engine']!r} is not vllm or sglang")
        return cls(engine=params["engine"], unit=params["unit"], url=params["url"], model=params["model"], api_key=params.get("api_key") or None,
                   ready_timeout=non_negative(f"{name}.ready_timeout", float(params.get("ready_timeout") or 600), minimum_exclusive=True))


@dataclass
class CutoverRequest:
    units: list[str]  # every engine unit of the node: all stopped hard, whichever was running
    target: Engine
    previous: Engine | None  # None: no engine served before, nothing to drain or roll back to
    drain_timeout: float = 120.0
    stop_grace: float = 10.0  # an engine the drain found idle
    stop_timeout: float = 90.0  # an engine still busy, or one that did not answer
    restore: list[dict] = field(default_factory=list)  # [{src, dest}]: the previous engine's files, put back for the rollback
    boot: bool = False  # the engine serving at the end is the only one of units enabled at boot
    soak: float = 0.0  # seconds the target must go on serving after it was ready; a crash in them rolls back
    prewarm_paths: list[str] = field(default_factory=list)  # the target's weights, read into the page cache before the drain
    prewarm_timeout: float = 0.0
    # before anything is written or stopped: the target's preflight (a _preflight.Request; a failed check ends the
    # cutover with nothing touched) and its unit and secrets (_files.WantedFile, written with systemd reloaded)
    preflight: object | None = None
    files: list = field(default_factory=list)
    park_previous: bool = False  # park the previous engine after its drain instead of stopping it
    wake: bool = False  # the target is the engine parked on the node: kept through the teardown and woken, not started
    evict: bool = False  # an engine parked on the node is stopped with the others (its record removed)
    park_timeout: float = 120.0  # a park's or a wake's own call
    target_memory_fraction: float | None = None  # the target's share of each GPU, checked against what a park leaves
    # the disk holds one model: the target's staged after the teardown, in place of the previous engine's
    # (model_stage's options, replace: now), and the previous engine's staged again by a rollback
    replace_model: dict | None = None
    restage_previous: dict | None = None
    # before the node goes back into rotation: the engine's answers checked (_answers.CheckSettings), None: not checked
    answers: object | None = None

    def __post_init__(self) -> None:
        if not self.units:
            raise InvalidInput("units: give every engine unit of the node (the target's among them)")
        if self.target.unit not in self.units:
            raise InvalidInput(f"units: {', '.join(self.units)} does not include the target's unit {self.target.unit}")
        for name in ("drain_timeout", "stop_grace", "stop_timeout", "soak", "prewarm_timeout", "park_timeout"):
            non_negative(name, getattr(self, name))
        if self.park_previous and not self.previous:
            raise InvalidInput("park_previous: there is no previous engine to park")
        if self.park_previous and self.previous.unit == self.target.unit:
            raise InvalidInput("park_previous: the previous engine runs in the target's unit; it cannot be parked and started again")
        if self.park_previous and self.wake:
            raise InvalidInput("park_previous and wake: at most one engine is parked on a node")
        if self.replace_model and not (self.previous and self.restage_previous):
            raise InvalidInput("replace_model: give restage_previous too (a rollback stages the previous engine's model again)")
        if self.replace_model and (self.park_previous or self.wake):
            raise InvalidInput("replace_model: the previous engine's model is removed; it cannot be parked, nor the target woken")

    @property
    def longest_run(self) -> float:
        """An upper bound of the cutover's own waits (the switch's lease renewal covers it)."""
        previous_start = self.previous.ready_timeout if self.previous else 0.0
        prewarm = self.prewarm_timeout if self.prewarm_paths else 0.0
        # its version command, then NVML opened twice (the GPUs, their holders)
        preflight = self.preflight.version_timeout + 2 * self.preflight.nvml_timeout if self.preflight is not None else 0.0
        park_calls = 2 * self.park_timeout if self.park_previous or self.wake else 0.0
        # the target's download, then the previous model's again
        replace = sum(float(stage.get("timeout") or 0) for stage in (self.replace_model, self.restage_previous) if stage) if self.replace_model else 0.0
        # the target's answers, and the previous engine's after a rollback
        checks = 2 * self.answers.longest_run if self.answers is not None else 0.0
        return (preflight + prewarm + self.drain_timeout + 2 * self.stop_timeout + self.target.ready_timeout + self.soak + previous_start
                + park_calls + replace + checks)


class NodeOps(TeardownOps):
    """The seam: every side effect of the cutover, the teardown's among them. The module implements it; tests replace it."""

    def preflight(self, request) -> dict:
        """engine_preflight's result for ``request``: {passed, failures, checks, gpus, holders}; observes only."""
        raise NotImplementedError

    def write_files(self, wanted: list) -> dict:
        """engine_files' result: {changed, files, reloaded}; raises Error (nothing was stopped yet)."""
        raise NotImplementedError

    def stage(self, params: dict) -> dict:
        """model_stage's result for ``params`` (for real); raises Error."""
        raise NotImplementedError

    def ask(self, engine: Engine, prompt: str, max_tokens: int, timeout: float) -> answers.Answer:
        """One greedy completion (temperature 0) with the chosen tokens' logprobs, within timeout seconds; raises Error
        when it fails."""
        raise NotImplementedError

    def unit_command(self, unit: str) -> str:
        """The command line the unit runs (its ExecStart=)."""
        raise NotImplementedError

    def engine_said(self, unit: str) -> str | None:
        """The root cause the engine printed since its unit's last start (its first exception line), or None."""
        return None

    def read_answers(self, path: str) -> dict | None:
        """A golden record, or None where there is none (or it cannot be read)."""
        raise NotImplementedError

    def write_answers(self, path: str, record: dict) -> None:
        raise NotImplementedError

    def prewarm(self, paths: list[str], timeout: float) -> dict:
        """weights_prewarm's record; raises Error (the cutover records it: a slower start, never a reason to stop)."""
        raise NotImplementedError

    def drain(self, engine: Engine, timeout: float) -> dict:
        raise NotImplementedError

    def park(self, engine: Engine, timeout: float) -> dict:
        """Park the engine (its park call, park.CALLS); returns {seconds, invocation_id, leftover_mib {gpu: MiB}, gpus
        [{index, total_mib}], host_memory_bytes}, measured once it answered; raises Error when it did not park."""
        raise NotImplementedError

    def wake(self, engine: Engine, timeout: float) -> dict:
        """Wake the parked engine (its wake call, park.CALLS): {seconds}; raises Error when it did not answer."""
        raise NotImplementedError

    def record_parked(self, record: dict | None, measured: dict | None = None) -> None:
        """The node's record of its parked engine: written (with what its park measured), or removed (None)."""
        raise NotImplementedError

    def restore(self, files: list[dict]) -> None:
        raise NotImplementedError

    def start(self, unit: str) -> None:
        raise NotImplementedError

    def wait_ready(self, engine: Engine, timeout: float) -> dict:
        """The engine serves (health, model, a one-token completion) within timeout; raises NotServing otherwise."""
        raise NotImplementedError

    def set_boot(self, enable: str | None, units: list[str]) -> dict:
        """Only ``enable`` of ``units`` starts at boot (None: none); returns {enabled, disabled, at_boot}."""
        raise NotImplementedError

    def soak(self, engine: Engine, seconds: float) -> dict:
        """The engine keeps its invocation and main PID and keeps serving for ``seconds``: the soak's record; raises
        (EngineExited, CheckFailed) when it did not."""
        raise NotImplementedError


class Phases:
    """[[phase, unix seconds], ...] from the node's monotonic clock, anchored once to its wall clock."""

    def __init__(self, clock: Clock, wall_now: float):
        self.clock = clock
        self.origin = clock.monotonic()
        self.wall_origin = wall_now
        self.marks: list[list] = []

    def now(self) -> float:
        return round(self.wall_origin + self.clock.monotonic() - self.origin, 3)

    def enter(self, phase: str) -> None:
        # the phases the report knows (_phases.CUTOVER), in their order; "end" closes the last
        if phase != "end" and phase not in phases.CUTOVER:
            raise ValueError(f"the cutover has no phase {phase!r}")
        self.marks.append([phase, self.now()])

    @property
    def current(self) -> str | None:
        return self.marks[-1][0] if self.marks else None


def cutover(request: CutoverRequest, ops: NodeOps, clock: Clock, wall_now: float) -> dict:
    """Drain, tear down, bring up; on a failure after the drain began, roll back. The result always returns (a
    failure is its ``result``), so that the controller records every phase whatever happened."""
    phases = Phases(clock, wall_now)
    result = empty_result("switched")
    if not prepare(request, ops, phases, result):
        phases.enter("end")
        result["marks"] = phases.marks
        return result
    if request.prewarm_paths:
        # still before the drain: the previous engine serves while the target's weights are read
        phases.enter("prewarm")
        try:
            result["prewarm"] = ops.prewarm(request.prewarm_paths, request.prewarm_timeout)
        except Error as exc:
            result["prewarm"] = {"failed": True, "msg": exc.msg}
    try:
        stop_timeout = request.stop_timeout
        if request.previous:
            phases.enter("drain")
            result["drain"] = ops.drain(request.previous, request.drain_timeout)
            if result["drain"].get("answering") and result["drain"].get("drained"):
                stop_timeout = request.stop_grace  # idle: a short grace on SIGTERM
        else:
            stop_timeout = request.stop_grace  # nothing served: whatever is left gets the short grace
        kept = (request.target.unit,) if request.wake else ()
        if request.park_previous:
            phases.enter("park")
            kept = park_previous(request, ops, result)
        phases.enter("teardown")
        try:
            result["teardown"] = teardown(request.units, ops, stop_timeout, kept=kept)
        except TeardownFailed as exc:
            result["teardown"] = exc.context["steps"]
            raise
        if request.replace_model:
            # nothing runs from the previous model now: it goes, the target's comes (the downtime holds the download)
            phases.enter("replace")
            try:
                result["replace"] = ops.stage(request.replace_model)
            except Error as exc:
                result["replace"] = {"failed": True, "msg": exc.msg, **{key: exc.context[key] for key in ("replace", "bytes") if key in exc.context}}
                raise
        phases.enter("bring_up")
        started = clock.monotonic()
        if request.wake:
            result["wake"] = ops.wake(request.target, request.park_timeout)
        else:
            ops.start(request.target.unit)
        # while the engine loads: a node rebooted from here on starts the engine that serves (the rollback resets it)
        set_boot(request, ops, request.target.unit, result)
        result["ready"] = ops.wait_ready(request.target, request.target.ready_timeout)
        result["engine_start_s"] = round(clock.monotonic() - started, 3)
        if request.wake:
            result["wake"]["wake_s"] = result["engine_start_s"]
        if request.answers:
            phases.enter("answer_check")
            result["answer_check"] = checked_answers(request, ops, clock, request.target)
            if not result["answer_check"]["passed"] and request.wake:
                restart_cold(request, ops, clock, phases, result)
            if not result["answer_check"]["passed"]:
                raise WrongAnswers(f"{request.target.engine} answered wrongly ({result['answer_check']['kind']} check): "
                                   f"{result['answer_check']['mismatch']}")
        if request.soak > 0:
            phases.enter("soak")
            result["soak"] = ops.soak(request.target, request.soak)
        if request.answers:
            keep_record(request, ops, result["answer_check"], phases.now())
    except Error as exc:
        result.update(result="rolled_back", reason=f"{phases.current}: {exc.msg}")
        if phases.current == "soak":
            result["soak"] = exc.context.get("soak")
        if isinstance(exc, NotParked):
            result["park"] = exc.context.get("park")
        roll_back(request, ops, clock, phases, result)
    record_parked(request, ops, result)
    phases.enter("end")
    result["marks"] = phases.marks
    return result


def empty_result(outcome: str) -> dict:
    """A cutover's result before any step ran: every key the report reads, none filled."""
    return {"changed": True, "result": outcome, "reason": None, "rollback_error": None, "drain": None, "teardown": None, "rollback_teardown": None,
            "engine_start_s": None, "ready": None, "soak": None, "prewarm": None, "boot": None, "boot_error": None, "preflight": None, "files": None,
            "park": None, "wake": None, "replace": None, "restage": None, "answer_check": None, "rollback_answer_check": None}


def rollback_alone(request: CutoverRequest, ops: NodeOps, clock: Clock, wall_now: float, reason: str, parked_unit: str | None = None) -> dict:
    """The switch's one rollback, asked for by the controller when the cutover did not run it: a failure the controller
    saw after the cutover switched (the soak after the balancer's join, the drafter's floor), or a cutover whose own run
    failed as a task. ``parked_unit``: the engine the node's park record names - the previous engine parked by the
    cutover is woken, not started. The same steps, boot state and park record as the cutover's own rollback, and the
    same result keys."""
    phases = Phases(clock, wall_now)
    result = empty_result("rolled_back")
    result["reason"] = reason
    if request.previous and parked_unit == request.previous.unit:
        result["park"] = {"parked": True}
    roll_back(request, ops, clock, phases, result)
    record_parked(request, ops, result)
    phases.enter("end")
    result["marks"] = phases.marks
    return result


def roll_back(request: CutoverRequest, ops: NodeOps, clock: Clock, phases: Phases, result: dict) -> None:
    """The rollback phase: its steps (rollback()), a failure of theirs as the result's rollback_failed, then only the
    previous engine at boot."""
    phases.enter("rollback")
    try:
        result["rollback_teardown"] = rollback(request, ops, parked=bool((result.get("park") or {}).get("parked")), result=result, clock=clock)
    except Error as rollback_exc:
        result["rollback_error"] = rollback_exc.msg
        result["result"] = "rollback_failed"
        if isinstance(rollback_exc, TeardownFailed):
            result["rollback_teardown"] = rollback_exc.context["steps"]
    # the engine meant to serve now starts at boot, whether its rollback came up or not
    set_boot(request, ops, request.previous.unit if request.previous else None, result)


def park_previous(request: CutoverRequest, ops: NodeOps, result: dict) -> tuple[str, ...]:
    """Park the drained previous engine; the units the teardown keeps, none where it was not parked (its call failed:
    it is stopped as without a park, and the result says why). Raises NotParked when what it leaves on a GPU does not
    leave the target its share: the rollback then wakes it."""
    try:
        parked = ops.park(request.previous, request.park_timeout)
    except Error as exc:
        result["park"] = {"parked": False, "reason": f"the park failed, stopped instead: {exc.msg}"}
        return ()
    parked = dict(parked, parked=True)
    result["park"] = parked
    problems = park.gpu_room(parked.get("gpus") or [], parked.get("leftover_mib") or {}, request.target_memory_fraction, request.target.engine)
    if problems:
        raise NotParked("; ".join(problems), park=parked)
    return (request.previous.unit,)


def parked_now(request: CutoverRequest, result: dict) -> str | None:
    """The unit of the engine parked once the cutover ended, if any: the previous engine parked for a target that
    serves, or one the rollback did not wake."""
    parked = result.get("park") or {}
    if not parked.get("parked"):
        return None
    if result["result"] == "switched":
        return request.previous.unit
    return None  # rolled back: woken; rollback_failed: the record is removed, the next run reads the units afresh


def record_parked(request: CutoverRequest, ops: NodeOps, result: dict) -> None:
    """The node's record of its parked engine, as the cutover left it (a wake or an eviction removes it)."""
    if not (request.park_previous or request.wake or request.evict):
        return  # no engine was or is parked here
    unit = parked_now(request, result)
    record = None
    if unit:
        parked = result["park"]
        record = {"engine": request.previous.engine, "unit": unit, "model": request.previous.model, "url": request.previous.url,
                  "invocation_id": parked.get("invocation_id"), "boot_id": parked.get("boot_id"), "parked_at": parked.get("at"),
                  "park_s": parked.get("seconds"), "leftover_mib": parked.get("leftover_mib") or {},
                  "host_memory_bytes": parked.get("host_memory_bytes")}
    try:
        if record:
            ops.record_parked(record, result["park"])
        else:
            ops.record_parked(None)
        result["parked"] = record
    except Error as exc:  # the engines are as they are; the next run reads the units again
        result["parked_error"] = exc.msg


def prepare(request: CutoverRequest, ops: NodeOps, phases: Phases, result: dict) -> bool:
    """The target's preflight, then its files, while the previous engine still serves. False, with the result set,
    when the cutover must stop here: a failed check (nothing written) or files that could not be written."""
    if request.preflight is not None:
        phases.enter("preflight")
        result["preflight"] = ops.preflight(request.preflight)
        if not result["preflight"]["passed"]:
            result.update(changed=False, result="preflight_failed", reason="; ".join(result["preflight"]["failures"]))
            return False
    if request.files:
        phases.enter("stage")
        try:
            result["files"] = ops.write_files(request.files)
        except Error as exc:
            result.update(changed=True, result="failed", reason=f"stage: the target's files: {exc.msg}")
            return False
    return True


def rollback(request: CutoverRequest, ops: NodeOps, parked: bool = False, result: dict | None = None, clock: Clock | None = None) -> dict:
    """Tear the failed target down (it serves no one: the short grace), put the previous engine's files back - and its
    model, where the target's replaced it - start it (or wake it, when it was parked) and wait until it serves; raises
    what failed. Returns the rollback teardown's steps. Another user's job on the GPUs is left (it came during the
    cutover: the preflight refused any before the drain) - refusing it here would leave no engine at all."""
    steps = teardown(request.units, ops, request.stop_grace, kept=(request.previous.unit,) if parked else (), leave_foreign=True)
    if request.restore and not parked:
        ops.restore(request.restore)
    if request.replace_model:
        # whether or not the replacement got as far as removing it: a model still whole is found present, not fetched
        try:
            restaged = ops.stage(request.restage_previous)
        except Error as exc:
            raise Error(f"the previous engine's model could not be staged again: {exc.msg}") from None
        if result is not None:
            result["restage"] = restaged
    ops.reset_failed([request.target.unit])
    if request.previous:
        if parked:
            ops.wake(request.previous, request.park_timeout)
        else:
            ops.start(request.previous.unit)
        ops.wait_ready(request.previous, request.previous.ready_timeout)
        if request.answers and clock is not None:
            # its own record, where it has one; no operator's expectation (those are the target's)
            checked = checked_answers(request, ops, clock, request.previous, expectations=False)
            if not checked["passed"] and parked:
                # woken and answering otherwise: started cold, as a woken target is
                teardown(request.units, ops, request.stop_grace, leave_foreign=True)
                ops.reset_failed([request.previous.unit])
                ops.start(request.previous.unit)
                ops.wait_ready(request.previous, request.previous.ready_timeout)
                checked = dict(checked_answers(request, ops, clock, request.previous, expectations=False), after_wake=checked)
            if result is not None:
                result["rollback_answer_check"] = checked
            if not checked["passed"]:
                raise WrongAnswers(f"{request.previous.engine} answers wrongly after the rollback ({checked['kind']} check): {checked['mismatch']}")
    return steps


class WrongAnswers(Error):
    """The engine serves, but its answers differ from its record or make no sense."""


def checked_answers(request: CutoverRequest, ops: NodeOps, clock: Clock, engine: Engine, expectations: bool = True) -> dict:
    """The probes (and the operator's expectations) sent one at a time and judged against the engine's record."""
    settings = request.answers
    started = clock.monotonic()
    ident = answers.identity(engine.engine, engine.model, settings.versions.get(engine.engine), ops.unit_command(engine.unit))
    path = answers.record_path(settings.record_dir, ident)
    record = None if settings.refresh else ops.read_answers(path)
    checks = list(settings.expectations) if expectations else []
    retried: list[str] = []
    try:
        got = [ask_retrying_once(ops, clock, engine, prompt, answers.PROBE_TOKENS, settings.probe_timeout, retried)
               for prompt in settings.probes]
        expected = [ask_retrying_once(ops, clock, engine, check.prompt, check.max_tokens, settings.probe_timeout, retried)
                    for check in checks]
    except Error as exc:
        said = ops.engine_said(engine.unit)
        verdict = {"kind": "golden" if record else "sanity", "passed": False, "drift": None, "recorded_at": (record or {}).get("created"),
                   "mismatch": f"a probe failed: {exc.msg}" + (f"; {engine.engine} said: {said}" if said else "")
                   + (f" (journalctl -u {engine.unit})" if said else "")}
        got, expected = [], []
    else:
        verdict = answers.judge(ident, record, got, checks, expected, settings.tolerance, settings.degenerate_check)
    return dict(verdict, probes=len(settings.probes) + len(checks), seconds=round(clock.monotonic() - started, 3), record=path,
                identity=ident, answers=[answer.to_dict() for answer in got], expected=[answer.to_dict() for answer in expected],
                recorded=False, refresh=settings.refresh, retried=retried[0] if retried else None)


# a probe that fails is asked once more after this long (an engine's first request may fail while it warms up); a
# second failure in the same check is the engine's answer
PROBE_RETRY_SECONDS = 1.0


def ask_retrying_once(ops: NodeOps, clock: Clock, engine: Engine, prompt: str, max_tokens: int, timeout: float,
                      retried: list[str]) -> answers.Answer:
    """One probe; the first failure of a check is retried once, and noted in ``retried`` (the check's result says so)."""
    try:
        return ops.ask(engine, prompt, max_tokens, timeout)
    except Error as exc:
        if retried:
            raise
        retried.append(exc.msg)
    clock.sleep(PROBE_RETRY_SECONDS)
    return ops.ask(engine, prompt, max_tokens, timeout)


def restart_cold(request: CutoverRequest, ops: NodeOps, clock: Clock, phases: Phases, result: dict) -> None:
    """A woken engine that answers otherwise than its record: stopped and started cold, checked again."""
    woken = result["answer_check"]
    result["wake"]["answered_differently"] = woken["mismatch"]
    phases.enter("restart")
    teardown(request.units, ops, request.stop_grace)
    ops.reset_failed([request.target.unit])
    started = clock.monotonic()
    ops.start(request.target.unit)
    result["ready"] = ops.wait_ready(request.target, request.target.ready_timeout)
    result["engine_start_s"] = round(clock.monotonic() - started, 3)
    result["answer_check"] = dict(checked_answers(request, ops, clock, request.target), after_wake=woken)


def keep_record(request: CutoverRequest, ops: NodeOps, checked: dict, now: float) -> None:
    """An engine that passed its sanity check and served through its soak: its answers become its record."""
    if checked["kind"] != "sanity" or not checked["passed"]:
        return
    record = answers.new_record(checked["identity"], [answers.Answer(**answer) for answer in checked["answers"]], now)
    try:
        ops.write_answers(checked["record"], record)
        checked["recorded"] = True
    except Error as exc:  # the engine serves right; the next check is a sanity check again
        checked["record_error"] = exc.msg


def node_record(request: CutoverRequest, result: dict, run_id: str | None, finished: float) -> dict:
    """What the node keeps of a cutover for the next run: whose it was, from what to what, how it ended and when."""
    return {"run_id": run_id, "target": request.target.engine, "previous": request.previous.engine if request.previous else None,
            "result": result["result"], "reason": result.get("reason"), "finished": round(finished, 3)}


def set_boot(request: CutoverRequest, ops: NodeOps, enable: str | None, result: dict) -> None:
    """Only ``enable`` at boot, when the request asks for it. A failure here leaves the engine serving: it is the
    result's boot_error, for the caller to report, not a reason to roll back."""
    if not request.boot:
        return
    try:
        result["boot"] = ops.set_boot(enable, request.units)
        result["boot_error"] = None
    except Error as exc:
        result["boot_error"] = f"only {enable or 'no engine'} at boot: {exc.msg}"


def not_serving_message(engine: Engine, waited: float, unit_state: str | None, detail: str) -> str:
    """What the switch says of an engine that did not come up - the engine_common role's words."""
    if unit_state in ("failed", "inactive", "auto-restart"):
        return f"{engine.unit} stopped {waited:.1f} s after its start, before it served: {detail}"
    return f"{engine.unit} did not serve within {waited:.1f} s (ready_timeout {engine.ready_timeout:g} s): {detail}"
