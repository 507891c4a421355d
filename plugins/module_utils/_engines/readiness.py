# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""engine_ready and engine_drain without AnsibleModule: their requests, validated; the waits; the verdicts.

The waits observe through two seams the modules hand in - the engine's HTTP client and a function returning a unit's
ActiveState - and never end the module themselves: a failure is raised as an Error with its context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, EngineExited, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, poll_until
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative

# the engine is not running: failed, stopped, or exited and waiting for systemd's restart (a crash loop reads "activating")
EXITED_STATES = ("failed", "inactive", "auto-restart")
SPEC_PROMPT = "Count to ten:"


@dataclass
class ReadyRequest:
    engine: str
    url: str
    model: str
    api_key: str | None
    unit: str | None
    timeout: float
    interval: float
    completion: bool
    min_spec_acceptance: float | None
    probe_requests: int
    soak: float = 0.0

    @classmethod
    def from_params(cls, params: dict) -> ReadyRequest:
        floor = params["min_spec_acceptance"]
        if floor is not None and not 0 <= floor <= 1:
            raise InvalidInput(f"min_spec_acceptance must be between 0 and 1, got {floor}")
        if params["probe_requests"] < 1:
            raise InvalidInput(f"probe_requests must be at least 1, got {params['probe_requests']}")
        return cls(engine=params["engine"], url=params["url"] or f"http://127.0.0.1:{http.DEFAULT_PORTS[params['engine']]}",
                   model=params["model"], api_key=params["api_key"], unit=params["unit"] or None,
                   timeout=non_negative("timeout", params["timeout"]),
                   interval=non_negative("interval", params["interval"], minimum_exclusive=True), completion=params["completion"],
                   min_spec_acceptance=floor, probe_requests=params["probe_requests"],
                   soak=non_negative("soak", params.get("soak") or 0))


@dataclass
class ReadyProbe:
    readiness: http.Readiness | None  # None: not asked, the unit had exited
    unit_state: str | None


ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit)\b:? ?.*")
# what an engine's log lines carry before the message: vLLM's "(EngineCore pid=240) ERROR 12-02 18:32:00 [core.py:1510] "
LOG_PREFIX = re.compile(r"^(?:\([\w-]+ pid=\d+\) )?(?:(?:ERROR|WARNING|INFO|CRITICAL) [\d-]+ [\d:.]+ \[[^]]*\] )?")


def engine_said(lines: list[str]) -> str | None:
    """The root cause an engine printed before it exited: the first exception line (`RuntimeError: ...`) of its last
    start (the lines after systemd's last "Started"), without its log prefix; None when it printed none."""
    starts = [index for index, line in enumerate(lines) if line.startswith(("Started ", "Starting "))]
    for line in lines[starts[-1] + 1 if starts else 0:]:
        text = LOG_PREFIX.sub("", line.strip())
        if ERROR_LINE.match(text) and not text.startswith(("Traceback", "File ")):
            return text[:400]
    return None


def wait_ready(request: ReadyRequest, client: http.HttpClient, unit_state=None, clock: Clock | None = None, journal=None) -> dict:
    """Poll until the engine serves or the deadline; the report. Raises EngineExited when its unit stops meanwhile,
    naming what the engine said last (``journal``: the unit's recent log lines) where it said something."""
    def probe() -> ReadyProbe:
        state = unit_state(request.unit) if request.unit and unit_state else None
        if state in EXITED_STATES:
            return ReadyProbe(None, state)
        return ReadyProbe(http.check_ready(request.engine, client, request.model, request.completion), state)

    outcome = poll_until(probe, lambda found: found.readiness is not None and found.readiness.ready, request.timeout, request.interval,
                         clock=clock, stop_early=lambda found: found.readiness is None)
    found = outcome.value
    if found.readiness is None:
        said = engine_said(journal(request.unit)) if journal else None
        raise EngineExited(f"{request.unit} is {found.unit_state} {outcome.elapsed:.1f} s into this wait: the engine exited"
                           + (f"; it said: {said}" if said else "") + f" (journalctl -u {request.unit})",
                           ready=False, unit_state=found.unit_state, elapsed=outcome.elapsed, engine_said=said)
    report = dict(ready=found.readiness.ready, checks=found.readiness.checks, waiting_for=found.readiness.waiting_for, elapsed=outcome.elapsed)
    if request.unit:
        report["unit_state"] = found.unit_state
    return report


# what must not move while an engine soaks: a new invocation or main process, or a restart, is a crash systemd hid
SOAK_IDENTITY = ("InvocationID", "MainPID", "NRestarts")
# readiness failing this many probes in a row ends the soak (one slow answer on a busy node is not a crash)
SOAK_FAILURES_IN_A_ROW = 2


def soak(request: ReadyRequest, client: http.HttpClient, unit_properties=None, clock: Clock | None = None) -> dict:
    """Once ready, keep watching for request.soak seconds (Kubernetes' minReadySeconds): the unit keeps its invocation,
    main PID and restart count, and readiness with a one-token completion keeps passing. Raises EngineExited (the unit
    moved) or CheckFailed (it stopped serving), naming how long after it was ready; the soak's record otherwise."""
    clock = clock or Clock()
    started = clock.monotonic()
    baseline = {key: unit_properties(request.unit).get(key) for key in SOAK_IDENTITY} if request.unit and unit_properties else None
    probes, failing, last = 0, 0, None

    def moved() -> str | None:
        now = unit_properties(request.unit)
        if now.get("ActiveState") in EXITED_STATES or now.get("SubState") == "auto-restart":
            return f"is {now.get('SubState') or now.get('ActiveState')}"
        changes = [f"{key} {baseline[key]} -> {now.get(key)}" for key in SOAK_IDENTITY if now.get(key) != baseline[key]]
        return ", ".join(changes) or None

    while True:
        after = clock.monotonic() - started
        if baseline is not None:
            change = moved()
            if change:
                raise EngineExited(f"{request.unit} crashed {after:.1f} s after it was ready ({change}; journalctl -u {request.unit})",
                                   ready=False, soak={"seconds": round(after, 2), "probes": probes, "passed": False})
        last = http.check_ready(request.engine, client, request.model, completion=True)
        probes += 1
        failing = 0 if last.ready else failing + 1
        if failing >= SOAK_FAILURES_IN_A_ROW:
            raise CheckFailed(f"stopped serving {after:.1f} s after it was ready: {last.waiting_for} ({failing} probes in a row)",
                              ready=False, checks=last.checks, soak={"seconds": round(after, 2), "probes": probes, "passed": False})
        remaining = request.soak - (clock.monotonic() - started)
        if remaining <= 0:
            return {"seconds": round(clock.monotonic() - started, 2), "probes": probes, "passed": True}
        clock.sleep(min(request.interval, remaining))


def check_acceptance(request: ReadyRequest, client: http.HttpClient, report: dict) -> float | None:
    """Speculative-decoding acceptance over probe requests; raises CheckFailed under the floor (the report as context)."""
    before = http.spec_counters(request.engine, client)
    for _request in range(request.probe_requests):
        client.request("POST", "/v1/completions", {"model": request.model, "prompt": SPEC_PROMPT, "max_tokens": 16})
    acceptance = http.spec_acceptance(request.engine, before, http.spec_counters(request.engine, client))
    if acceptance is None or acceptance < request.min_spec_acceptance:
        raise CheckFailed(f"speculative decoding acceptance {acceptance if acceptance is not None else 'unavailable'} is below "
                          f"min_spec_acceptance {request.min_spec_acceptance}: the drafter slows this engine down",
                          **dict(report, spec_acceptance=acceptance))
    return acceptance


@dataclass
class DrainRequest:
    engine: str
    url: str
    timeout: float
    interval: float
    fail_on_timeout: bool

    @classmethod
    def from_params(cls, params: dict) -> DrainRequest:
        return cls(engine=params["engine"], url=params["url"] or f"http://127.0.0.1:{http.DEFAULT_PORTS[params['engine']]}",
                   timeout=non_negative("timeout", params["timeout"]),
                   interval=non_negative("interval", params["interval"], minimum_exclusive=True), fail_on_timeout=params["fail_on_timeout"])


def wait_drained(request: DrainRequest, client: http.HttpClient, clock: Clock | None = None) -> dict:
    """Poll the engine's running and queued requests until 0 (or it does not answer) or the deadline; the report."""
    outcome = poll_until(lambda: http.running_requests(request.engine, client), lambda running: running is None or running == 0,
                         request.timeout, request.interval, clock=clock)
    report = dict(drained=outcome.satisfied, running=outcome.value, answering=outcome.value is not None, elapsed=outcome.elapsed)
    if not outcome.satisfied and request.fail_on_timeout:
        raise CheckFailed(f"{outcome.value:g} request(s) still running after {request.timeout:g}s", **report)
    return report
