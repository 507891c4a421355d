"""The playbooks run by ansible-playbook with a bad request: refused before any node is touched, and the report of an
earlier run removed so that it never passes for this one's.

The inventory's nodes are SSH hosts on a loopback port where nothing listens: a task that reached for a node would make
it UNREACHABLE, so a refusal with no node reached shows that none was touched.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from conftest import COLLECTIONS, REPO

PLAYBOOKS = REPO / "playbooks"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def fleet(tmp_path):
    port = closed_port()
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[gpu_nodes]\n" + "".join(f"node{n} ansible_host=127.0.0.1 ansible_port={port}\n" for n in (1, 2))
                         + "\n[gpu_nodes:vars]\nansible_connection=ssh\nansible_ssh_common_args='-o ConnectTimeout=2'\n"
                         + "vllm_model=/models/m\nsglang_model=/models/m\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    return inventory, reports


def run_playbook(name: str, inventory, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
           "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"}
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), str(PLAYBOOKS / name), *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)


@pytest.mark.covers("E14", "E12")
@pytest.mark.parametrize(("extra", "named"), [
    (["-e", "target=trtllm"], "set the engine to switch to: -e target=vllm or -e target=sglang (got trtllm)"),
    ([], "(got nothing)"),
    (["-e", "target=sglang", "-e", "switch_engine_serial=0"], "switch_engine_serial"),
    (["-e", "target=sglang", "-e", "switch_engine_serial=[1, 4]"], "switch_engine_serial"),
    (["-e", "target=sglang", "-e", '{"switch_engine_serial": [1, "-25%"]}'], "switch_engine_serial"),
    (["-e", "target=sglang", "-e", "switch_engine_max_fail_percentage=half"], "switch_engine_max_fail_percentage"),
])
def test_a_bad_switch_request_touches_no_node_and_leaves_no_stale_report(fleet, extra, named):
    """E14: extra-vars typed wrong are refused before any node is touched, the message naming the variable; E12 (its
    stale-report clause): the report an earlier run left is removed, so that nothing older passes for this run's."""
    inventory, reports = fleet
    for suffix in ("json", "html"):
        (reports / f"switch_engine.{suffix}").write_text(json.dumps({"run_id": "an earlier run"}))
    run = run_playbook("switch_engine.yml", inventory, "-e", f"switch_engine_report_dir={reports}", *extra)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and named in output, output[-3000:]
    # the controller's tasks run once, delegated to localhost (shown as "node1 -> localhost"); none went to a node
    recap = [line.split() for line in output.split("PLAY RECAP")[-1].splitlines() if line.startswith("node")]
    assert "UNREACHABLE" not in output and recap and all("unreachable=0" in line for line in recap), output[-3000:]
    assert sorted(path.name for path in reports.iterdir()) == []


@pytest.mark.covers("E14")
def test_the_documented_forms_of_the_batches_are_accepted_up_to_the_first_node(fleet):
    """E14: the forms docs print - a count, a share, a list with no spaces, JSON - pass the validation; the run then
    reaches for the nodes (here: unreachable, reported as such)."""
    inventory, reports = fleet
    for form in (["-e", "switch_engine_serial=1"], ["-e", "switch_engine_serial=25%"], ["-e", "switch_engine_serial=1,4"],
                 ["-e", '{"switch_engine_serial": [1, "25%"]}']):
        run = run_playbook("switch_engine.yml", inventory, "-e", "target=sglang", "-e", f"switch_engine_report_dir={reports}", *form)
        report = json.loads((reports / "switch_engine.json").read_text())
        assert report["hosts"]["node1"]["result"] in ("unreachable", "failed"), (form, run.stdout[-2000:])


@pytest.mark.parametrize(("playbook", "hosts_variable"), [("switch_engine.yml", "switch_engine_hosts"), ("gpu_cleanup.yml", "gpu_cleanup_hosts")])
def test_an_inventory_without_the_group_is_refused_naming_it(tmp_path, playbook, hosts_variable):
    """Issue 42 (1): an inventory whose nodes are not in gpu_nodes matched only localhost - exit 0, an empty report.
    It is refused, naming the group looked for and how to name another; no report is written."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"[gpus]\nnode1 ansible_host=127.0.0.1 ansible_port={closed_port()}\n")
    reports = tmp_path / "reports"
    run = run_playbook(playbook, inventory, "-e", "target=sglang", "-e", f"switch_engine_report_dir={reports}",
                       "-e", f"gpu_cleanup_report_dir={reports}")
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-2000:]
    assert "no host of the inventory matches 'gpu_nodes'" in output and f"-e {hosts_variable}=GROUP" in output, output[-2000:]
    assert not (reports / playbook.replace(".yml", ".json")).exists()
    named = run_playbook(playbook, inventory, "-e", "target=sglang", "-e", f"{hosts_variable}=gpus", "-e", f"switch_engine_report_dir={reports}",
                         "-e", f"gpu_cleanup_report_dir={reports}")
    assert "no host of the inventory matches" not in named.stdout + named.stderr
    assert json.loads((reports / playbook.replace(".yml", ".json")).read_text())["hosts"]["node1"]["result"] in ("unreachable", "not_reached")


@pytest.mark.parametrize(("extra", "message"), [
    (["-e", "switch_engine_outside_units=kil"], "value of switch_engine_outside_units must be one of: fail, kill, report, got: kil"),
    (["-e", "sglang_tensor_parallel_size=0"], "sglang role: sglang_tensor_parallel_size: must be at least 1, got '0'"),
    (["-e", "vllm_tensor_parallel_size=0"], "vllm role: vllm_tensor_parallel_size: must be at least 1, got '0'"),
])
def test_a_bad_variable_is_refused_once_on_the_controller_with_the_whole_message(fleet, extra, message):
    """Issue 42 (9): a variable out of its documented form was refused only on the canary, its message cut at
    "Validation of arguments failed:", or hidden by a no_log task ("the output has been hidden"), or reported as a
    failure at the lease. It is refused before any node is touched, once, the whole message naming every node."""
    inventory, reports = fleet
    run = run_playbook("switch_engine.yml", inventory, "-e", "target=sglang", "-e", f"switch_engine_report_dir={reports}", *extra)
    output = run.stdout + run.stderr
    assert run.returncode != 0 and message in output, output[-3000:]
    assert "has been hidden" not in output and "UNREACHABLE" not in output
    assert output.count("FAILED!") == 1 and "PLAY [Switch each node" not in output, "refused once, before the canary's play"
    assert "node1, node2: " in output, "one line names every node it concerns"


def test_a_misspelt_variable_gets_a_warning_naming_the_real_one(fleet):
    """Issue 42 (9): a variable with a role's prefix that nothing reads is named, with the closest real one; the run
    goes on (here, to unreachable nodes)."""
    inventory, reports = fleet
    run = run_playbook("switch_engine.yml", inventory, "-e", "target=sglang", "-e", f"switch_engine_report_dir={reports}",
                       "-e", "switch_engine_trget=vllm", "-e", "vllm_tensor_paralel_size=2")
    output = run.stdout + run.stderr
    assert "switch_engine_trget is not a variable of gpufleet.serving (it is ignored); did you mean switch_engine_target?" in output
    assert "vllm_tensor_paralel_size is not a variable of gpufleet.serving (it is ignored); did you mean vllm_tensor_parallel_size?" in output
    assert "switch_engine_serial is not" not in output


def test_an_engine_roles_bad_variable_is_shown_not_hidden_by_its_no_log_task(tmp_path):
    """Issue 42 (9): the engine role's facts task is no_log (it carries the API key), so a variable out of range showed
    as "the output has been hidden". The message is shown - it never carries the key - and a good run stays hidden."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    play = tmp_path / "facts.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.include_role:\n        name: gpufleet.serving.vllm\n        tasks_from: facts\n")
    bad = run_playbook(str(play), inventory, "-e", "vllm_model=/m", "-e", "vllm_tensor_parallel_size=0", "-e", "vllm_api_key=sk-SECRET-77")
    output = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "vllm_tensor_parallel_size: must be at least 1, got '0'" in output, output[-2000:]
    assert "has been hidden" not in output and "sk-SECRET-77" not in output
    good = run_playbook(str(play), inventory, "-v", "-e", "vllm_model=/m", "-e", "vllm_api_key=sk-SECRET-77")
    assert good.returncode == 0 and "sk-SECRET-77" not in good.stdout + good.stderr


def test_the_cleanup_refuses_a_bad_variable_before_any_node_is_touched(fleet):
    """Issue 42 (9), the cleanup: gpu_teardown_outside_units=kil is refused on the controller, whole, naming every node."""
    inventory, reports = fleet
    run = run_playbook("gpu_cleanup.yml", inventory, "-e", "gpu_teardown_outside_units=kil", "-e", f"gpu_cleanup_report_dir={reports}")
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-2000:]
    assert "node1, node2: gpu_teardown role: value of gpu_teardown_outside_units must be one of: kill, report, fail, got: kil" in output
    assert "UNREACHABLE" not in output and "PLAY [Clean up the GPUs of every node]" not in output
