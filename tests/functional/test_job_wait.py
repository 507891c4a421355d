"""gpufleet.serving.job_wait as a playbook runs it: real background jobs (async), their progress files, a failure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import COLLECTIONS

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: A download's stand-in, writing its progress each second
      ansible.builtin.shell: >-
        for i in 1 2 3 4; do echo '{{"bytes_done": '$((i*268435456))', "bytes_total": 1073741824, "rate_mib_s": 42.0}}'
        > {progress}.new && mv {progress}.new {progress}; sleep 1; done
      async: 60
      poll: 0
      register: good
    - name: A job that fails with its own message
      ansible.builtin.command:
        argv: [sh, -c, 'sleep 1; echo "not enough room: 3.00 GiB to fetch" >&2; exit 3']
      async: 60
      poll: 0
      register: bad
    - name: Wait for the first
      gpufleet.serving.job_wait:
        jobs: [{{jid: "{{{{ good.ansible_job_id }}}}", label: demo, progress: {progress}}}]
        report_every: 1
        interval: 0.5
      register: waited
    - name: It finished, and its result is the job's
      ansible.builtin.assert:
        that: waited.results[0].finished and waited.results[0].rc == 0 and waited.elapsed >= 2
    - name: Wait for the second
      gpufleet.serving.job_wait:
        jobs: [{{jid: "{{{{ bad.ansible_job_id }}}}", label: failing}}]
"""


def test_the_wait_prints_each_jobs_progress_and_fails_with_a_failed_jobs_own_message(tmp_path):
    """Issue 42 (6): one task, a line of bytes done of the total and the rate while the job runs - no retry lines -
    and a job that failed fails the task with its own message."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(progress=tmp_path / "job.progress"))
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_ASYNC_DIR": str(tmp_path / "async")}
    run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                          "-e", f"ansible_python_interpreter={sys.executable}", str(play)],
                         capture_output=True, text=True, env=env, timeout=120, check=False)
    output = run.stdout + run.stderr
    # which quarter is shown depends on the machine's pace; each line says it the same way
    assert re.search(r"localhost: demo: [01]\.[0-9]{2} of 1\.00 GiB \((25|50|75|100) %\), 42\.0 MiB/s", output), output[-3000:]
    assert "RETRYING" not in output and "All assertions passed" in output
    assert run.returncode != 0 and "not enough room: 3.00 GiB to fetch" in output.split("Wait for the second")[-1]


def test_a_merges_progress_says_it_is_merging():
    from ansible_collections.gpufleet.serving.plugins.action.job_wait import progress_line

    merging = {"step": "merge", "bytes_done": 3 << 29, "bytes_total": 3 << 30, "rate_mib_s": 812.4}
    assert progress_line("lab/Tiny-GGUF:Q4_K_M", merging, 12) == "lab/Tiny-GGUF:Q4_K_M: merging 1.50 of 3.00 GiB (50 %), 812.4 MiB/s"
    assert progress_line("x", dict(merging, step="download"), 12) == "x: 1.50 of 3.00 GiB (50 %), 812.4 MiB/s"
