"""The fault campaign's checker: the collection's promises, each judged from the nodes' real state (node_state.py),
never from the collection's own report - the report is one of the things checked.

Each check returns the violations it finds, one line each, naming the node and what was seen.
"""

from __future__ import annotations

SWITCHES = ("switch", "switch_park", "overlap")


def serving(state: dict) -> list[str]:
    """The engines that answer a completion."""
    return sorted(engine for engine, answer in state.get("answers", {}).items() if answer.get("completion") in (200, 401))


def parked(state: dict) -> list[str]:
    """The engines whose process lives in an active unit, parked: asleep by their standby, or held by the park's file."""
    held = {name.removesuffix(".service") for name in state.get("holds", [])}
    return sorted(engine for engine, answer in state.get("answers", {}).items()
                  if answer.get("completion") not in (200, 401) and (answer.get("sleeping") or engine in held))


def restarted(before: dict, after: dict) -> bool:
    """The node restarted between the two reads: another kernel boot, or (a lab node is a container, which keeps the
    host's boot id) its PID 1 started again."""
    return after["boot_id"] != before["boot_id"] or after.get("init_start") != before.get("init_start")


def enabled_at_boot(state: dict) -> list[str]:
    """The engines whose unit starts at boot."""
    return sorted(engine for engine, unit in state["units"].items() if unit.get("enabled") == "enabled")


def one_engine(node: str, state: dict, allowed: tuple[str, ...], none_before: bool = False) -> list[str]:
    """Exactly one engine serves, and it is one of ``allowed``; a second one may only be parked. A node that served
    nothing before the run may still serve nothing after its fault (the rerun must bring the target up)."""
    found = serving(state)
    if not found and none_before:
        return []
    if len(found) != 1:
        return [f"{node}: {len(found)} engines serve ({', '.join(found) or 'none'}); exactly one of {', '.join(allowed)} should"]
    if found[0] not in allowed:
        return [f"{node}: {found[0]} serves; {' or '.join(allowed)} should"]
    return []


def nothing_runs(node: str, state: dict) -> list[str]:
    """After a cleanup: no engine unit active, no engine process left."""
    active = sorted(engine for engine, unit in state["units"].items() if unit["active"] in ("active", "activating", "deactivating"))
    left = [process["pid"] for process in state["processes"]]
    problems = [f"{node}: units still active after the cleanup: {', '.join(active)}"] if active else []
    return problems + ([f"{node}: engine processes left after the cleanup: {left}"] if left else [])


def untouched(node: str, before: dict, after: dict, fault_hit_engine: bool) -> list[str]:
    """A --check, or a refused run, changes nothing: the same engine serves - the same process, unless the fault itself
    killed or restarted it (then systemd's restart of the same unit is not ours)."""
    problems = []
    if serving(after) != serving(before):
        problems.append(f"{node}: {serving(before)} served before, {serving(after)} after a run that should change nothing")
    for engine, unit in before["units"].items():
        if not fault_hit_engine and unit["main_pid"] and after["units"][engine]["main_pid"] != unit["main_pid"]:
            problems.append(f"{node}: {engine}'s main process changed ({unit['main_pid']} -> {after['units'][engine]['main_pid']})")
    return problems


def foreign_untouched(node: str, state: dict) -> list[str]:
    problems = []
    for job in state.get("foreign", []):
        if not job["alive"]:
            problems.append(f"{node}: another user's job pid {job['pid']} is gone")
        if job["signals"]:
            problems.append(f"{node}: another user's job pid {job['pid']} received {', '.join(job['signals'])}")
    return problems


def escaped_worker(node: str, state: dict, torn_down: bool) -> list[str]:
    """An engine's worker escaped from its unit (its user, another cgroup): a teardown kills it, every signal it saw
    journalled for its pid and start time; a run that tears nothing down leaves it as it was."""
    problems = []
    for job in state.get("escaped", []):
        journalled = {line["signal"] for line in state.get("journal", [])
                      if line.get("phase") == "intent" and line["pid"] == job["pid"] and line.get("start_time") == job["start_time"]}
        unjournalled = sorted(set(job["signals"]) - journalled)
        if unjournalled:
            problems.append(f"{node}: the escaped worker pid {job['pid']} received {', '.join(unjournalled)} with no line in the journal")
        if torn_down and job["alive"]:
            problems.append(f"{node}: the escaped worker pid {job['pid']} still runs after the teardown")
        if not torn_down and (not job["alive"] or job["signals"]):
            problems.append(f"{node}: the escaped worker pid {job['pid']} was touched by a run that tears nothing down")
    return problems


def signals_journalled(node: str, state: dict, injected: list[dict]) -> list[str]:
    """Every signal a process saw came from systemd (a unit's stop), from its own engine (a server stopping its
    workers), from the campaign's fault - or from the collection, journalled before it was sent."""
    ours = {(line["pid"], line.get("start_time"), line["signal"]): line for line in state.get("journal", []) if line.get("phase") == "intent"}
    problems = []
    for seen in state.get("witness", []):
        if seen["sender"] == 1:
            continue
        if seen["sender_uid"] not in (0, None):
            continue  # only root or the engine's own user can signal it: its own server stopping its workers
        if any(fault["pid"] == seen["pid"] and fault["signal"] == seen["signal"] for fault in injected):
            continue
        record = ours.get((seen["pid"], seen["start_time"], seen["signal"]))
        if record is None:
            problems.append(f"{node}: pid {seen['pid']} ({seen['role']}) received {seen['signal']} from pid {seen['sender']} "
                            f"({seen['sender_comm']}) with no line in the signal journal")
        elif record["time"] > seen["at"] + 0.001:
            problems.append(f"{node}: the journal's line for {seen['signal']} to pid {seen['pid']} was written after it arrived")
    return problems


def leftovers(node: str, state: dict, holds_not_ours: tuple[str, ...] = ()) -> list[str]:
    """No lease held, no parked hold without its parked engine, no partial model served. ``holds_not_ours``: holds a
    --check found and may not clear (it writes nothing) - a parked engine that died of a fault during it stays down,
    held, as designed, until the next real run forgets it."""
    problems = [f"{node}: lease {lease['name']} still held by {lease.get('owner')} ({lease.get('expires_in')} s left)"
                for lease in state.get("leases", []) if lease.get("same_boot") and (lease.get("expires_in") or 0) > 0]
    for hold in state.get("holds", []):
        engine = hold.removesuffix(".service")
        if state["units"].get(engine, {}).get("active") != "active" and hold not in holds_not_ours:
            problems.append(f"{node}: the parked hold {hold} is left with no parked engine")
    for engine in serving(state):
        argv = state["units"][engine]["argv"]
        if any(".partial" in word for word in argv):
            problems.append(f"{node}: {engine} serves a partial model: {' '.join(argv)}")
    return problems


def gpu_memory(node: str, state: dict, escaped_left: bool = False) -> list[str]:
    """Memory on the GPUs is held only by the serving or the parked engine's unit, or by another user's job - and, after
    a run that tears nothing down (``escaped_left``: a --check), by the escaped worker it found (and its respawns)."""
    keep = {f"/{engine}.service" for engine in serving(state) + parked(state)}
    by_pid = {process["pid"]: process for process in state["processes"]}
    foreign = {job["pid"] for job in state.get("foreign", [])}
    if escaped_left:
        foreign |= {job["pid"] for job in state.get("escaped", [])} | set(state.get("respawned", []))
    problems = []
    for allocation in state.get("gpu_memory", []):
        if allocation["leak"]:
            problems.append(f"{node}: {allocation['mib']} MiB on GPU {allocation['gpu']} held by no process")
        for holder in allocation["holders"]:
            pid = int(holder.split(":")[0])
            process = by_pid.get(pid)
            if pid in foreign or (process and any(process["cgroup"].endswith(unit) for unit in keep)):
                continue
            problems.append(f"{node}: {allocation['mib']} MiB on GPU {allocation['gpu']} held by pid {pid}"
                            f" ({process['cgroup'] if process else 'not an engine'}), neither the serving nor the parked engine")
    return problems


def report_matches(node: str, state: dict, report: dict | None) -> list[str]:
    """The rerun's result says which engine serves at its end (docs/reports.md); the node must agree."""
    if not report:
        return [f"{node}: the rerun left no report"]
    host = report.get("hosts", {}).get(node)
    if host is None:
        return [f"{node}: not in the rerun's report"]
    result = host.get("result")
    claimed = {"switched": [host.get("to")], "unchanged": [host.get("to")], "rolled_back": [host.get("from")], "rollback_failed": [],
               "preflight_failed": host.get("engines_serving"), "failed": host.get("engines_serving"),
               "not_reached": host.get("engines_serving")}.get(result)
    if claimed is None:
        return []  # unreachable: the report claims nothing of the node's end
    if sorted(engine for engine in claimed if engine) != serving(state):
        return [f"{node}: the report's {result!r} means {claimed} serve(s); the node serves {serving(state)}"]
    return []


def converged(node: str, operation: str, report: dict | None) -> list[str]:
    """A second plain rerun finds nothing to do."""
    if not report:
        return [f"{node}: the second rerun left no report"]
    host = report.get("hosts", {}).get(node, {})
    if operation in SWITCHES and host.get("result") != "unchanged":
        return [f"{node}: a second plain rerun ended {host.get('result')!r} ({host.get('reason')}), not 'unchanged'"]
    if operation == "cleanup" and (host.get("result") != "ok" or host.get("signals")):
        return [f"{node}: a second cleanup ended {host.get('result')!r} and signalled {len(host.get('signals') or [])} process(es)"]
    return []
