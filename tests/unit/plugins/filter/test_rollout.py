"""switch_engine.yml's rollout: the batches from every form the README and playbook header show, and the failure gate."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from ansible.parsing.splitter import parse_kv
from ansible.parsing.utils.yaml import from_yaml
from conftest import REPO

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _rollout as rollout


@pytest.mark.covers('E14')
@pytest.mark.parametrize(("value", "batches"), [
    ([1, "25%"], [1, "25%"]),
    ("[1, 4]", [1, 4]),
    ('[1, "25%"]', [1, "25%"]),
    ("[1, '25%']", [1, "25%"]),
    ("1,4", [1, 4]),
    ("1, 25%", [1, "25%"]),
    (2, [2]),
    ("2", [2]),
    ("100%", ["100%"]),
])
def test_batches_from_every_documented_form(value, batches):
    """E14: the forms the docs print, as -e passes them (strings, JSON lists, shares)."""
    assert rollout.rollout_batches(value) == batches


@pytest.mark.covers('E14')
@pytest.mark.parametrize(("value", "message"), [
    (0, "a batch needs at least 1 node (0 would switch every node at once, with no canary), got 0"),
    ("0", "a batch needs at least 1 node"),
    ([1, -2], "a batch needs at least 1 node"),
    ("0%", "a share must be above 0 % and at most 100 %"),
    ("150%", "a share must be above 0 % and at most 100 %"),
    ({"a": 1}, "is not a batch or a list of batches"),
    ([], "is not a batch or a list of batches"),
    ("[1, 4", "is not a list"),
    ("four", "'four' is neither a node count nor a share"),
    ([True], "True is not a batch"),
])
def test_bad_batches_are_refused_naming_the_variable(value, message):
    """E14: refused before any node is touched, naming the variable and what it accepts."""
    with pytest.raises(rollout.RolloutError) as error:
        rollout.rollout_batches(value)
    assert str(error.value).startswith("switch_engine_serial: ") and message in str(error.value)


def documented_serial_arguments() -> list[str]:
    """Every -e '...switch_engine_serial...' the README and the playbook header print."""
    texts = [(REPO / "README.md").read_text(), (REPO / "playbooks" / "switch_engine.yml").read_text()]
    found = [match for text in texts for match in re.findall(r"-e '([^']*switch_engine_serial[^']*)'", text)]
    assert len(found) >= 2, found
    return found


@pytest.mark.parametrize("argument", documented_serial_arguments())
def test_what_the_readme_and_the_playbook_tell_users_to_type_parses(argument):
    """As ansible-playbook reads -e: JSON/YAML when it starts with { or [, else key=value pairs split on spaces."""
    variables = from_yaml(argument) if argument.lstrip().startswith(("{", "[")) else parse_kv(argument)
    assert set(variables) == {"switch_engine_serial"}, f"{argument!r} parses as {variables!r}"
    assert rollout.rollout_batches(variables["switch_engine_serial"])


# --- the gate --------------------------------------------------------------------------------------------------------------
def test_the_gate_counts_only_nodes_tried():
    done = {"node1": {"result": "rolled_back"}, "node2": {"result": "not_reached"}, "node3": None}
    gate = rollout.rollout_gate(done, 0)
    assert gate["stop"] and gate["tried"] == 1 and gate["failed"] == ["node1"]
    assert gate["message"].startswith("rollout stopped: 1 of 1 node(s) tried so far did not switch (node1 (rolled_back))")


@pytest.mark.parametrize(("results", "allowed", "stop"), [
    (["switched", "switched"], 0, False),
    (["switched", "failed"], 0, True),
    (["switched", "failed"], 50, False),
    (["switched", "failed", "switched"], 33, True),
    (["unchanged", "switched", "rollback_failed", "switched"], 25, False),
    ([], 0, False),
])
def test_the_gate_stops_above_the_allowed_share(results, allowed, stop):
    gate = rollout.rollout_gate({f"n{i}": {"result": r} for i, r in enumerate(results)}, allowed)
    assert gate["stop"] is stop


@pytest.mark.parametrize("allowed", ["ten", -1, 101])
def test_the_gate_refuses_a_bad_share(allowed):
    with pytest.raises(rollout.RolloutError, match="switch_engine_max_fail_percentage"):
        rollout.rollout_gate({}, allowed)


# --- lease owners ----------------------------------------------------------------------------------------------------------
def test_a_run_of_this_controller_is_gone_once_its_process_is():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = rollout.run_owner("20261130T080000", 12345, controller_pid=child.pid)
        assert rollout.RUN_OWNER.match(owner) and not rollout.run_owner_gone(owner)
    finally:
        child.kill()
        child.wait()
    assert rollout.run_owner_gone(owner), "the interrupted run's process is gone"


def test_a_reused_pid_is_not_the_run():
    owner = rollout.run_owner("20261130T080000", 1, controller_pid=os.getpid())
    reused = re.sub(r"-(\d+)\.(\d+)-", lambda m: f"-{m.group(1)}.{int(m.group(2)) + 1}-", owner)
    assert not rollout.run_owner_gone(owner) and rollout.run_owner_gone(reused)


@pytest.mark.parametrize("owner", ["20261130T080000-other-controller-1.5-7", "limited-run-42", "", None])
def test_runs_of_other_controllers_and_other_forms_are_never_judged(owner):
    assert not rollout.run_owner_gone(owner)


def test_one_lease_wait_takes_over_only_a_gone_run_of_this_controller_and_waits_for_any_other_in_slices():
    """The switch's and the cleanup's one rule for another run's lease: a run of this controller whose process is gone
    is taken over (once the work it left ended, on the node); a live one, another controller's, or an owner in another
    form is waited for, in slices of at most 15 s that fill the wait."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = rollout.run_owner("20261130T080000", 7, controller_pid=child.pid)
        waited = rollout.lease_wait({"owner": live}, "run-1", 40)
    finally:
        child.kill()
        child.wait()
    assert waited == {"wait": True, "break_owner": None, "slice": 15.0, "retries": 3, "text": f"waiting up to 40 s for the node's lease - held by {live}"}
    gone = rollout.lease_wait({"owner": live}, "run-1", 40, working="4242")
    assert gone["break_owner"] == live and "taken over once the work it left ended" in gone["text"]
    assert gone["text"].endswith("the cutover of the run before (pid 4242) still runs on the node")
    assert rollout.lease_wait({"owner": "20261130T080000-other-controller-1.5-7"}, "run-1", 5)["break_owner"] is None
    assert rollout.lease_wait({"owner": "run-1"}, "run-1", 40)["wait"] is False, "this run holds it already"
    free = rollout.lease_wait(None, "run-1", 0)
    assert free["wait"] and free["retries"] == 1 and free["slice"] == 0 and free["text"].endswith("given back"), "try once, wait for nothing"
    with pytest.raises(rollout.RolloutError, match="at least 0 s, got -1"):
        rollout.lease_wait(None, "run-1", -1)
