# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Is a GPU clean? Thresholds on NVML readings, and why a dirty GPU is dirty."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, Error, InvalidInput, NvmlHung
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import DEFAULT_DEVICE_GLOBS, HolderScanner, device_nodes
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import NvmlClient, select_gpus, validate_gpu_selectors
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock, poll_until
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader, describe
from ansible_collections.gpufleet.serving.plugins.module_utils._validate import non_negative, non_negative_int

# Only when NVML's v2 memory query is missing: v1 `used` includes the driver reserve
# (615 MiB on an idle H200, up to ~1 GiB on other parts), so that much is subtracted.
DEFAULT_V1_RESERVE_MIB = 1024
FATAL_STATUSES = ("lost", "reset_required", "error")

HOLDER_PRESENT = "holder_present"
NO_HOLDER_FOUND = "no_holder_found"
GPU_LOST = "gpu_lost"
RESET_REQUIRED = "reset_required"
NVML_ERROR = "nvml_error"
NVML_HUNG = "nvml_hung"

EXPLANATIONS = {
    HOLDER_PRESENT: "a process still holds the GPU",
    NO_HOLDER_FOUND: "memory used but no process holds the GPU: memory leaked (CUDA IPC, driver); a GPU reset may be needed",
    GPU_LOST: "NVML reports the GPU lost (fallen off the bus): the node needs attention, a reboot in practice",
    RESET_REQUIRED: "NVML reports that the GPU requires a reset",
    NVML_ERROR: "NVML could not read the GPU",
    NVML_HUNG: "NVML did not answer (driver hung?)",
}


DEFAULT_MAX_USED_MIB = 512


@dataclass(frozen=True)
class Limits:
    max_used_mib: int | None
    max_processes: int | None = None
    v1_reserve_mib: int = DEFAULT_V1_RESERVE_MIB
    max_used_percent: float | None = None  # of each GPU's total; with max_used_mib too, both must hold
    # holders left running on purpose (outside_units=report): their memory, as NVML lists it per GPU, is not counted
    left_pids: frozenset[int] = frozenset()

    def used_limits(self, total_mib: int | None) -> list[tuple[float, str]]:
        """The used-memory limits a GPU of this size must stay under, each with how a problem names it."""
        limits = []
        if self.max_used_mib is not None:
            limits.append((self.max_used_mib, f"max_used_mib {self.max_used_mib}"))
        if self.max_used_percent is not None and total_mib:
            limits.append((total_mib * self.max_used_percent / 100, f"max_used_percent {self.max_used_percent:g} % of {total_mib} MiB"))
        return limits


def comparable_used_mib(gpu: dict, v1_reserve_mib: int) -> int | None:
    """The `used` figure the threshold applies to: v2 as reported, v1 less the documented reserve."""
    if gpu.get("used_mib") is None:
        return None
    if gpu.get("memory_api") == "v1":
        return max(0, gpu["used_mib"] - v1_reserve_mib)
    return gpu["used_mib"]


@dataclass
class Assessment:
    gpus: list[dict] = field(default_factory=list)  # per selected GPU, with `clean` and `problems`
    dirty: list[int] = field(default_factory=list)
    fatal: list[int] = field(default_factory=list)  # will not get better by waiting

    @property
    def passed(self) -> bool:
        return not self.dirty


def assess(inventory: dict, selected: list[int], limits: Limits) -> Assessment:
    assessment = Assessment()
    by_index = {gpu["index"]: gpu for gpu in inventory["gpus"]}
    for index in selected:
        gpu = dict(by_index[index])
        used = comparable_used_mib(gpu, limits.v1_reserve_mib)
        processes = gpu.get("processes", [])
        left = [process for process in processes if process["pid"] in limits.left_pids]
        # a left holder whose memory NVML does not report cannot be discounted: the GPU is judged on all it uses
        gpu["left_mib"] = sum(process["used_mib"] or 0 for process in left) if left else None
        if used is not None and left:
            used = max(0, used - gpu["left_mib"])
        problems = []
        if gpu["status"] != "ok":
            problems.append(f"NVML status {gpu['status']}: {gpu.get('error', '')}".rstrip(": "))
        for limit, named in limits.used_limits(gpu.get("total_mib")) if used is not None else []:
            if used > limit:
                problems.append(f"{used} MiB used > {named}")
        counted = len(processes) - len(left)
        if limits.max_processes is not None and counted > limits.max_processes:
            problems.append(f"{counted} processes > max_processes {limits.max_processes}")
        if left and problems:
            unknown = [str(process["pid"]) for process in left if process.get("used_mib") is None]
            problems.append(f"{gpu['left_mib']} MiB of left holder(s) {', '.join(str(process['pid']) for process in left)} not counted"
                            + (f" (NVML reports no memory for {', '.join(unknown)})" if unknown else ""))
        gpu.update(clean=not problems, problems=problems, compared_used_mib=used)
        assessment.gpus.append(gpu)
        if problems:
            assessment.dirty.append(index)
            if gpu["status"] in FATAL_STATUSES:
                assessment.fatal.append(index)
    return assessment


def classify(gpu: dict, proc_holders: list[dict]) -> str:
    """Why a dirty GPU is dirty, from NVML status and the /proc holders of its device node."""
    if gpu["status"] == "lost":
        return GPU_LOST
    if gpu["status"] == "reset_required":
        return RESET_REQUIRED
    if gpu["status"] != "ok":
        return NVML_ERROR
    return HOLDER_PRESENT if proc_holders else NO_HOLDER_FOUND


def failure_message(assessment: Assessment, details: dict[int, dict], timeout: float) -> str:
    """One line per dirty GPU: used MiB, holders from /proc and NVML, classification."""
    lines = [f"{len(assessment.dirty)} of {len(assessment.gpus)} GPU(s) not clean after {timeout:g}s:"]
    for gpu in assessment.gpus:
        if gpu["clean"]:
            continue
        detail = details.get(gpu["index"], {})
        proc = ", ".join(f"{h['pid']} ({h['comm']}, state {h['state']})" for h in detail.get("proc_holders", [])) or "none"
        listed = ", ".join(_describe_listed(p) for p in detail.get("nvml_processes", [])) or "none"
        lines.append(
            f"GPU {gpu['index']} ({gpu.get('uuid', '?')}, bus {gpu.get('bus_id', '?')}): {'; '.join(gpu['problems'])}; "
            f"holders in /proc: {proc}; NVML processes: {listed}; {detail.get('classification')}: "
            f"{EXPLANATIONS.get(detail.get('classification'), '')}")
    return "\n".join(lines)


def _describe_listed(process: dict) -> str:
    """'1234', '1234 (graphics)', '1234 (mps, stale: ...)': compute is the usual case and goes unsaid."""
    notes = [process["type"]] if process.get("type", "compute") != "compute" else []
    notes += [f"stale: {process['stale']}"] if process.get("stale") else []
    return f"{process['pid']} ({', '.join(notes)})" if notes else str(process["pid"])


@dataclass(frozen=True)
class MemoryRequest:
    gpus: list[str] | None
    expected_count: int | None
    limits: Limits
    timeout: float
    interval: float
    nvml_timeout: float
    device_paths: list[str]

    @classmethod
    def from_params(cls, params: dict) -> MemoryRequest:
        validate_gpu_selectors(params.get("gpus"))
        left_pids = params.get("left_pids") or []
        for pid in left_pids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
                raise InvalidInput(f"left_pids: {pid!r} is not a process id")
        max_used = params.get("max_used_mib")
        percent = params.get("max_used_percent")
        if max_used is None and percent is None:
            max_used = DEFAULT_MAX_USED_MIB
        if max_used is not None and (isinstance(max_used, bool) or not isinstance(max_used, int) or max_used < 0):
            raise InvalidInput(f"max_used_mib: must be a whole number of MiB, at least 0, got {max_used!r}")
        if percent is not None and (isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 <= percent <= 100):
            raise InvalidInput(f"max_used_percent: must be a share of each GPU's memory from 0 to 100, got {percent!r}")
        interval = non_negative("interval", params["interval"], minimum_exclusive=True)
        return cls(
            gpus=params.get("gpus") or None,
            expected_count=non_negative_int("expected_count", params.get("expected_count")),
            limits=Limits(max_used, non_negative_int("max_processes", params.get("max_processes")),
                          non_negative_int("v1_reserve_mib", params["v1_reserve_mib"]), percent, frozenset(left_pids)),
            timeout=non_negative("timeout", params["timeout"]),
            interval=interval,
            nvml_timeout=non_negative("nvml_timeout", params["nvml_timeout"], minimum_exclusive=True),
            device_paths=params.get("device_paths") or list(DEFAULT_DEVICE_GLOBS),
        )


def check_inventory(request: MemoryRequest, inventory: dict) -> list[int]:
    """Checks that cannot improve by waiting: GPU count, selection, threshold above a GPU's size."""
    count = len(inventory["gpus"])
    if request.expected_count is not None and count != request.expected_count:
        seen = ", ".join(f"{gpu['index']}={gpu.get('bus_id', '?')}" for gpu in inventory["gpus"]) or "none"
        raise GpuCountMismatch(f"expected {request.expected_count} GPU(s), NVML sees {count} (a GPU fell off the bus or is hidden); seen: {seen}",
                               gpu_count=count, expected_count=request.expected_count)
    selected = select_gpus(request.gpus, inventory)
    for gpu in inventory["gpus"]:
        if gpu["index"] in selected and gpu.get("total_mib") and (request.limits.max_used_mib or 0) > gpu["total_mib"]:
            raise InvalidInput(f"max_used_mib: {request.limits.max_used_mib} MiB is more than GPU {gpu['index']}'s total of {gpu['total_mib']} MiB")
    return selected


class GpuCountMismatch(Error):
    """NVML sees another number of GPUs than the inventory expects."""


@dataclass
class WatchResult:
    assessment: Assessment
    attempts: int
    elapsed: float
    timed_out: bool


def watch(inventory_of, request: MemoryRequest, selected: list[int], first: dict, clock: Clock | None = None) -> WatchResult:
    """Poll NVML until every selected GPU is clean, a GPU fails for good, or the deadline passes."""
    pending = [first]

    def probe() -> Assessment:
        return assess(pending.pop() if pending else inventory_of(), selected, request.limits)

    outcome = poll_until(probe, lambda a: a.passed, request.timeout, request.interval, clock, stop_early=lambda a: bool(a.fatal))
    return WatchResult(outcome.value, outcome.attempts, outcome.elapsed, timed_out=not outcome.satisfied and not outcome.value.fatal)


def explain_dirty(assessment: Assessment, holders_by_minor: dict[int, list[dict]], proc_confirmed: set[int]) -> dict[int, dict]:
    """Per dirty GPU: its /proc holders, NVML processes marked stale when /proc does not confirm them, a classification."""
    details = {}
    listed_on: dict[int, set[int]] = {}
    for gpu in assessment.gpus:
        for process in gpu.get("processes", []):
            listed_on.setdefault(process["pid"], set()).add(gpu["index"])
    for gpu in assessment.gpus:
        if gpu["clean"]:
            continue
        # a CUDA process holds every visible GPU's node: one NVML places on other GPUs only is not this GPU's holder
        proc_holders = [h for h in holders_by_minor.get(gpu.get("minor"), []) if gpu["index"] in listed_on.get(h["pid"], {gpu["index"]})]
        nvml_processes = [dict(p, stale=None if p["pid"] in proc_confirmed else "not a live holder in /proc") for p in gpu.get("processes", [])]
        details[gpu["index"]] = {"proc_holders": proc_holders, "nvml_processes": nvml_processes,
                                 "classification": classify(gpu, proc_holders)}
    return details


def holders_by_minor(device_paths: list[str], reader: ProcReader, exclude: set[int]) -> tuple[dict[int, list[dict]], set[int]]:
    """/proc holders of each per-GPU device node (by minor), and every holder pid; `exclude` is this module and its children."""
    scanner = HolderScanner(device_nodes(device_paths), reader)
    scan = scanner.scan()
    grouped: dict[int, list[dict]] = {}
    for pid, holding in sorted(scan.holdings.items()):
        if pid in exclude:
            continue
        try:
            info = describe(reader, pid)
        except (ProcessGone, PermissionError):
            continue
        info["via"] = sorted(holding.via)
        for minor in {scan.minor_by_path.get(path) for path in holding.devices} - {None}:
            grouped.setdefault(minor, []).append(info)
    return grouped, set(scan.holdings) - exclude


REPORT_KEYS = ("index", "uuid", "name", "bus_id", "minor", "status", "total_mib", "used_mib", "reserved_mib", "memory_api",
               "compared_used_mib", "left_mib", "processes", "clean", "problems")


def gpu_report(assessment: Assessment) -> list[dict]:
    return [{key: gpu.get(key) for key in REPORT_KEYS} for gpu in assessment.gpus]


def assert_free(request: MemoryRequest, pynvml_loader, clock: Clock | None = None) -> dict:
    """Poll every selected GPU until it is under the limits or the timeout: gpu_memory_assert's result.

    Not passing raises CheckFailed with the result and who holds each dirty GPU (from /proc); an NVML call that hangs
    raises NvmlHung with classification nvml_hung.
    """
    clock = clock or Clock()
    started = clock.monotonic()
    try:
        # the NVML session stays open while a failure is explained: its worker then holds every device file, and the
        # /proc scan must leave it (and this process) out - a live worker is what makes that exclusion testable
        with NvmlClient(pynvml_loader, request.nvml_timeout) as nvml:
            first = nvml.inventory()
            selected = check_inventory(request, first)
            watched = watch(nvml.inventory, request, selected, first, clock)
            details = None if watched.assessment.passed else explain(request, watched.assessment)
    except NvmlHung as exc:
        raise NvmlHung(f"{exc.msg}: classification {NVML_HUNG}", classification=NVML_HUNG, passed=False,
                       elapsed=clock.monotonic() - started, **exc.context) from None
    except Error as exc:
        exc.context = dict({"passed": False, "elapsed": clock.monotonic() - started}, **exc.context)
        raise
    assessment = watched.assessment
    result = dict(changed=False, gpus=gpu_report(assessment), dirty=assessment.dirty, passed=assessment.passed,
                  attempts=watched.attempts, elapsed=watched.elapsed, driver_version=first["driver_version"])
    if not assessment.passed:
        raise CheckFailed(failure_message(assessment, details, request.timeout),
                          details={str(index): detail for index, detail in details.items()}, **result)
    return result


def explain(request: MemoryRequest, assessment: Assessment) -> dict:
    """Who holds each dirty GPU, from /proc: never this process or its NVML worker."""
    reader = ProcReader()
    exclude = {os.getpid()} | reader.descendants(os.getpid())
    by_minor, confirmed = holders_by_minor(request.device_paths, reader, exclude)
    return explain_dirty(assessment, by_minor, confirmed)
