# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.job_wait: wait for background jobs of this host, showing each one's progress.

An until/retries loop over async_status prints "FAILED - RETRYING" lines and no figures; this waits in one task,
asks async_status for each job and reads the job's progress file (bytes done of the total, the rate) on the node,
and prints one line per job at most every ``report_every`` seconds. A job that failed fails the task with its own
message; the results are the jobs' own, in the order given.
"""

from __future__ import annotations

import base64
import json
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


def progress_line(label: str, progress: dict | None, waited: float) -> str:
    """'lab/tiny-llama: 1.20 of 3.00 GiB (40 %), 85.3 MiB/s' ('merging 1.20 of ...' for a split GGUF's merge) - or how
    long it has been going when no figures are in."""
    if not progress or not progress.get("bytes_total"):
        return f"{label}: running for {waited:.0f} s (no figures yet)"
    done, total = progress.get("bytes_done") or 0, progress["bytes_total"]
    rate = f", {progress['rate_mib_s']:.1f} MiB/s" if progress.get("rate_mib_s") else ""
    step = "merging " if progress.get("step") == "merge" else ""
    return f"{label}: {step}{done / 2**30:.2f} of {total / 2**30:.2f} GiB ({100 * done / total:.0f} %){rate}"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("jobs", "timeout", "interval", "report_every"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        jobs = self._task.args.get("jobs") or []
        if not isinstance(jobs, list) or any(not isinstance(job, dict) or not job.get("jid") for job in jobs):
            raise AnsibleActionFail("jobs: give a list of {jid, label, progress} (the registered results of an async task)")
        timeout = float(self._task.args.get("timeout", 3600))
        interval = float(self._task.args.get("interval", 2))
        report_every = float(self._task.args.get("report_every", 10))
        # where async_wrapper keeps the jobs' results, as ansible.builtin.async_status finds it
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        started = time.monotonic()
        finished: dict = {}
        shown = started
        host = task_vars.get("inventory_hostname", "?")
        while True:
            for job in jobs:
                if job["jid"] not in finished:
                    status = self._execute_module(module_name="ansible.legacy.async_status",
                                                  module_args={"jid": job["jid"], "_async_dir": async_dir}, task_vars=task_vars)
                    if status.get("finished") or status.get("failed") and "finished" not in status:
                        finished[job["jid"]] = status
            pending = [job for job in jobs if job["jid"] not in finished]
            waited = time.monotonic() - started
            if not pending or waited >= timeout:
                break
            if time.monotonic() - shown >= report_every:
                shown = time.monotonic()
                for job in pending:
                    display.display(f"{host}: {progress_line(job.get('label') or job['jid'], self._progress(job, task_vars), waited)}")
            time.sleep(min(interval, max(0.0, timeout - waited)))
        results = [finished.get(job["jid"], {"failed": True, "finished": 0, "ansible_job_id": job["jid"],
                                             "msg": f"{job.get('label') or job['jid']}: still running after {timeout:g} s"}) for job in jobs]
        failed = [item for item in results if item.get("failed")]
        result.update(results=results, changed=any(item.get("changed") for item in results), elapsed=round(time.monotonic() - started, 1))
        if failed:
            result.update(failed=True, msg="; ".join(str(item.get("msg")) for item in failed))
        return result

    def _progress(self, job: dict, task_vars) -> dict | None:
        """The job's progress file on the node, read with slurp; None while it has none."""
        if not job.get("progress"):
            return None
        read = self._execute_module(module_name="ansible.legacy.slurp", module_args={"src": job["progress"]}, task_vars=task_vars)
        if read.get("failed") or not read.get("content"):
            return None
        try:
            return json.loads(base64.b64decode(read["content"]))
        except ValueError:
            return None
