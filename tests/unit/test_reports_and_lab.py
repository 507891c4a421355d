"""Controller-side report shaping, the engine command-line checker, and the lab's node layout."""

from __future__ import annotations

import sys

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from conftest import REPO

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _reports

sys.path.insert(0, str(REPO / "tests" / "sim"))
import engine_cli  # noqa: E402
import lab  # noqa: E402

PROCESS = {"pid": 42, "comm": "python3", "cmdline": ["python3", "-m", "sglang.launch_server", "--model-path", "/m"], "gpus": [0], "unit": "x"}


def test_teardown_table_lists_hosts_processes_and_failures():
    reports = {
        "node1": {"result": "ok", "check_mode": False,
                  "units": [_reports.unit_summary({"unit": "vllm.service", "changed": True, "state_before": {"ActiveState": "active"},
                                                   "state_after": {"ActiveState": "inactive"}, "killed": [PROCESS],
                                                   "triggers_stopped": ["vllm.socket"],
                                                   "warnings": ["KillMode=process: systemd leaves the unit's other processes running"]})],
                  "terminated": [_reports.process_summary(PROCESS)], "killed": [], "planned": [],
                  "protected": [_reports.process_summary(dict(PROCESS, pid=7, comm="nvidia-persiste", reason="protected name x"))],
                  "memory_before": [{"index": 0, "used_mib": 900}], "memory_after": [{"index": 0, "used_mib": 0}]},
        "node2": {"result": "failed", "failed_step": "Assert memory | Every selected GPU is free", "reason": "GPU 3 leaked"},
        "node3": None,
    }
    table = _reports.teardown_table(reports)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["host", "result", "units"]
    assert lines[2].split()[:6] == ["node1", "ok", "vllm.service", "1", "1", "1"]
    assert "0:900" in lines[2] and "0:0" in lines[2]
    assert lines[3].startswith("node2  failed") and lines[4].startswith("node3  unreached")
    assert "node2: FAILED at 'Assert memory | Every selected GPU is free': GPU 3 leaked" in table
    assert "node1: vllm.service: killed 42 python3 -m sglang.launch_server --model-path /m" in table
    assert "node1: vllm.service: triggers stopped first: vllm.socket" in table
    assert "node1: vllm.service: warning: KillMode=process: systemd leaves" in table
    assert "node1: protected 7 nvidia-persiste (protected name x)" in table


def test_check_mode_report_says_what_would_be_signalled():
    table = _reports.teardown_table({"n": {"result": "ok", "check_mode": True, "units": [], "planned": [_reports.process_summary(PROCESS)]}})
    assert "n: would signal 42 python3 -m sglang.launch_server" in table


@pytest.mark.parametrize(("engine", "argv"), [
    ("vllm", ["/models/llama", "--served-model-name", "llama", "-tp", "8", "--api-key=K", "--max_model_len", "32768"]),
    ("vllm", ["/m", "--speculative-config.method", "eagle3", "--speculative-config.num_speculative_tokens", "3"]),
    ("sglang", ["--model-path", "/m", "--tp", "8", "--speculative-algorithm", "EAGLE3", "--kv-cache-dtype", "fp8_e4m3"]),
])
def test_engine_cli_accepts_what_the_real_parsers_accept(engine, argv):
    engine_cli.parse(engine, argv)


@pytest.mark.parametrize(("engine", "argv", "message"), [
    ("vllm", ["/m", "--speculative-model", "d"], "unrecognized arguments"),
    ("vllm", ["/m", "--swap-space", "4"], "unrecognized arguments"),
    ("vllm", ["/m", "--device", "cuda"], "ambiguous option"),
    ("vllm", ["/m", "-tp"], "expected one argument"),
    ("sglang", ["--model-path", "/m", "--cuda-graph-max-bs", "8"], "ambiguous option"),
    ("sglang", ["--model-path", "/m", "--kv-cache-dtype", "fp8"], "invalid choice"),
    ("sglang", ["--model-path", "/m", "--tp-size", "eight"], "invalid int value"),
])
def test_engine_cli_rejects_what_the_real_parsers_reject(engine, argv, message):
    """The gotchas of the engines' reference notes: removed flags, ambiguous prefixes, wrong choices and arity."""
    with pytest.raises(engine_cli.EngineCliError, match=message):
        engine_cli.parse(engine, argv)


def test_vllm_api_key_swallows_a_model_placed_after_it():
    """`--api-key K MODEL` takes MODEL as a second key (nargs='+'): the model must come first."""
    parsed = engine_cli.parse("vllm", ["--api-key", "K", "/models/llama"])
    assert parsed.api_key == ["K", "/models/llama"] and parsed.model_tag is None


@pytest.mark.parametrize("gpus", [1, 2, 3, 8, 16])
def test_lab_minors_are_permutations_and_differ_on_every_second_node(gpus):
    for index in (1, 2, 3, 4):
        assert sorted(lab.node_minors(index, gpus)) == list(range(gpus))
    if gpus > 1:
        assert lab.node_minors(2, gpus) != list(range(gpus)) and lab.node_minors(1, gpus) == list(range(gpus))


def test_switch_run_ids_are_random_enough_to_tell_concurrent_runs_apart():
    """Two runs sharing a run id would share the node lease. Jinja binds `2**32 | random` as `2 ** (32 | random)`,
    32 possible values; the playbook's expressions must draw from the whole range."""
    text = (REPO / "playbooks" / "switch_engine.yml").read_text()
    plays = yaml.safe_load(text)
    naming = next(task for task in plays[0]["tasks"] if "ansible.builtin.set_fact" in task)
    run_id = naming["ansible.builtin.set_fact"]["switch_engine_run_id"]
    switching = next(task for task in plays[1]["tasks"] if "rescue" in task)
    limited = switching["block"][0]["vars"]["engine_switch_run_id"]
    templar = Templar(loader=DataLoader(), variables={"hostvars": {"localhost": {}}})
    for expression in (run_id.rsplit("-", 1)[1], limited):
        drawn = {templar.template(trust_as_template(expression)) for _draw in range(200)}
        assert len(drawn) > 190, f"{expression}: only {len(drawn)} distinct values in 200 draws"
