"""The engine command-line checker, the lab's node layout, and the switch playbook's own expressions."""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "sim"))
sys.path.insert(0, str(REPO / "tests" / "tools"))
import engine_cli  # noqa: E402
import lab  # noqa: E402
import run_molecule  # noqa: E402


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
    plays = yaml.safe_load((REPO / "playbooks" / "switch_engine.yml").read_text())
    naming = next(task for task in plays[0]["tasks"] if "switch_engine_run_id" in task.get("ansible.builtin.set_fact", {}))
    on_node = next(task for task in plays[1]["tasks"] if "__switch_engine_run_id" in task.get("ansible.builtin.set_fact", {}))
    expressions = [naming["ansible.builtin.set_fact"]["switch_engine_run_id"], on_node["ansible.builtin.set_fact"]["__switch_engine_run_id"]]
    tokens = [re.search(r"run_owner\((.*)\)\) }}$|run_owner\((.*)\) }}$", expression) for expression in expressions]
    templar = Templar(loader=DataLoader(), variables={"hostvars": {"localhost": {}}})
    for match in tokens:
        token = "{{ " + (match.group(1) or match.group(2)) + " }}"
        drawn = {templar.template(trust_as_template(token)) for _draw in range(200)}
        assert len(drawn) > 190, f"{token}: only {len(drawn)} distinct values in 200 draws"


def test_molecule_lanes_hold_every_scenario_once_longest_first_onto_the_lightest_lane():
    names = run_molecule.scenarios()
    assert {"switch_engine", "switch_faults", "teardown_units"} <= set(names)
    plan = run_molecule.plan_lanes(names, 2)
    assert sorted(name for lane in plan for name in lane) == sorted(names)

    def load(lane):
        return sum(run_molecule.EXPECTED_SECONDS.get(name, run_molecule.DEFAULT_SECONDS) for name in lane)

    # the two longest scenarios never share a lane; the lanes differ by less than the longest scenario
    assert {plan[0][0], plan[1][0]} == {"switch_faults", "switch_engine"}
    assert abs(load(plan[0]) - load(plan[1])) < max(run_molecule.EXPECTED_SECONDS.values())
    assert run_molecule.plan_lanes(["new_scenario"], 2) == [["new_scenario"]]
    assert run_molecule.plan_lanes(names, 1) == [sorted(names, key=lambda n: (-run_molecule.EXPECTED_SECONDS.get(n, 120), n))]
