# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The teardown's steps, in one place for every caller: the cleanup (node_teardown, the gpu_teardown role) and the
switch (the cutover tears the previous engine down with them, and its rollback the target). Everything with a side
effect goes through one seam, TeardownOps, which _teardown.node implements on a node and tests replace."""

from __future__ import annotations

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock

# the steps as the report names them (gpufleet.serving.teardown_host_report reads a cleanup's and a cutover's alike)
STEPS = ("before", "units", "holders", "after")


class TeardownFailed(Error):
    """A teardown step failed; ``steps`` holds what each step returned up to the failure."""


class TeardownOps:
    """The seam: every side effect of a teardown."""

    def memory(self, wait: bool, left_pids: tuple[int, ...] = ()) -> dict:
        """gpu_memory_assert: one reading (wait false), or polled to its deadline; raises when a GPU is not free.
        ``left_pids``: holders the teardown reported and left (outside_units=report), whose memory is not counted."""
        raise NotImplementedError

    def stop_units(self, units: list[str], stop_timeout: float) -> dict:
        """systemd_stop_hard per unit, as a looped task registers it: {results: [...]}; raises TeardownFailed."""
        raise NotImplementedError

    def decide(self, units: list[str], kept: tuple[str, ...] = ()) -> dict:
        """The holders found and classified, nothing signalled; raises where the plan is refused. The processes of
        ``kept`` (a parked engine's unit) are neither signalled nor foreign: they are listed as ``kept``."""
        raise NotImplementedError

    def kill_holders(self, units: list[str], kept: tuple[str, ...] = (), leave_foreign: bool = False) -> dict:
        """The holders killed; with ``leave_foreign``, another user's holders are reported and left where the node's
        setting would refuse them (the way back: refusing there leaves no engine)."""
        raise NotImplementedError

    def reset_failed(self, units: list[str]) -> None:
        raise NotImplementedError


def longest_run(units: int, stop_timeout: float, kill_timeout: float, term_timeout: float, memory_timeout: float,
                holders_kill_timeout: float | None = None) -> float:
    """An upper bound of a teardown's own waits - the one formula for the cleanup's lease and the switch's: each unit's
    stop, then SIGKILL of its group and a settle; the holders' SIGTERM, then SIGKILL; the memory polled free."""
    holders_kill = kill_timeout if holders_kill_timeout is None else holders_kill_timeout
    return float(units * (stop_timeout + kill_timeout + 1) + term_timeout + holders_kill + memory_timeout)


def teardown(units: list[str], ops: TeardownOps, stop_timeout: float, decide: bool = False, only: tuple = STEPS,
             kept: tuple[str, ...] = (), leave_foreign: bool = False) -> dict:
    """Stop every engine unit of ``units`` hard, kill what still holds the GPUs, assert every GPU free (the steps of
    ``only``). With ``decide``, the holders are found and classified first and a refused plan (another user's process,
    a restarting service's, too many) stops the teardown before any unit is stopped. ``kept``: a parked engine's units
    - not stopped, its processes not signalled, their GPU memory reported and not counted. ``leave_foreign``: another
    user's holders are reported and left, their memory not counted (a rollback's).

    Raises TeardownFailed carrying the steps so far, with failed_step and failure set as gpu_teardown's rescue sets them.
    """
    steps: dict = {"check_mode": False, "seconds": {}}
    clock = getattr(ops, "clock", None) or Clock()
    keep = tuple(kept)
    stopped = [unit for unit in units if unit not in keep]
    plan = (("before", lambda: ops.memory(wait=False)),
            ("decide", lambda: ops.decide(stopped, keep) if keep else ops.decide(stopped)),
            ("units", lambda: ops.stop_units(stopped, stop_timeout)),
            ("holders", lambda: (ops.kill_holders(stopped, keep, leave_foreign=True) if leave_foreign
                                 else ops.kill_holders(stopped, keep) if keep else ops.kill_holders(stopped))),
            # what the engines released is judged: a holder reported and left keeps its memory
            ("after", lambda: ops.memory(wait=True, left_pids=left_holders(steps))))
    step = "before"
    try:
        for step, run in plan:
            if (step == "decide" and not decide) or (step != "decide" and step not in only):
                continue
            started = clock.monotonic()
            steps[step] = run()
            steps["seconds"][step] = round(clock.monotonic() - started, 3)  # where a teardown's time goes
    except Error as exc:
        if step == "units" and isinstance(exc, TeardownFailed):
            steps["units"] = exc.context.get("units") or {}
        elif step == "decide":  # the refused plan names the holders
            steps["holders"] = dict(exc.context, failed=True, msg=exc.msg)
        elif step != "units":
            steps[step] = dict(exc.context, failed=True, msg=exc.msg)
        steps.update(failed_step=step, failure=dict(exc.context, failed=True, msg=exc.msg))
        raise TeardownFailed(f"{step}: {exc.msg}", steps=steps) from None
    failed = [unit["unit"] for unit in (steps.get("units") or {}).get("results") or []
              if (unit.get("state_after") or {}).get("ActiveState") == "failed"]
    if failed:
        # a switch is not an engine failure (monitoring alerts on failed units); the report keeps what was killed
        ops.reset_failed(failed)
    return steps


def left_holders(steps: dict) -> tuple[int, ...]:
    """The pids of the holders the teardown's holders step left running: reported (outside_units=report) or kept (a
    parked engine's)."""
    holders = steps.get("holders") or {}
    return tuple(sorted({holder["pid"] for holder in (holders.get("outside") or []) + (holders.get("kept") or [])}))
