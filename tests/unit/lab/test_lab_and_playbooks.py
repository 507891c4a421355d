"""The engine command-line checker, the lab's node layout, and the switch playbook's own expressions."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

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
    naming = [task for play in plays for task in play["tasks"] if "run_owner" in str(task.get("ansible.builtin.set_fact", {}))]
    assert len(naming) == 1, "one run id per run, named once on the controller (with --limit too)"
    assert plays[0].get("run_once") is True and plays[0]["hosts"] == plays[1]["hosts"] + ":localhost", "named once, for the nodes of any --limit"
    expressions = [naming[0]["ansible.builtin.set_fact"]["switch_engine_run_id"]]
    tokens = [re.search(r"run_owner\((.*)\) }}$", expression) for expression in expressions]
    templar = Templar(loader=DataLoader(), variables={"hostvars": {"localhost": {}}})
    for match in tokens:
        token = "{{ " + match.group(1) + " }}"
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
    longest = sorted(names, key=lambda name: -run_molecule.EXPECTED_SECONDS.get(name, run_molecule.DEFAULT_SECONDS))[:2]
    assert {plan[0][0], plan[1][0]} == set(longest)
    assert abs(load(plan[0]) - load(plan[1])) < max(run_molecule.EXPECTED_SECONDS.values())
    assert run_molecule.plan_lanes(["new_scenario"], 2) == [["new_scenario"]]
    assert run_molecule.plan_lanes(names, 1) == [sorted(names, key=lambda n: (-run_molecule.EXPECTED_SECONDS.get(n, 120), n))]


def test_every_molecule_scenario_is_in_the_gate_or_the_drills_once():
    """make test runs the gate's scenarios, make test-all the drills too: a new scenario must be placed in one."""
    makefile = (REPO / "Makefile").read_text()
    tiers = {name: set(re.search(rf"^{name} :=(.*)$", makefile, re.M).group(1).split()) for name in ("GATE_SCENARIOS", "DRILL_SCENARIOS")}
    assert not tiers["GATE_SCENARIOS"] & tiers["DRILL_SCENARIOS"]
    assert tiers["GATE_SCENARIOS"] | tiers["DRILL_SCENARIOS"] == set(run_molecule.scenarios())
    assert {"teardown_units", "switch_engine"} <= tiers["GATE_SCENARIOS"]


def test_no_run_output_is_tracked():
    """A report, log or build product under git would be rewritten by the next run (and show as a change)."""
    import tree_state

    assert tree_state.tracked_run_outputs() == []


def test_the_tree_guard_sees_a_file_a_run_writes():
    """The guard that fails a test session or a Molecule run which wrote into the tree does see such a file."""
    import tree_state

    before = tree_state.status()
    stray = REPO / "molecule" / "switch_engine" / "reports" / "switch_engine.json"
    stray.parent.mkdir(exist_ok=True)
    try:
        stray.write_text("{}")
        assert tree_state.added_by_run(before) == ["?? molecule/switch_engine/reports/switch_engine.json"]
        assert tree_state.tracked_run_outputs() == []  # untracked: the guard above, not this one, catches it
    finally:
        stray.unlink()
        stray.parent.rmdir()
    assert tree_state.added_by_run(before) == []


def test_lab_model_files_are_valid_safetensors_read_in_full(tmp_path):
    """The lab's model directories are checkpoints the preflight accepts and the doubles read to the last byte."""
    import engine_double
    import model_files

    root = model_files.ensure(tmp_path, 8)
    model = root / model_files.MODEL
    shards = sorted(model.glob("*.safetensors"))
    assert (model / "config.json").exists() and len(shards) == 2 and (root / ".complete").exists()
    for shard in shards:
        data = shard.read_bytes()
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + length])
        end = max(tensor["data_offsets"][1] for name, tensor in header.items() if name != "__metadata__")
        assert 8 + length + end == len(data), "the header's offsets cover the file exactly"
    total = sum(path.stat().st_size for path in shards)
    assert engine_double.read_weights([str(model), "/no/such/model"])[0] == total
    assert model_files.ensure(tmp_path, 8) == root, "made once"


def test_traffic_tools_stay_on_loopback_and_read_the_lab_inventory(tmp_path):
    import traffic

    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[gpu_nodes]\nnode1 ansible_host=127.0.0.1 ansible_port=2221 gpufleet_lab_http_port=18001\n"
                         "node2 ansible_host=127.0.0.1 ansible_port=2222 gpufleet_lab_http_port=18002\n\n[gpu_nodes:vars]\n"
                         f"gpufleet_lab_dir={tmp_path}\n")
    assert traffic.lab_nodes(inventory) == (tmp_path, {"node1": 18001, "node2": 18002})
    with pytest.raises(SystemExit, match="loopback"):
        traffic.Load("http://10.0.0.5:8000", "m", 1, 1, None)
    stop = tmp_path / "stop"
    stop.touch()
    result = traffic.Load("http://127.0.0.1:9", "m", 100, 5, stop).run(2)
    assert result["sent"] == 0, "a stop file ends the load before it starts"
    bounded = traffic.Load("http://127.0.0.1:9", "m", 5, 5, None).run(2)  # nothing listens on port 9
    assert bounded["sent"] == 5 and bounded["failed"] == 5 and bounded["errors"] == {"ConnectionRefusedError": 5}


def test_setup_names_the_missing_packages_and_the_command_without_root():
    """`make setup` as a user without root installs nothing: it prints the exact command and stops. A package removed
    but not purged (dpkg still knows it, its files are gone) counts as missing: a newcomer's machine had podman so."""
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to run the script as another user")
    stubs = Path(tempfile.mkdtemp(prefix="gpufleet-os-setup-"))
    try:
        stubs.chmod(0o755)
        (stubs / "dpkg").write_text("#!/bin/sh\nexit 0\n")
        # every package installed but HAProxy, whose configuration files are all that is left of it
        (stubs / "dpkg-query").write_text('#!/bin/sh\nfor last; do :; done\n'
                                          '[ "$last" = haproxy ] && printf "deinstall ok config-files" || printf "install ok installed"\n')
        for stub in stubs.iterdir():
            stub.chmod(0o755)
        run = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "bash", str(REPO / "tests/tools/os_setup.sh")],
                             capture_output=True, text=True, env={"PATH": f"{stubs}:/usr/bin:/bin"}, check=False)
    finally:
        shutil.rmtree(stubs)
    assert run.returncode == 1
    assert "missing Debian packages: haproxy" in run.stderr and "run as root: apt-get update && apt-get install -y haproxy" in run.stderr


def test_model_files_made_once_when_labs_start_side_by_side(tmp_path):
    """Two labs starting at once (the Molecule lanes) both get the model directory; it is written once."""
    import subprocess

    script = REPO / "tests" / "sim" / "model_files.py"
    runs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), "--mib", "16"], stdout=subprocess.PIPE, text=True) for _copy in range(3)]
    outputs = [run.communicate()[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0] and set(outputs) == {str(tmp_path / "16m")}
    assert sorted(path.name for path in tmp_path.iterdir()) == [".lock", "16m"], "no partial directory left"


def test_the_vllm_double_counts_requests_beyond_max_num_seqs_as_waiting_as_the_real_engine_does():
    """The real vLLM (its CPU build, real_vllm) runs --max-num-seqs at once and reports the rest as waiting."""
    import engine_cli
    import engine_double

    settings = engine_double.Settings("vllm", engine_cli.parse("vllm", ["/m", "--max-num-seqs", "1"]))
    server = engine_double.Server(settings, {})
    server.running = 5
    lines = server.metrics().splitlines()
    assert any(line.startswith("vllm:num_requests_running{") and line.endswith(" 1") for line in lines)
    assert any(line.startswith("vllm:num_requests_waiting{") and line.endswith(" 4") for line in lines)
    unbounded = engine_double.Server(engine_double.Settings("vllm", engine_cli.parse("vllm", ["/m"])), {})
    unbounded.running = 5
    assert any(line.startswith("vllm:num_requests_running{") and line.endswith(" 5") for line in unbounded.metrics().splitlines())


def test_the_tiny_llama_is_a_valid_checkpoint_made_once(tmp_path):
    """What real vLLM loads in real_vllm: one safetensors file whose tensors are the Llama's, in float32."""
    import tiny_llama

    model = tiny_llama.ensure(tmp_path)
    data = (model / "model.safetensors").read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    shapes = {name: tensor["shape"] for name, tensor in header.items() if name != "__metadata__"}
    assert shapes == tiny_llama.tensor_shapes() and all(tensor["dtype"] == "F32" for name, tensor in header.items() if name != "__metadata__")
    assert 8 + length + max(t["data_offsets"][1] for n, t in header.items() if n != "__metadata__") == len(data)
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 260 and max(vocab.values()) < json.loads((model / "config.json").read_text())["vocab_size"]
    assert tiny_llama.ensure(tmp_path) == model and (model / ".complete").exists()


@pytest.mark.parametrize(("lab_name", "command"), [(None, "GPUFLEET_LAB=real make lab-down"), ("mine", "GPUFLEET_LAB=mine make lab-down")])
def test_the_real_demo_names_the_lab_it_used_when_it_says_how_to_remove_it(lab_name, command):
    """Issue 42 (10): `make demo-real` printed `GPUFLEET_LAB=real make lab-down` whatever lab the operator chose:
    following it could remove someone else's lab. It names the lab it used."""
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "GPUFLEET_LAB"} | ({"GPUFLEET_LAB": lab_name} if lab_name else {})
    code = "import sys; sys.path.insert(0, 'tests/sim/demo'); import run_real_demo; print(run_real_demo.closing_line())"
    printed = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    assert f"`{command}` removes the lab" in printed
    plain = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests/sim'); import lab; print(lab.down_command())"],
                           cwd=REPO, env={key: value for key, value in os.environ.items() if key != "GPUFLEET_LAB"},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert plain == "make lab-down", "the default lab is removed by the README's plain command"


def test_the_readme_is_short_and_gives_the_installed_collections_commands():
    """Issue 42 (13): the README's commands are what a user of the installed collection types (the playbooks by their
    FQCN), the checkout's paths named as the alternative; at most 170 lines, the detail in docs/."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 170
    commands = re.findall(r"(?m)^ansible-playbook -i inventory\.ini (\S+)", text)
    assert commands and all(name in ("gpufleet.serving.switch_engine", "gpufleet.serving.gpu_cleanup") for name in commands), commands
    assert "`playbooks/switch_engine.yml`" in text, "the developer's path form is named"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_doubles_park_and_wake_through_the_engines_routes_and_move_their_gpu_memory(engine, tmp_path, monkeypatch):
    """The standby routes answer as tests/sim/engines/standby-http.json says the real ones do; parked, every worker's
    simulated GPU memory drops to its context and completions are refused; woken, it is back and the double serves."""
    import socket
    import urllib.error
    import urllib.request

    import engine_cli
    import engine_double
    import nvml_sim

    spec = json.loads((REPO / "tests" / "sim" / "engines" / "standby-http.json").read_text())[engine]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    argv = (["/m", "--enable-sleep-mode", "--port", str(port)] if engine == "vllm"
            else ["--model-path", "/m", "--enable-memory-saver", "--enable-weights-cpu-backup", "--port", str(port)])
    server = engine_double.Server(engine_double.Settings(engine, engine_cli.parse(engine, argv)), {"park_seconds": 0, "wake_seconds": 0})
    (tmp_path / "alloc").mkdir()
    allocations = [nvml_sim.allocate(tmp_path, gpu, 70000, [os.getpid()]) for gpu in (0, 1)]
    server.allocations = [(path, 70000) for path in allocations]
    server.serve()

    def call(route: str):
        method, path = route.split(" ", 1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}" if method == "POST" else None, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as reply:
                body = reply.read().decode()
                return reply.status, json.loads(body) if body else ""
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read().decode() or "null")

    def mib() -> list[str]:
        return [word for path in allocations for word in path.read_text().split() if word.startswith("mib=")]

    park, wake = ((("POST /sleep?level=1", "POST /wake_up")) if engine == "vllm"
                  else ("POST /release_memory_occupation", "POST /resume_memory_occupation"))
    assert call(park) == (spec[park]["status"], spec[park]["body"])
    assert mib() == ["mib=600", "mib=600"], "parked: each worker keeps its context"
    assert server.backup is not None and call("POST /v1/completions")[0] == 503
    if engine == "vllm":
        assert call("GET /is_sleeping") == (200, {"is_sleeping": True})
    assert call(wake) == (spec[wake]["status"], spec[wake]["body"])
    assert mib() == ["mib=70000", "mib=70000"] and call("POST /v1/completions")[0] == 200
    if engine == "vllm":
        assert call("GET /is_sleeping") == (200, {"is_sleeping": False})
        monkeypatch.delenv("VLLM_SERVER_DEV_MODE")
        plain = engine_double.Settings(engine, engine_cli.parse(engine, argv))
        assert not plain.can_park, "the sleep routes exist only in development mode"


def test_the_doubles_answer_from_the_model_they_serve_and_their_faults_spoil_it(tmp_path):
    """Issue 53 (5): one model answers one prompt the same (tokens and logprobs) across starts; another model's bytes
    answer otherwise; the faults give '!' after a wake, garbage from the start, another model's tokens. Read by the
    collection's own answer check (its degenerate detector and comparison)."""
    import engine_cli
    import engine_double

    from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers

    for name, seed in (("a", b"\1"), ("b", b"\2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(seed * 4096)

    def answer(model: str, faults: dict, woken: bool = False) -> answers.Answer:
        server = engine_double.Server(engine_double.Settings("vllm", engine_cli.parse("vllm", [model])), faults)
        server.woken = woken
        status, body = server.complete({"prompt": answers.PROBES[0], "max_tokens": answers.PROBE_TOKENS, "temperature": 0, "logprobs": 1})
        assert status == 200
        return answers.Answer.from_completion(answers.PROBES[0], body)

    first, again = answer(str(tmp_path / "a"), {}), answer(str(tmp_path / "a"), {})
    assert first == again and len(first.tokens) == answers.PROBE_TOKENS and all(value < 0 for value in first.logprobs)
    assert answers.degenerate(first) is None and answers.compare([first.to_dict()], [again], 0.0) is None
    assert answers.compare([first.to_dict()], [answer(str(tmp_path / "b"), {})], 0.05).startswith("token ")
    assert answers.compare([first.to_dict()], [answer(str(tmp_path / "a"), {"answers": "other_model"})], 0.05).startswith("token ")
    assert answer(str(tmp_path / "a"), {"answers": "garbage_after_wake"}) == first, "not woken: right"
    assert "one character repeated" in answers.degenerate(answer(str(tmp_path / "a"), {"answers": "garbage_after_wake"}, woken=True))
    assert answers.degenerate(answer(str(tmp_path / "a"), {"answers": "garbage"})) is not None
    drifted = answer(str(tmp_path / "a"), {"logprob_drift": 0.2})
    assert drifted.tokens == first.tokens and "tolerance 0.05" in answers.compare([first.to_dict()], [drifted], 0.05)
