"""The gate's Molecule runner repeats each failed task's name and message at the end of its output, the part CI keeps."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "tools"))

import run_molecule  # noqa: E402

LOG = """\
TASK [Chaos | Run the short schedule] ******
changed: [localhost]

TASK [Chaos | Every run kept every invariant] ******
\x1b[0;31mfatal: [localhost]: FAILED! => changed=false\x1b[0m
  assertion: __campaign.rc == 0
  msg: |-
    seed 7: violation: vllm.service active after the switch to sglang

TASK [Lease | Nothing takes the free lease] ******
...ignoring
TASK [Lease | The lease is gone] ******
fatal: [localhost -> node1]: FAILED! => {"changed": false, "msg": "non-zero return code", "stdout": "%s"}
TASK [Lease | The lease is gone] ******
fatal: [localhost -> node1]: FAILED! => {"msg": "said twice"}
"""


def test_each_failed_task_is_named_once_with_the_start_of_what_it_said(tmp_path):
    log = tmp_path / "molecule-x.log"
    log.write_text(LOG % ("x" * 2000))
    failed = run_molecule.failed_tasks(log)
    assert [task for task, _said in failed] == ["TASK [Chaos | Every run kept every invariant] ******", "TASK [Lease | The lease is gone] ******"]
    assert failed[0][1] == "changed=false assertion: __campaign.rc == 0 msg: |- seed 7: violation: vllm.service active after the switch to sglang"
    assert failed[1][1].startswith('{"changed": false, "msg": "non-zero return code", "stdout": "xxx')
    assert len(failed[1][1]) == run_molecule.MESSAGE_CHARS
