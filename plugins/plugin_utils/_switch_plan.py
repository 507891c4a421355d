# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The switch's decisions for one node, made once, from the role's settings and what the engines' read found.

The switch_engine role asks once per node, after its read (filter gpufleet.serving.switch_steps), and its tasks only
follow the answer: whether the node is unchanged, where each phase runs - a task of the role on the controller, inside
the cutover's one module run on the node, or not at all - and the bounds and items those steps take. After the cutover,
finish_steps says what is left. Runs on the controller; pure (no I/O), so that every branch is tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils import _phases as phases
from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers, park
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._models import staging
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import longest_run
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative
from ansible_collections.gpufleet.serving.plugins.module_utils._versions import matches_pin, reported_version

CONTROLLER, CUTOVER, SKIP = phases.CONTROLLER, phases.IN_CUTOVER, phases.SKIPPED
# seconds the target's preflight may take inside the cutover: its version command (engine_preflight's 120 s) and two NVML reads
PREFLIGHT_BOUND = 140.0
# an engine's unit without a known TimeoutStopSec: systemd's default (90 s)
DEFAULT_STOP_BOUND = 90.0
ENDED_WITH_AN_ENGINE = results.SERVING


@dataclass(frozen=True)
class Settings:
    """The switch's settings for this node (the role's variables)."""
    target: str
    rotation: str = "none"
    check_mode: bool = False
    prewarm: bool = True
    prewarm_timeout: float = 0.0
    min_spec_acceptance: float | None = None
    lease_seconds: float = 300.0
    soak_seconds: float = 0.0
    stop_timeout: float = 0.0  # 0: the previous engine's unit's own bound
    drain_timeout: float = 120.0
    kill_timeout: float = 30.0
    term_timeout: float = 30.0
    memory_timeout: float = 60.0
    backup_dir: str = ""
    run_id: str = ""
    haproxy_backend: str = ""
    leave_tasks: str = ""  # the custom rotation's task files
    join_tasks: str = ""
    park_previous: str = "off"  # off, auto (park where the engine and the host allow it) or required
    park_margin_mib: int = 2048  # host memory kept free beside a parked engine's weights
    replace_model: bool = False  # the target's model may take the place of the previous engine's (after its stop)
    answer_check: bool = True  # the engine's answers checked before rotation
    answer_refresh: bool = False  # a new record taken on purpose
    answer_expectations: int = 0  # the operator's expectations (switch_engine_answer_checks)
    answer_timeout: float = answers.DEFAULT_PROBE_TIMEOUT  # seconds one probe may take (switch_engine_answer_timeout)
    outside_units: str = "fail"  # another user's GPU holders: fail, report or kill (switch_engine_outside_units)

    @classmethod
    def from_vars(cls, values: dict) -> Settings:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidInput(f"switch plan settings: unknown {', '.join(unknown)}")
        settings = cls(**values)
        park.check_mode(settings.park_previous)
        for name in ("prewarm_timeout", "lease_seconds", "soak_seconds", "stop_timeout", "drain_timeout", "kill_timeout", "term_timeout",
                     "memory_timeout", "answer_timeout"):
            object.__setattr__(settings, name, non_negative(name, float(getattr(settings, name))))
        return settings


@dataclass(frozen=True)
class Found:
    """What the engines' read found on the node (engine_observe, through the role's gpufleet.serving.observed)."""
    engines: dict  # each engine's facts (gpufleet.serving.engine_facts), by name
    found: list = field(default_factory=list)  # the engines running
    serving: list = field(default_factory=list)  # the engines answering readiness, with a completion
    previous: str = "none"  # the engine to drain and to roll back to
    staged: bool = False  # an interrupted run's staged mark is there
    files: dict = field(default_factory=dict)  # the target's files that differ from its role's: {unit: [...], secrets: [...]}
    target_installed: str | None = None  # the version the target's executable runs
    user_ready: bool = True  # the target's own user is as its role would make it
    parked: dict | None = None  # the engine parked on the node (engine_observe's parked: with alive, reason)
    previous_argv: list = field(default_factory=list)  # the command the previous engine runs
    previous_version: str | None = None  # the version it runs
    host: dict = field(default_factory=dict)  # the host's memory: available_bytes, total_bytes
    sizes: dict = field(default_factory=dict)  # bytes of weights by model directory
    park_history: dict = field(default_factory=dict)  # what each engine's last park on the node left (engine_observe)
    target_argv: list = field(default_factory=list)  # the command the target's unit runs now
    answer_records: list = field(default_factory=list)  # the golden records on the node (engine_observe: identities only)
    escaped: list = field(default_factory=list)  # the engines' users' GPU holders outside every engine unit (engine_observe)

    @classmethod
    def from_vars(cls, values: dict) -> Found:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidInput(f"switch plan node: unknown {', '.join(unknown)}")
        return cls(**values)


def opening(settings: Settings) -> dict:
    """The switch's opening - what it needs before the engines' read, which takes the lease: the rotation's hooks
    complete (or why not: rotation_error, '' when they are), and the lease as first taken, covering the phases before
    the cutover with the prewarm's bound."""
    complete = (settings.rotation == "none" or (settings.rotation == "haproxy" and settings.haproxy_backend)
                or (settings.rotation == "custom" and settings.leave_tasks and settings.join_tasks))
    error = "" if complete else (f"switch_engine_rotation is {settings.rotation}: none, haproxy (with switch_engine_haproxy_backend) or custom"
                                 " (with switch_engine_rotation_leave_tasks and switch_engine_rotation_join_tasks, task files run for the node)")
    return {"rotation_error": error, "first_lease_seconds": settings.lease_seconds + (settings.prewarm_timeout if settings.prewarm else 0.0)}


def cutover_bound(target_ready_timeout: float, previous_ready_timeout: float | None, settings: Settings, stop_bound: float) -> float:
    """Seconds the cutover's engines may take: the drain, two teardowns (the switch's and a rollback's), the target's
    start and the previous engine's start again, and the answer checks of both."""
    # one unit serves and takes its stop bound; the others are stopped already
    teardown = longest_run(1, stop_bound, settings.kill_timeout, settings.term_timeout, settings.memory_timeout)
    # the target's answers and, after a rollback, the previous engine's: as long as the cutover's check may wait
    checks = 2 * answers.CheckSettings(probe_timeout=settings.answer_timeout).longest_run if settings.answer_check else 0.0
    return round(settings.drain_timeout + 2 * teardown + float(target_ready_timeout) + float(previous_ready_timeout or 0.0) + checks, 1)


def user_ready(facts: dict, observed: dict, device: str = "/dev/nvidiactl") -> bool:
    """Is the engine's own user already as engine_common's user entry point would make it? (Then the switch skips that
    step.) Root, or a system user whose home is the state directory, with no login shell, in the devices' group where
    the device files are not readable and writable by others."""
    if not facts.get("dedicated_user"):
        return True
    account = (observed.get("users") or {}).get(facts.get("user")) or {}
    if not account.get("exists") or account.get("home") != facts.get("state_directory") or account.get("shell") != "/usr/sbin/nologin":
        return False
    found = (observed.get("devices") or {}).get(device) or {}
    if not found.get("exists") or int(found.get("mode") or "0", 8) % 8 >= 6:
        return True
    return found.get("group") in (account.get("groups") or [])


def previous_engine(found: list[str], target: str) -> str:
    """The engine to drain and to roll back to: one running other than the target, else the target itself running (a
    switch in place), else "none"."""
    return next((name for name in found if name != target), found[0] if found else "none")


def plan(settings: Settings, node: Found) -> dict:
    """Where each phase of this node's switch runs, whether it is unchanged, and what the steps take."""
    target = node.engines.get(settings.target) or {}
    previous = node.engines.get(node.previous) or {} if node.previous != "none" else {}
    installs = bool(target.get("install"))
    in_place = node.previous == settings.target
    would_change = {"unit": bool(node.files.get("unit")), "secrets": bool(node.files.get("secrets")),
                    "install": installs and not matches_pin(node.target_installed, target.get("version"))}
    staged = node.staged and node.found == [settings.target]
    unchanged = (node.found == [settings.target] and not any(would_change.values()) and settings.target in node.serving and not staged)

    if settings.rotation not in ("none", "haproxy", "custom"):
        raise InvalidInput(opening(settings)["rotation_error"])
    no_balancer = settings.rotation == "none"
    # with no balancer between them, the cutover takes over the steps around its drain (module runs fewer); not where
    # the preflight has work of its own first (a pinned install, the target's user to create), nor when only planning,
    stages_model = bool(target.get("model_dir") or target.get("draft_model_dir") or target.get("tokenizer_dir"))
    # ... nor before a download: what the preflight refuses (the engine cannot load the model, a foreign holder) is
    # known before hours of fetching, not after
    cutover_prepares = (no_balancer and not settings.check_mode and not installs and not stages_model
                        and not (target.get("dedicated_user") and not node.user_ready))
    prunes = installs and target.get("virtualenvs_root") is not None
    soak_here = no_balancer and settings.min_spec_acceptance is None
    where = {
        "preflight": CUTOVER if cutover_prepares else CONTROLLER,
        "backup": CONTROLLER if in_place and not settings.check_mode else SKIP,
        "stage_model": CONTROLLER if stages_model else SKIP,
        "stage_files": CUTOVER if cutover_prepares else SKIP if settings.check_mode else CONTROLLER,
        "prewarm": (SKIP if not settings.prewarm else CUTOVER if no_balancer and not settings.check_mode else CONTROLLER),
        "leave_rotation": SKIP if no_balancer else CONTROLLER,
        "verify": SKIP if settings.min_spec_acceptance is None else CONTROLLER,
        "join_rotation": SKIP if no_balancer else CONTROLLER,
        "soak": CUTOVER if soak_here else CONTROLLER,
        "prune": CONTROLLER if prunes else SKIP,
        # a system user is no disruption: created in the preflight, so that the model is checked as the engine reads it
        "user": CONTROLLER if target.get("dedicated_user") and not settings.check_mode and not node.user_ready else SKIP,
        # with nothing left on the node after the cutover, it gives the lease back itself
        "release": CUTOVER if soak_here and not prunes else CONTROLLER,
    }
    stop_bound = settings.stop_timeout or float(previous.get("timeout_stop_sec") or DEFAULT_STOP_BOUND)
    bound = cutover_bound(target.get("ready_timeout") or 0.0, previous.get("ready_timeout") if previous else None, settings, stop_bound)
    cutover_lease = (settings.lease_seconds + bound + settings.soak_seconds + (settings.prewarm_timeout if where["prewarm"] == CUTOVER else 0.0)
                     + (PREFLIGHT_BOUND if where["preflight"] == CUTOVER else 0.0))
    parking = park_plan(settings, node, would_change)
    checks = ["model", "gpus", "port", "holders"] if settings.check_mode and installs else ["executable", "model", "gpus", "port", "holders"]
    if parking["wake"]:
        # the parked target holds its port and its GPUs already: what is checked is that it is still whole
        checks = [check for check in checks if check not in ("gpus", "port")]
    return {
        "park": parking,
        "replace": replacement(settings, node),
        "answer_check": answer_plan(settings, node, would_change),
        "unchanged": unchanged,
        # the way back leaves another user's job that came during the cutover: refusing it there leaves no engine at all
        "rollback_outside_units": "report" if settings.outside_units == "fail" else settings.outside_units,
        "sweep": sweep_plan(settings, node) if unchanged else None,
        # a parked engine that died or was restarted is no way back: an unchanged node forgets it (its record, its hold)
        "forget_parked": forget_parked(node) if unchanged else None,
        # ... removed for real (not in check mode): nothing is parked on the node afterwards
        "parked_forgotten": bool(unchanged and forget_parked(node) and not settings.check_mode),
        # an unchanged node is put back in the balancer's rotation (an interrupted run may have left it out)
        "rejoin_rotation": unchanged and not no_balancer and not settings.check_mode,
        "would_change": would_change,
        "staged": staged,
        "in_place": in_place,
        "where": where,
        # the role's prepare step runs where any of its phases runs on the controller (an unchanged node has none)
        "prepare": not unchanged and any(where[name] == CONTROLLER for name in ("preflight", "backup", "stage_model", "stage_files", "prewarm")),
        # the role's task file for what follows: nothing to switch, the plan (check mode), or the switch
        "path": "unchanged" if unchanged else "plan" if settings.check_mode else "switch",
        "stage": where["stage_model"] == CONTROLLER or where["stage_files"] == CONTROLLER,
        "stop_bound": stop_bound,
        "cutover_bound": bound,
        "cutover_lease_seconds": round(cutover_lease, 1),
        # in check mode a pinned install that would happen has not: its executable cannot run yet
        "preflight_checks": checks,
        "stage_items": stage_items(target),
        # the mark written with the target's files where they replace the running engine's (removed when the switch ends)
        "staged_mark_files": ([{"name": "staged", "path": staged_mark(settings.backup_dir), "content": f"{settings.run_id}\n", "mode": "0600"}]
                              if in_place else []),
    }


def sweep_plan(settings: Settings, node: Found) -> dict | None:
    """The target serves as asked, yet the engines' own processes hold GPUs outside their units (a worker that escaped
    an engine's teardown, an interrupted run's leftover): torn down as a switch's teardown would, the target's unit
    and a parked engine kept. None when there are none. Another user's job is left alone (reported): nothing is to
    start in its place."""
    if not node.escaped:
        return None
    target_unit = (node.engines.get(settings.target) or {}).get("unit")
    others = [facts["unit"] for name, facts in node.engines.items() if name != settings.target and facts.get("unit")]
    return {"pids": sorted(holder["pid"] for holder in node.escaped), "units": others, "kept_units": [target_unit] if target_unit else []}


def forget_parked(node: Found) -> dict | None:
    """The node's parked record when it no longer stands for a parked engine (it died, was restarted, or its unit
    changed): {engine, unit, reason, paths: its record and its start hold}; None when none is recorded or it is still
    parked."""
    parked = node.parked or {}
    if not parked or parked.get("alive"):
        return None
    return {"engine": parked.get("engine"), "unit": parked.get("unit"), "reason": parked.get("reason"),
            "paths": [paths.PARKED_RECORD, f"{paths.PARK_HOLD_DIR}/{parked.get('unit')}"]}


def park_plan(settings: Settings, node: Found, would_change: dict) -> dict:
    """What becomes of the previous engine and of a parked one: the previous engine parked or stopped (and why), the
    parked engine woken (the target is it, unchanged) or evicted (torn down as any engine), the path the target comes
    up by (wake or cold), and a refusal before anything is drained (required, and the previous engine cannot park)."""
    park.check_mode(settings.park_previous)
    parked = node.parked or {}
    live = parked if parked.get("alive") else None
    wake = bool(live and live.get("engine") == settings.target and not any(would_change.values()))
    # evict: a live parked engine torn down as any engine; forget_record: the node's record of a parked engine goes
    # with the cutover (evicted, or it died) - the cutover's own evict
    decision = {"mode": settings.park_previous, "previous": "stop", "reason": None, "wake": wake, "evict": bool(live and not wake),
                "forget_record": bool(parked and not wake),
                "parked_unit": live.get("unit") if live else None, "path": "wake" if wake else "cold", "cold_reason": None, "refused": None}
    if live and not wake and live.get("engine") == settings.target:
        decision["cold_reason"] = f"the parked {live['engine']} is not what was asked (its unit, secrets or version change): evicted"
    elif parked and not live:
        decision["cold_reason"] = parked.get("reason")
    previous = node.previous
    if settings.park_previous == "off" or previous in ("none", settings.target) or wake:
        return decision
    target = node.engines.get(settings.target) or {}
    previous_facts = node.engines.get(previous) or {}
    reason = (park.why_not_parkable(previous, node.previous_argv, node.previous_version)
              or park.host_room((node.host or {}).get("available_bytes"), (node.sizes or {}).get(previous_facts.get("model_path") or ""),
                                settings.park_margin_mib)
              # per GPU, by what its last park here left (measured); the cutover checks again with what this one leaves
              or park.room_by_history(node.park_history or {}, previous, target.get("memory_fraction"), settings.target))
    if reason is None and target.get("visible_devices") != previous_facts.get("visible_devices"):
        reason = "the target and the previous engine are pinned to different GPUs (CUDA_VISIBLE_DEVICES): nothing to give back"
    if reason:
        decision["reason"] = reason
        if settings.park_previous == "required":
            decision["refused"] = f"switch_engine_park_previous is required and {previous} cannot be parked: {reason}"
        return decision
    decision["previous"] = "park"
    return decision


def replacement(settings: Settings, node: Found) -> dict:
    """Whether the target's model may take the place of the previous engine's, where the disk holds one: the
    directory it would replace and the previous model's staging for a rollback - or why not. Decided with the opt-in
    or without (the stage's refusal then names the way through); only a model the switch staged from the hub can be
    staged again, so only such a one is ever removed."""
    decision = {"asked": settings.replace_model, "path": None, "restage": None, "reason": None}
    previous = node.engines.get(node.previous) or {}
    if node.previous == "none":
        decision["reason"] = "no engine serves: there is no model to replace"
    elif node.previous == settings.target:
        decision["reason"] = "an in-place change of the engine serving: its model is not replaced"
    elif not previous.get("model_dir"):
        decision["reason"] = (f"{node.previous}'s model {previous.get('model')} is not staged from the hub: it could not be staged "
                              "again for a rollback, so it is never removed")
    elif settings.park_previous == "required":
        decision["reason"] = "switch_engine_park_previous is required: a parked engine keeps its model"
    else:
        decision.update(path=previous["model_dir"], restage=stage_items(previous)[0])
    return decision


def answer_plan(settings: Settings, node: Found, would_change: dict) -> dict:
    """Which answer check the target will get before rotation: compared with its golden record (the one of its engine,
    model, version and command), or a sanity check (and why there is no record to compare with)."""
    probes = len(answers.PROBES) + settings.answer_expectations
    if not settings.answer_check:
        return {"kind": None, "probes": 0, "reason": "switch_engine_answer_check is off", "recorded_at": None}
    target = node.engines.get(settings.target) or {}
    if settings.answer_refresh:
        return {"kind": "sanity", "probes": probes, "reason": "switch_engine_answer_refresh: a new record is taken", "recorded_at": None}
    if would_change.get("unit") or would_change.get("install") or not node.target_argv:
        return {"kind": "sanity", "probes": probes, "recorded_at": None,
                "reason": "its command line or version changes: no record is this configuration's yet"}
    # the identity the cutover's check takes: the version it reports, the command the unit runs (a parked target's too)
    version = reported_version(node.target_installed, target.get("version"))
    ident = answers.identity(settings.target, target.get("served_model_name") or "", version, node.target_argv)
    record = answers.record_for(ident, node.answer_records)
    if record is None:
        return {"kind": "sanity", "probes": probes, "reason": "no record of this engine, model, version and command on the node",
                "recorded_at": None}
    return {"kind": "golden", "probes": len(answers.PROBES), "reason": None, "recorded_at": record.get("created")}


def stage_request(item: dict, common: dict, replaceable: str | None = None) -> dict:
    """model_stage's options for a staging the cutover runs itself: the item (stage_items), the role's common options,
    and the model it replaces, removed first."""
    request = {key: value for key, value in item.items() if key != "label"}
    request.update(common)
    if replaceable:
        request.update(replaceable=replaceable, replace="now")
    return request


def staged_mark(backup_dir: str) -> str:
    return f"{backup_dir.rstrip('/')}/staged"


def stage_items(target: dict) -> list[dict]:
    """The hub models the switch stages: the model and the EAGLE-3 draft model, each into its own directory."""
    items = []
    if target.get("model_dir"):
        repository, quant = staging.hub_quant(target["model"])
        # one quant of a repository of many: only its files, merged into the one file the engine loads
        items.append({"label": target["model"], "source": repository, "revision": target.get("model_revision") or "main",
                      "dest": target["model_dir"], "quant": quant, "merge_gguf": bool(quant)})
    if target.get("tokenizer_dir"):
        # the base model's tokenizer and config, never its weights
        items.append({"label": target["tokenizer"], "source": target["tokenizer"], "revision": "main", "dest": target["tokenizer_dir"],
                      "files": staging.TOKENIZER_FILES, "files_optional": True})
    if target.get("draft_model_dir"):
        items.append({"label": target["draft_model"], "source": target["draft_model"], "revision": "main", "dest": target["draft_model_dir"]})
    return items


def finish_steps(steps: dict, result: str | None, cutover_node: dict | None) -> dict:
    """What is left after the cutover: a rollback to finish, a balancer to join and the soak, virtualenvs to prune, a
    boot state the cutover could not set, or a staged mark it did not remove."""
    cutover_node = cutover_node or {}
    where = steps["where"]
    rolled_back_in_cutover = cutover_node.get("cutover_result") == "rolled_back"
    clear_mark = (result in ENDED_WITH_AN_ENGINE and steps["in_place"] and cutover_node.get("cutover_result") not in ENDED_WITH_AN_ENGINE)
    finishes = (rolled_back_in_cutover
                or (result == "switched" and (where["soak"] == CONTROLLER or where["prune"] == CONTROLLER or bool(cutover_node.get("boot_error"))))
                or clear_mark)
    return {"finish": finishes, "clear_mark": clear_mark, "restore": rolled_back_in_cutover}
