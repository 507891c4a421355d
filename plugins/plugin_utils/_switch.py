# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The switch_engine role's glue around engine_cutover: what it is given, and what the role records of its result."""

from __future__ import annotations

import posixpath

from ansible_collections.gpufleet.serving.plugins.module_utils import _phases as phases
from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._models.staging import hub_quant, parse_source, progress_path
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch_plan as switch_plan
from ansible_collections.gpufleet.serving.plugins.plugin_utils._reports import teardown_host_report

# where systemd reads the units the engine roles write
UNIT_DIR = "/etc/systemd/system"
# preflight_failed and failed: the cutover's preflight or its files stopped it before the drain (nothing was stopped)
CUTOVER_RESULTS = results.CUTOVER


class SwitchError(ValueError):
    pass


def cutover_engine(facts: dict) -> dict:
    """An engine's facts (gpufleet.serving.engine_facts) as engine_cutover's target or previous."""
    missing = [key for key in ("engine", "unit", "url", "served_model_name", "ready_timeout") if facts.get(key) in (None, "")]
    if missing:
        raise SwitchError(f"engine facts lack {', '.join(missing)}")
    return {"engine": facts["engine"], "unit": facts["unit"], "url": facts["url"], "model": facts["served_model_name"],
            "api_key": facts.get("api_key") or None, "ready_timeout": float(facts["ready_timeout"])}


def cutover_inputs(steps: dict, offered: dict) -> dict:
    """engine_cutover's options that follow the planner's answers (``steps``) and the stage's (``offered['replacing']``:
    the target's model comes in place of the previous one's, after the stop - nothing of it to prewarm, no engine left
    to park): what runs inside the cutover (the preflight, the target's files, the prewarm, the soak, the answer
    check), what an in-place switch restores and clears, and the lease's bound (a replacement's two downloads in it).
    ``offered``: the role's value of each, whether or not it applies; ``previous``: its facts, none without one;
    ``backup_dir``: where the backup kept the previous engine's unit and secrets (an in-place switch restores them)."""
    where = steps["where"]
    replacing = bool(offered.get("replacing"))
    in_place = bool(steps["in_place"])
    inside = phases.IN_CUTOVER
    previous = offered.get("previous") or {}
    restore = []
    if in_place:
        backup = offered["backup_dir"].rstrip("/")
        restore = [{"src": f"{backup}/{previous['unit']}", "dest": f"{UNIT_DIR}/{previous['unit']}"},
                   {"src": f"{backup}/{posixpath.basename(previous['secrets_path'])}", "dest": previous["secrets_path"]}]
    return {
        "previous": cutover_engine(previous) if previous else None,
        "restore": restore,
        "clear_paths": list(offered["clear_paths"]) if in_place else [],
        "preflight": offered["preflight"] if where["preflight"] == inside else None,
        "files": list(offered["files"]) if where["stage_files"] == inside else [],
        "prewarm_paths": [path for path in offered["prewarm_paths"] if path] if where["prewarm"] == inside and not replacing else [],
        "soak": float(offered["soak"]) if where["soak"] == inside else 0.0,
        "answer_check": offered["answer_check"] if (steps.get("answer_check") or {}).get("kind") else None,
        "park_previous": steps["park"]["previous"] == "park" and not replacing,
        "lease_seconds": float(steps["cutover_lease_seconds"]) + (2 * float(offered["stage_timeout"]) if replacing else 0.0),
    }


# what the switch reads of a cutover's result after it (its report, its finish): the record's `node`
NODE_KEYS = ("serving_since", "cutover_result", "boot_error", "lease_released", "park", "wake", "parked", "metrics_warnings", "replace",
             "restage", "answer_check", "rollback_answer_check")
# of those, what the rollback alone (engine_cutover's rollback_reason) changes over the cutover's before it
ROLLBACK_NODE_KEYS = ("serving_since", "boot_error", "lease_released", "parked", "metrics_warnings", "restage", "rollback_answer_check")


def cutover_record(result: dict, engine_of: dict | None = None, enabled: list | None = None) -> dict:
    """What the switch keeps of engine_cutover's result: the node's phase marks (its `end` dropped: the controller's next
    mark ends the last phase), the teardowns as gpu_teardown records, the outcome, and the engine's own start time;
    ``node``, what the switch reads of it afterwards; ``enabled``, the engines enabled at boot once it ended (``enabled``,
    as they were, where it did not set the boot state; ``engine_of``: unit -> engine name)."""
    record = _cutover_record(result)
    record["node"] = {key: record[key] for key in NODE_KEYS if key in record}
    boot = record["boot"]
    at_boot = (engine_of or {}).get(boot["at_boot"]) if boot else None
    record["enabled"] = list(enabled or []) if boot is None else [at_boot] if at_boot else []
    return record


def rollback_record(result: dict, engine_of: dict, enabled: list, before: dict | None) -> dict:
    """What the switch keeps of engine_cutover's rollback alone (the controller's rollback): as cutover_record, with
    ``node`` the cutover's before it (``before``: its record's ``node``, none where its run failed as a task) updated
    with what the rollback changed - the cutover's own result stays what it was."""
    record = cutover_record(result, engine_of, enabled)
    record["node"] = dict(before or {}, **{key: record["node"][key] for key in ROLLBACK_NODE_KEYS if key in record["node"]})
    return record


def lost_during(result: dict, phase: str, owner: str | None = None) -> dict | None:
    """A task of the switch on the node lost it - unreachable, or another run holds the lease: engine_cutover's
    lease_lost (nothing was touched), or a renewal by host_lease whose holder is not ``owner``. The switch's outcome
    for it ({result, reason}); None where it was not lost (a skipped task lost nothing)."""
    if result.get("unreachable"):
        return {"result": results.UNREACHABLE, "reason": f"became unreachable during {phase}: {result.get('msg') or ''}"}
    if result.get("skipped"):
        return None
    if result.get("result") == "lease_lost":
        return {"result": results.FAILED, "reason": f"lost the switch lease during {phase} ({result.get('reason')})"}
    if owner is not None and ((result.get("holder") or {}).get("owner") or "") != owner:
        return {"result": results.FAILED, "reason": f"lost the switch lease during {phase} ({result.get('msg') or ''})"}
    return None


def _cutover_record(result: dict) -> dict:
    outcome = result.get("result")
    if outcome not in CUTOVER_RESULTS:
        raise SwitchError(f"engine_cutover result {outcome!r} is not one of {', '.join(CUTOVER_RESULTS)}")
    marks = [list(mark) for mark in result.get("marks") or []]
    ended = None
    if marks and marks[-1][0] == "end":
        ended = float(marks[-1][1])
        marks = marks[:-1]
    # a target that soaked in the cutover served from the soak's start (its first good readiness answer)
    soaked = next((float(start) for phase, start in marks if phase == "soak"), None)
    record = {"result": outcome}
    if outcome != "switched":
        record["reason"] = result.get("reason")
    if outcome == "rollback_failed":
        record["rollback_error"] = result.get("rollback_error")
    # the engine left parked, where the cutover wrote or removed its record (absent: the record it read stands)
    parked = {"parked": result["parked"]} if "parked" in result else {}
    return {
        **parked,
        "marks": marks,
        "outcome": record,
        "teardown": teardown_host_report(result["teardown"]) if result.get("teardown") else None,
        "rollback_teardown": teardown_host_report(result["rollback_teardown"]) if result.get("rollback_teardown") else None,
        "engine_start_s": result.get("engine_start_s"),
        # when an engine served again, on the node's clock (the target, or the previous one after the rollback)
        "serving_since": (soaked or ended) if outcome == "switched" else ended if outcome == "rolled_back" else None,
        "cutover_result": outcome,
        "park": result.get("park"),
        # the target's model staged in place of the previous engine's, and the rollback's staging of that one again
        "replace": result.get("replace"),
        "restage": result.get("restage"),
        # the answers before rotation: the target's (after a cold restart, with the woken engine's first), the rollback's
        "answer_check": result.get("answer_check"),
        "rollback_answer_check": result.get("rollback_answer_check"),
        "wake": result.get("wake"),
        "metrics_warnings": result.get("metrics_warnings") or [],
        "boot": result.get("boot"),
        "boot_error": result.get("boot_error"),
        "lease_released": bool(result.get("lease_released")),
        "prewarm": result.get("prewarm"),
        "preflight": result.get("preflight"),
    }


def observe_requests(engines: dict, names: list, target: str) -> list:
    """engine_observe's engines from each engine's facts: the target's configured executable is read whether it runs
    or not, and its readiness answer includes a one-token completion (the one "unchanged" is decided on)."""
    requests = []
    for name in names:
        facts = engines[name]
        configured = bool(facts.get("configured"))
        requests.append({"engine": facts["engine"], "unit": facts["unit"], "url": facts.get("url") or None,
                         "model": facts.get("served_model_name") or None, "api_key": facts.get("api_key") or None,
                         "executable": (facts.get("executable") or None) if name == target and configured else None,
                         "completion": name == target})
    return requests


def observed(result: dict, names: list, target: str | None = None) -> dict:
    """What the switch keeps of engine_observe's answer, by engine name in the order of ``names``: found (running),
    enabled, installed, serving; commands (the argv of each running or parked engine) and versions (by executable); with the
    ``target``, the previous engine (the planner's previous_engine)."""
    engines = result.get("engines") or {}
    missing = [name for name in names if name not in engines]
    if missing:
        raise SwitchError(f"engine_observe did not answer for {', '.join(missing)}")

    # a parked engine runs but serves no one: it is neither found (drained, stopped) nor the previous engine
    parked = result.get("parked") or {}
    parked_engine = parked.get("engine") if parked.get("alive") else None

    def having(key: str) -> list:
        # a parked engine's unit is installed and enabled as any other; it is not found running nor serving
        return [name for name in names if engines[name].get(key) and (name != parked_engine or key in ("installed", "enabled"))]
    return {"found": having("running"), "previous": switch_plan.previous_engine(having("running"), target) if target else None,
            "parked": parked or None, "enabled": having("enabled"), "installed": having("installed"), "serving": having("serving"),
            # a parked engine's too: woken, it is the target whose command its answer check is keyed by
            "commands": {name: list(engines[name].get("argv") or []) for name in having("running") + ([parked_engine] if parked_engine else [])},
            "versions": {name: dict(engines[name].get("versions") or {}) for name in names},
            "paths": dict(result.get("paths") or {})}


def switch_steps(settings: dict, found: dict) -> dict:
    """The planner's decisions for this node (plugin_utils/_switch_plan.py: plan), from the role's settings and what the
    engines' read found; ``found['observed']`` is engine_observe's answer, for whether the target's user is ready."""
    found = dict(found)
    observed = found.pop("observed", None) or {}
    engines = found.get("engines") or {}
    found["user_ready"] = switch_plan.user_ready(engines.get(settings.get("target")) or {}, observed)
    found.setdefault("escaped", list(observed.get("escaped") or []))
    return _planned(lambda: switch_plan.plan(switch_plan.Settings.from_vars(settings), switch_plan.Found.from_vars(found)))


def switch_opening(settings: dict) -> dict:
    return _planned(lambda: switch_plan.opening(switch_plan.Settings.from_vars(settings)))


def switch_finish(steps: dict, result: str | None, cutover_node: dict | None) -> dict:
    return _planned(lambda: switch_plan.finish_steps(steps, result, cutover_node))


def _planned(decide):
    try:
        return decide()
    except (InvalidInput, TypeError) as error:
        raise SwitchError(str(getattr(error, "msg", error))) from None


def stage_request(item: dict, common: dict, replaceable: str | None = None) -> dict:
    return switch_plan.stage_request(item, common, replaceable)


stage_request.__doc__ = switch_plan.stage_request.__doc__


def stage_jobs(started: list) -> list[dict]:
    """The background downloads started by a looped model_stage task (its registered results), as job_wait takes them:
    job id, the source for the lines, the progress file the module writes beside its destination."""
    return [{"jid": job["ansible_job_id"], "label": job["item"]["source"], "progress": progress_path(job["item"]["dest"])}
            for job in started if job.get("ansible_job_id")]


def staged_model_dir(model: str, revision: str, root: str, kind: str = "model") -> str:
    """Where the switch stages a hub model (org/name) under ``root``: ``org--name``, ``--QUANT`` for one quant of it
    (org/name:QUANT), ``@revision`` added when it is not main; empty for a model given as a path (verified where it is)
    or without a root (not staged)."""
    if not root or not model or model.startswith("/"):
        return ""
    if not root.startswith("/"):
        raise SwitchError(f"switch_engine_models_root: give an absolute directory, got {root!r}")
    repository, quant = hub_quant(model)  # one quant of a repository of many: a directory of its own
    try:
        if parse_source(repository) != "hub":
            return ""
    except InvalidInput as error:
        raise SwitchError(str(error)) from None
    revision = revision or "main"
    if "/" in revision or revision.startswith(".") or not revision.strip():
        raise SwitchError(f"model revision {revision!r}: give a branch, tag or commit without '/'")
    # a tokenizer is staged apart from its repository's weights (the same repository may be staged whole as a model)
    return (f"{root.rstrip('/')}/{repository.replace('/', '--')}" + (f"--{quant}" if quant else "") + ("--tokenizer" if kind == "tokenizer" else "")
            + ("" if revision == "main" else f"@{revision}"))
