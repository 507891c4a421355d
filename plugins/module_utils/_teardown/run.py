# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A cleanup's run on the node (node_teardown, the gpu_teardown role's one task): the node's lease, the GPU memory
before, the decision (every holder found and classified; a refusal stops here, before any unit is stopped), the units
stopped hard, the holders killed, the memory asserted, the lease given back - one round trip per node. The steps are
_teardown.steps', the switch's cutover runs the same ones."""

from __future__ import annotations

import contextlib
import time

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, LockTimeout, RequesterGone
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease, metrics, parked
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import units as systemd_units
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import TeardownFailed, longest_run, teardown

# the steps a cleanup may be given (its option ``steps``): the memory step is the report's "after"
STEPS = ("units", "holders", "memory")
# what the report's failed_step says for each step: the names the role's tasks had before the teardown became one
# module run, kept as they are - tooling matches on them (the report is a contract)
FAILED_STEP_NAMES = {"lease": "Lease | Take the node's lease, or wait for the run that holds it",
                     "before": "Measure | GPU memory before the teardown",
                     "decide": "Decide | Find and classify every GPU holder; refuse before any unit is stopped",
                     "units": "Stop units | Stop each engine unit and empty its control group",
                     "holders": "Kill holders | Kill every unprotected process still holding the GPUs",
                     "after": "Assert memory | Every selected GPU is free of what the engines held"}


def lease_seconds(params: dict) -> float:
    """Long enough for every bound of the teardown, with a margin; an owner that dies loses it after this."""
    return longest_run(len(params["units"]), params["stop_timeout"], params["kill_timeout"], params["term_timeout"], params["memory_timeout"],
                       params["holders_kill_timeout"]) + 120


def run(params: dict, node, check_mode: bool, still_wanted=lambda: True, store: lease.LeaseStore | None = None) -> dict:
    """The teardown's result: ``steps`` as gpufleet.serving.teardown_host_report reads them, ``result`` done, failed or
    lease_held (another run holds the node's lease: nothing was touched), and ``msg`` when not done."""
    unknown = sorted(set(params["steps"]) - set(STEPS))
    if unknown:
        raise Error(f"steps: unknown {', '.join(unknown)} (known: {', '.join(STEPS)})")
    units = [systemd_units.normalize_unit_name(unit) for unit in params["units"]]
    if check_mode:
        steps = plan(params, units, node)
        refused = steps.get("failure")
        return {"changed": False, "result": "failed" if refused else "done", "msg": refused["msg"] if refused else None, "steps": steps}
    owner = params["run_id"]
    name = params.get("lease_name") or paths.LEASE_NAME
    if store is None and params["lease"]:
        # the name checked as host_lease checks it
        checked = lease.LeaseRequest.from_params(dict(name=name, owner=owner, state="acquired", lease_seconds=1, wait_timeout=0, break_owner=None))
        store = lease.LeaseStore(checked.name)
    taken = None
    if store:
        try:
            taken = lease.take(lease.LeaseRequest(name, owner, "acquired", lease_seconds(params), params["lease_wait"],
                                                  params["break_owner"] or None), store, False, still_wanted)
        except (LockTimeout, RequesterGone) as exc:
            failure = dict(exc.context, failed=True, msg=exc.msg)
            return {"changed": False, "result": "lease_held", "msg": exc.msg, "holder": exc.context.get("holder"),
                    "steps": {"check_mode": False, "run_id": owner, "lease": failure, "failed_step": FAILED_STEP_NAMES["lease"], "failure": failure}}
    kept = kept_units(params, node)
    fate = parked_fate(params, units, kept, node, False)
    try:
        only = ("before",) * params["measure_before"] + tuple(
            step for name, step in (("units", "units"), ("holders", "holders"), ("memory", "after"))
            if name in params["steps"] and (name != "units" or units))
        steps = teardown(units, node, params["stop_timeout"], decide=True, only=only, kept=kept)
        result = {"result": "done", "msg": None}
        forget_evicted(params, units, kept)
    except TeardownFailed as exc:
        steps = exc.context["steps"]
        result = {"result": "failed", "msg": exc.msg}
    finally:
        if taken is not None:
            store.release(owner)
    steps.update(run_id=owner, lease=taken or {}, parked=fate)
    if steps.get("failed_step"):
        steps["failed_step"] = FAILED_STEP_NAMES.get(steps["failed_step"], steps["failed_step"])
    changed = any(unit.get("changed") for unit in (steps.get("units") or {}).get("results") or []) or bool(
        (steps.get("holders") or {}).get("changed"))
    outcome = dict(result, changed=changed, steps=steps)
    outcome["metrics_warnings"] = steps["metrics_warnings"] = publish_metrics(params, outcome, kept, store)
    return outcome


def publish_metrics(params: dict, outcome: dict, kept: tuple[str, ...], store) -> list[str]:
    """The node's metrics after this teardown (never in check mode; never a failure: warnings). The engines it stopped
    serve no more; one it kept stays parked."""
    if params.get("metrics_dir") is None:
        return []
    state = metrics.load_state(params.get("metrics_state_path") or metrics.STATE_PATH)
    engines = None
    if outcome["result"] == "done" and "units" in params["steps"]:
        parked = (state.get("parked") or {}).get("engine")
        engines = [dict(engine, state="parked" if engine.get("engine") == parked and kept else "none") for engine in state.get("engines") or []]
        if not kept:
            state["parked"] = None
    metrics.record_teardown(state, outcome, time.time(), engines)
    state["lease"] = metrics.lease_state(store.held()) if store else state.get("lease")
    return metrics.publish(state, params["metrics_dir"], params.get("metrics_state_path") or metrics.STATE_PATH)


def forget_evicted(params: dict, units: list[str], kept: tuple[str, ...]) -> None:
    """A parked engine this teardown stopped is parked no more: its record goes (a switch would read it as died)."""
    path = params.get("parked_path") or parked.RECORD_PATH
    record = parked.read_record(path)
    if record and record["unit"] in units and record["unit"] not in kept and "units" in params["steps"]:
        with contextlib.suppress(OSError):  # the next run reads the unit as stopped all the same
            parked.remove_record(path)
        with contextlib.suppress(OSError):  # an operator's own start of it later must not be skipped
            parked.release(path, [record["unit"]])


def parked_fate(params: dict, units: list[str], kept: tuple[str, ...], node, check_mode: bool) -> dict | None:
    """What this teardown does to the node's parked engine - the node's fast way back - when its unit is among those it
    tears down: kept (keep_parked), evicted, or found dead or restarted (nothing parked is lost). None: none is parked."""
    record = parked.read_record(params.get("parked_path") or parked.RECORD_PATH)
    if not record or record["unit"] not in units or "units" not in params["steps"]:
        return None
    alive, reason = parked.alive(record, node.unit_properties(record["unit"]))
    fate = "kept" if record["unit"] in kept else "evicted" if alive else "not parked"
    return {"engine": record["engine"], "unit": record["unit"], "fate": fate, "reason": reason, "check_mode": check_mode}


def kept_units(params: dict, node) -> tuple[str, ...]:
    """The units kept running, their processes unsignalled: those given, and with keep_parked the node's parked engine
    (when it is still the invocation that parked)."""
    kept = [systemd_units.normalize_unit_name(unit) for unit in params.get("kept_units") or []]
    if params.get("keep_parked"):
        record = parked.read_record(params.get("parked_path") or parked.RECORD_PATH)
        if record and parked.alive(record, node.unit_properties(record["unit"]))[0]:
            kept.append(record["unit"])
    return tuple(dict.fromkeys(kept))


def plan(params: dict, units: list[str], node) -> dict:
    """Check mode: the memory now, the units that would be stopped and the holders that would be signalled (or refused)."""
    steps: dict = {"check_mode": True, "run_id": params["run_id"], "lease": {}}
    steps["before"] = node.memory(wait=False)
    kept = kept_units(params, node)
    stopped = [unit for unit in units if unit not in kept]
    if "units" in params["steps"] and stopped:
        steps["units"] = node.stop_units(stopped, params["stop_timeout"], check_mode=True)
    if "holders" in params["steps"]:
        try:
            steps["holders"] = node.decide(stopped, kept) if kept else node.decide(stopped)
        except Error as exc:  # the plan names the refusal; the run would fail there
            steps["holders"] = dict(exc.context, failed=True, msg=exc.msg)
            steps.update(failed_step=FAILED_STEP_NAMES["decide"], failure=dict(exc.context, failed=True, msg=exc.msg))
    steps["after"] = steps["before"]
    steps["parked"] = parked_fate(params, units, kept, node, True)
    return steps
