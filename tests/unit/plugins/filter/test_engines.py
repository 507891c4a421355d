"""Engine facts: every command line the vllm and sglang roles can render, held against the real engines' parser specs;
every refusal names the role variable; systemd escaping by each directive's rules; URLs from host and port."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
from conftest import COLLECTIONS, REPO

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines as engines
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _systemd_escape as escape

sys.path.insert(0, str(REPO / "tests" / "sim"))
import engine_cli  # noqa: E402

SPECULATIVE = [{}, {"draft_model": "/models/EAGLE3-LLaMA3.3-70B"}, {"draft_model": "/models/EAGLE3", "num_speculative_tokens": 5}]
SGLANG_TREE = {"draft_model": "/models/EAGLE3", "num_speculative_tokens": 5, "eagle_topk": 4, "num_draft_tokens": 8}
QUANT = {"vllm": ["", "fp8", "awq"], "sglang": ["", "fp8", "awq"]}
KV = {"vllm": ["", "fp8", "auto"], "sglang": ["", "fp8_e4m3", "bf16"]}
EXTRA = {"vllm": ["--seed", "7"], "sglang": ["--random-seed", "7"]}  # each engine's own spelling
# the role defaults, as roles/<engine>/vars/main.yml hands them over
BASE = {
    "vllm": {"unit": "vllm.service", "user": "vllm", "restart": "always", "ready_timeout": 2400, "port": 8000, "host": "127.0.0.1",
             "shutdown_timeout": 60, "executable": "/usr/local/bin/vllm", "install": False, "virtualenv": "/opt/vllm"},
    "sglang": {"unit": "sglang.service", "user": "sglang", "restart": "on-failure", "ready_timeout": 2400, "port": 30000,
               "host": "127.0.0.1", "shutdown_timeout": 60, "python": "/usr/bin/python3", "entry_point": "launch_server",
               "install": False, "virtualenv": "/opt/sglang"},
}


def config(engine: str, **overrides) -> dict:
    return {**BASE[engine], "model": "/models/Llama-3.3-70B-Instruct", "served_model_name": "llama70b", **overrides}


def configs(engine: str):
    """The role variables' space: each option off and on, in combination."""
    speculative = SPECULATIVE + ([SGLANG_TREE] if engine == "sglang" else [{"draft_model": "/d", "num_speculative_tokens": 2}])
    for spec, quant, kv, (tp, dp), ep, limits, key, extra in itertools.product(
            speculative, QUANT[engine], KV[engine], [(1, 1), (8, 1), (4, 2)], [False, True],
            [{}, {"max_model_len": 32768, "memory_fraction": 0.9, "max_running_requests": 256}],
            ["", "sk-key"], [[], EXTRA[engine]]):
        yield config(engine, port=8001, tensor_parallel_size=tp, data_parallel_size=dp, expert_parallel=ep, quantization=quant,
                     kv_cache_dtype=kv, speculative=spec, extra_args=extra, api_key=key, **limits)


def parse_rendered(engine: str, facts: dict):
    launcher = 2 if engine == "vllm" else 3
    return engine_cli.parse(engine, [arg.replace(engines.SGLANG_API_KEY_REFERENCE, "key") for arg in facts["argv"][launcher:]])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_rendered_command_line_parses_with_the_real_options(engine):
    count = 0
    for variables in configs(engine):
        facts = engines.engine_facts(variables, engine)
        parsed = parse_rendered(engine, facts)
        count += 1
        if engine == "vllm":
            assert facts["argv"][:3] == ["/usr/local/bin/vllm", "serve", variables["model"]], "vLLM's model comes first"
            assert parsed.served_model_name == ["llama70b"] and parsed.tensor_parallel_size == variables["tensor_parallel_size"]
            assert parsed.api_key is None, "vLLM gets its key from VLLM_API_KEY, never the command line"
            if variables["speculative"]:
                assert json.loads(parsed.speculative_config)["method"] == "eagle3"
        else:
            assert parsed.model_path == variables["model"] and parsed.tp_size == variables["tensor_parallel_size"]
            assert parsed.enable_metrics, "the drain reads SGLang's metrics, which need --enable-metrics"
            assert (parsed.api_key == "key") == bool(variables["api_key"])
            if variables["speculative"]:
                triple = (parsed.speculative_num_steps, parsed.speculative_eagle_topk, parsed.speculative_num_draft_tokens)
                assert None not in triple, "SGLang takes its three speculative values together"
    assert count == 4 * 3 * 3 * 3 * 2 * 2 * 2 * 2


@pytest.mark.parametrize(("spec", "triple"), [
    ({"draft_model": "D"}, (3, 1, 4)),
    ({"draft_model": "D", "num_speculative_tokens": 3}, (3, 1, 4)),
    ({"draft_model": "D", "num_speculative_tokens": 5}, (5, 1, 6)),
    ({"draft_model": "D", "num_speculative_tokens": 5, "eagle_topk": 4, "num_draft_tokens": 8}, (5, 4, 8)),
])
def test_sglang_speculative_from_a_partial_setting_is_a_consistent_triple(spec, triple):
    parsed = parse_rendered("sglang", engines.engine_facts(config("sglang", speculative=spec), "sglang"))
    assert parsed.speculative_algorithm == "EAGLE3" and parsed.speculative_draft_model_path == "D"
    assert (parsed.speculative_num_steps, parsed.speculative_eagle_topk, parsed.speculative_num_draft_tokens) == triple


def test_vllm_speculative_takes_the_same_shape():
    parsed = parse_rendered("vllm", engines.engine_facts(config("vllm", speculative={"draft_model": "D"}), "vllm"))
    assert json.loads(parsed.speculative_config) == {"method": "eagle3", "model": "D", "num_speculative_tokens": 3}


# Each refusal, for each engine, naming the role variable at fault.
REFUSALS = [
    ({"model": ""}, "{e}_model: is required"),
    ({"model": "/models/a\nb"}, "{e}_model: '/models/a\\nb' holds a line break or control character"),
    ({"model": "meta-llama/Llama 3"}, "{e}_model: 'meta-llama/Llama 3' is not an absolute path, a hub repository"),
    ({"tensor_parallel_size": 0}, "{e}_tensor_parallel_size: must be at least 1, got 0"),
    ({"tensor_parallel_size": "eight"}, "{e}_tensor_parallel_size: 'eight' is not a whole number"),
    ({"tensor_parallel_size": 2.5}, "{e}_tensor_parallel_size: 2.5 is not a whole number"),
    ({"data_parallel_size": -1}, "{e}_data_parallel_size: must be at least 1"),
    ({"memory_fraction": 1.5}, "{fraction}: must be in (0, 1], got 1.5"),
    ({"max_model_len": 0}, "{max_len}: must be at least 1"),
    ({"max_running_requests": "many"}, "{max_running}: 'many' is not a whole number"),
    ({"port": 0}, "{e}_port: give a port from 1 to 65535"),
    ({"port": 70000}, "{e}_port: give a port from 1 to 65535"),
    ({"extra_args": "--seed 7"}, "{e}_extra_args: give a list of separate arguments"),
    ({"extra_args": ["--seed 7"]}, "{e}_extra_args: '--seed 7' is one argument holding a space"),
    ({"environment": ["A=1"]}, "{e}_environment: give a mapping"),
    ({"environment": {"1BAD": "x"}}, "{e}_environment: '1BAD' is not a valid environment variable name"),
    ({"environment": {"A": "x\0y"}}, "{e}_environment: a NUL character cannot reach a process"),
    ({"speculative": {"num_speculative_tokens": 3}}, "{e}_speculative.draft_model: is required"),
    ({"speculative": {"draft_model": "d", "method": "medusa"}}, "{e}_speculative.method: only eagle3 is supported"),
    ({"speculative": {"draft_model": "d", "num_speculative_tokens": 0}}, "{e}_speculative.num_speculative_tokens: must be at least 1"),
    ({"speculative": {"draft_model": "d", "draft": "x"}}, "{e}_speculative: unknown key(s) draft"),
    ({"speculative": "d"}, "{e}_speculative: give a mapping"),
    ({"unit": "vllm"}, "{e}_unit: give a service unit name"),
    ({"shutdown_timeout": -1}, "{e}_shutdown_timeout: must be at least 0"),
    ({"ready_timeout": 0}, "{e}_ready_timeout: must be at least 1"),
    ({"api_key": {"k": "v"}}, "{e}_api_key: give a string, got a dict"),
    ({"install": True, "virtualenv": "venv"}, "{e}_virtualenv: give an absolute path"),
    ({"host": "0.0.0.0"}, "{e}_host: 0.0.0.0 is not a loopback address and {e}_api_key is empty"),
    ({"host": "10.0.0.5", "allow_unauthenticated": "no"}, "{e}_host: 10.0.0.5 is not a loopback address"),
    ({"host": "gpu-a01"}, "{e}_host: gpu-a01 is not a loopback address"),
    ({"sandbox": {"PrivateDevices": True}}, "{e}_sandbox: PrivateDevices= is refused: it hides /dev/nvidia*"),
    ({"sandbox": {"MemoryDenyWriteExecute": "yes"}}, "{e}_sandbox: MemoryDenyWriteExecute= is refused"),
    ({"sandbox": {"Protect Home": "no"}}, "{e}_sandbox: 'Protect Home' is not a systemd directive name"),
    ({"sandbox": {"ProtectHome": "no\nExecStartPre=/bin/sh"}}, "{e}_sandbox: ProtectHome: one line"),
    ({"sandbox": ["NoNewPrivileges=no"]}, "{e}_sandbox: give a mapping"),
    ({"protect_home": "maybe"}, "{e}_protect_home: give one of read-only, yes, tmpfs, no"),
    ({"read_write_paths": "/srv/cache"}, "{e}_read_write_paths: give a list of strings"),
    ({"read_write_paths": ["cache"]}, "{e}_read_write_paths: give absolute paths without spaces"),
]
ENGINE_REFUSALS = [
    ("vllm", {"tokenizer": "/models/tok\r"}, "vllm_tokenizer: '/models/tok\\r' holds a line break or control character"),
    ("vllm", {"speculative": {"draft_model": "d", "eagle_topk": 2}}, "vllm_speculative.eagle_topk: vLLM's EAGLE-3 drafts a chain"),
    ("vllm", {"expert_parallel": 4}, "vllm_expert_parallel: vLLM takes true or false"),
    ("vllm", {"executable": "vllm"}, "vllm_executable: give an absolute path"),
    ("sglang", {"speculative": {"draft_model": "d", "eagle_topk": 4}}, "sglang_speculative.num_draft_tokens: is required when eagle_topk"),
    ("sglang", {"speculative": {"draft_model": "d", "num_draft_tokens": 9}}, "with eagle_topk 1 it must be num_speculative_tokens + 1 = 4"),
    ("sglang", {"speculative": {"draft_model": "d", "eagle_topk": 2, "num_draft_tokens": 9}}, "must be between 2 and eagle_topk x"),
    ("sglang", {"expert_parallel": 0}, "sglang_expert_parallel: must be at least 1"),
    ("sglang", {"served_model_name": "llama:70b"}, "sglang_served_model_name: SGLang reads 'name:adapter'"),
    ("sglang", {"entry_point": "server"}, "sglang_entry_point: launch_server or serve"),
    ("sglang", {"python": "python3"}, "sglang_python: give an absolute path"),
]
NAMES = {"vllm": {"fraction": "vllm_gpu_memory_utilization", "max_len": "vllm_max_model_len", "max_running": "vllm_max_num_seqs"},
         "sglang": {"fraction": "sglang_mem_fraction_static", "max_len": "sglang_context_length", "max_running": "sglang_max_running_requests"}}


def all_refusals():
    for engine in ("vllm", "sglang"):
        for overrides, message in REFUSALS:
            yield engine, overrides, message.format(e=engine, **NAMES[engine])
    yield from ENGINE_REFUSALS


@pytest.mark.parametrize(("engine", "overrides", "message"), list(all_refusals()))
def test_each_bad_variable_is_refused_naming_it(engine, overrides, message):
    variables = config(engine, **overrides)
    with pytest.raises(engines.EngineArgsError) as error:
        facts = engines.engine_facts(variables, engine)
        if facts["configured"]:
            engines.engine_secrets(facts, variables.get("api_key", ""))
        else:
            raise engines.EngineArgsError(f"{engine}_model: is required")  # the main entry point's own refusal
    assert message in str(error.value)


def test_an_api_key_is_never_echoed_in_a_refusal():
    with pytest.raises(engines.EngineArgsError) as error:
        engines.engine_facts(config("vllm", api_key=["sk-secret-1"]), "vllm")
    assert "sk-secret-1" not in str(error.value)


@pytest.mark.parametrize(("host", "url"), [("127.0.0.1", "http://127.0.0.1:8000"), ("127.0.0.2", "http://127.0.0.2:8000"),
                                           ("0.0.0.0", "http://127.0.0.1:8000"), ("", "http://127.0.0.1:8000"),
                                           ("::", "http://[::1]:8000"), ("::1", "http://[::1]:8000"), ("gpu-a01", "http://gpu-a01:8000")])
def test_the_url_follows_host_and_port(host, url):
    assert engines.engine_facts(config("vllm", host=host, api_key="k"), "vllm")["url"] == url


@pytest.mark.parametrize("overrides", [{"host": "127.0.0.2"}, {"host": "::1"}, {"host": "localhost"}, {"host": ""},
                                       {"host": "0.0.0.0", "api_key": "k"}, {"host": "0.0.0.0", "allow_unauthenticated": True},
                                       {"host": "::", "allow_unauthenticated": "true"}, {"host": "0.0.0.0", "model": ""}])
def test_loopback_a_key_or_an_explicit_allowance_lets_an_engine_listen(overrides):
    """Only a non-loopback bind without a key is refused; an engine without a model renders nothing, so binds nothing."""
    assert engines.engine_facts(config("sglang", **overrides), "sglang")["port"] == 30000


def test_the_sandbox_is_on_by_default_and_loosened_directive_by_directive():
    default = engines.engine_facts(config("vllm"), "vllm")
    lines = default["sandbox_lines"]
    assert {"NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=strict", "ProtectHome=read-only", "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes", "ProtectControlGroups=yes", "RestrictSUIDSGID=yes", "LockPersonality=yes",
            "StateDirectory=vllm", "CacheDirectory=vllm", "CapabilityBoundingSet="} <= set(lines)
    assert not [line for line in lines if line.startswith(("PrivateDevices", "MemoryDenyWriteExecute", "ReadWritePaths"))]
    assert default["dedicated_user"] and default["state_directory"] == "/var/lib/vllm"
    assert default["environment_lines"][:2] == ['"HOME=/var/lib/vllm"', '"XDG_CACHE_HOME=/var/cache/vllm"']
    loose = engines.engine_facts(config("vllm", unit="vllm-b.service", protect_home="no", read_write_paths=["/srv/hf", "/run/x"],
                                        sandbox={"RestrictAddressFamilies": "", "ProtectProc": None, "NoNewPrivileges": False,
                                                 "PrivateDevices": "no", "SystemCallFilter": "@system-service"}), "vllm")["sandbox_lines"]
    assert "ProtectHome=no" in loose and "NoNewPrivileges=no" in loose and "SystemCallFilter=@system-service" in loose
    assert "PrivateDevices=no" in loose and not [line for line in loose if line.startswith(("RestrictAddressFamilies", "ProtectProc"))]
    assert "ReadWritePaths=-/srv/hf -/run/x" in loose and "StateDirectory=vllm-b" in loose


def test_unauthenticated_binds_are_found_per_host_before_any_node_is_touched():
    settings = {"gpu-a": {"vllm": {"model": "/m", "host": "0.0.0.0", "api_key": ""}, "sglang": {"model": "/m", "host": "0.0.0.0", "api_key": "k"}},
                "gpu-b": {"vllm": {"model": "/m", "host": "10.1.2.3", "allow_unauthenticated": True}, "sglang": {"model": "", "host": "0.0.0.0"}},
                "gpu-c": {"vllm": {"model": "/m"}, "sglang": {"model": "/m", "host": "::1"}}}
    refusals = engines.unauthenticated_binds(settings)
    assert len(refusals) == 1 and refusals[0].startswith("gpu-a: vllm_host is 0.0.0.0, not loopback, and vllm_api_key is empty")


def test_facts_say_where_everything_is():
    facts = engines.engine_secrets(engines.engine_facts(config("sglang", unit="sglang-a.service", port=30001, api_key="k",
                                                               shutdown_timeout=20, install=True), "sglang"), "k")
    assert facts["secrets_path"] == "/etc/gpufleet/sglang-a.secrets" and facts["timeout_stop_sec"] == 50
    assert facts["url"] == "http://127.0.0.1:30001" and facts["served_model_name"] == "llama70b"
    assert facts["executable"] == "/opt/sglang/bin/python" and facts["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert facts["secrets_lines"] == ['SGLANG_API_KEY="k"'] and facts["api_key_set"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_staged_hub_model_is_read_from_its_directory_offline_under_its_hub_name(engine):
    """Issue 27: the unit reads the staged copy, never the hub (HF_HUB_OFFLINE=1), and clients keep the hub name."""
    staged = engines.engine_facts(config(engine, model="meta-llama/Llama-3.3-70B-Instruct", served_model_name="",
                                         model_dir="/var/lib/gpufleet-models/meta-llama--Llama-3.3-70B-Instruct"), engine)
    parsed = vars(parse_rendered(engine, staged))
    assert parsed["model_tag" if engine == "vllm" else "model_path"] == "/var/lib/gpufleet-models/meta-llama--Llama-3.3-70B-Instruct"
    assert parsed["served_model_name"] in ("meta-llama/Llama-3.3-70B-Instruct", ["meta-llama/Llama-3.3-70B-Instruct"])
    assert '"HF_HUB_OFFLINE=1"' in staged["environment_lines"]
    assert staged["model"] == "meta-llama/Llama-3.3-70B-Instruct" and staged["model_path"] == staged["model_dir"]
    assert staged["served_model_name"] == "meta-llama/Llama-3.3-70B-Instruct"
    unstaged = engines.engine_facts(config(engine, model="meta-llama/Llama-3.3-70B-Instruct"), engine)
    assert unstaged["model_dir"] is None and unstaged["model_path"] == "meta-llama/Llama-3.3-70B-Instruct"
    assert not [line for line in unstaged["environment_lines"] if "HF_HUB_OFFLINE" in line]
    with pytest.raises(engines.EngineArgsError, match=f"{engine}_model_dir: give the absolute directory"):
        engines.engine_facts(config(engine, model_dir="models/x"), engine)
    # the EAGLE-3 draft given as a hub name, staged beside it: the unit reads both directories
    drafted = engines.engine_facts(config(engine, speculative={"draft_model": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"},
                                          draft_model_dir="/var/lib/gpufleet-models/yuhuili--EAGLE3-LLaMA3.3-Instruct-70B"), engine)
    assert drafted["draft_model"] == "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"
    assert drafted["draft_model_path"] == drafted["draft_model_dir"] == "/var/lib/gpufleet-models/yuhuili--EAGLE3-LLaMA3.3-Instruct-70B"
    parsed = vars(parse_rendered(engine, drafted))
    draft_in_argv = (json.loads(parsed["speculative_config"])["model"] if engine == "vllm" else parsed["speculative_draft_model_path"])
    assert draft_in_argv == drafted["draft_model_dir"] and '"HF_HUB_OFFLINE=1"' in drafted["environment_lines"]


def test_facts_carry_what_the_preflight_checks():
    vllm = engines.engine_facts(config("vllm", tensor_parallel_size=4, data_parallel_size=2, environment={"CUDA_VISIBLE_DEVICES": "0,1"},
                                       speculative={"draft_model": "/models/EAGLE3"}), "vllm")
    assert vllm["version_argv"] == ["/usr/local/bin/vllm", "--version"] and vllm["gpus_needed"] == 8
    assert vllm["visible_devices"] == "0,1" and vllm["draft_model"] == "/models/EAGLE3"
    assert vllm["install"] is False and vllm["version"] is None and vllm["install_dir"] is None, "only an install pins a version"
    pinned = engines.engine_facts(config("sglang", install=True, version="0.5.23"), "sglang")
    assert pinned["version_argv"] == ["/opt/sglang/bin/python", "-c", "import sglang; print(sglang.__version__)"]
    assert pinned["version"] == "0.5.23" and pinned["install_dir"] == "/opt/sglang" and pinned["gpus_needed"] == 1
    serve = engines.engine_facts(config("sglang", entry_point="serve", python="/usr/bin/python3"), "sglang")
    assert serve["version_argv"][0] == "/usr/bin/python3" and serve["argv"][0] == "/usr/bin/sglang"


def test_an_engine_without_a_model_still_says_where_its_unit_and_port_are():
    facts = engines.engine_facts(config("vllm", model=""), "vllm")
    assert not facts["configured"] and facts["unit"] == "vllm.service" and facts["url"] == "http://127.0.0.1:8000"
    assert "argv" not in facts


# systemd escaping: what each directive makes of the text (the lab proves it on real systemd: molecule/engine_units).
MATRIX = ["plain", "two words", 'a "double" quote', "it's", "back\\slash", "trailing\\", "100%", "%n", "$HOME", "${HOME}", "$$",
          ";", "a;b", "ü€😀", "tab\there", "new\nline", ""]


def systemd_unquote(word: str) -> str:
    """Undo one quoted word the way systemd's extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) does."""
    assert word.startswith('"') and word.endswith('"'), word
    body, out, index = word[1:-1], [], 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            follower = body[index + 1]
            if follower == "x":
                out.append(chr(int(body[index + 2:index + 4], 16)))
                index += 4
                continue
            out.append(follower)
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


@pytest.mark.parametrize("value", MATRIX)
def test_exec_words_come_back_whole(value):
    word = escape.exec_word(value)
    if value == ";":
        assert word == "\\;"
        return
    assert systemd_unquote(word).replace("%%", "%").replace("$$", "$") == value


@pytest.mark.parametrize("value", MATRIX)
def test_environment_values_keep_their_dollars(value):
    assignment = escape.environment_assignment("X", value)
    assert systemd_unquote(assignment).replace("%%", "%") == f"X={value}"
    assert "$$" not in assignment.replace(value, "") or "$$" in value, "systemd does not collapse $$ in Environment="


def test_environment_file_escapes_exactly_what_systemd_unescapes():
    assert escape.environment_file_line("K", 'a\\b"c`d$e\'f g') == 'K="a\\\\b\\"c\\`d\\$e\'f g"'


def test_only_the_roles_own_key_reference_is_left_for_systemd_to_expand():
    """Found on real systemd: a user's argument `${HOME}` reached the engine as /root when every whole-word reference
    was left unescaped. Only the word after the role's own --api-key is a reference."""
    facts = engines.engine_facts(config("sglang", api_key="k", extra_args=["--api-key", "${SGLANG_API_KEY}", "--chat-template", "${HOME}"]),
                                 "sglang")
    words = facts["exec_start"].split(" ")
    assert words.count('"${SGLANG_API_KEY}"') == 1 and words.count('"$${SGLANG_API_KEY}"') == 1 and '"$${HOME}"' in words
    assert escape.exec_word("${HOME}") == '"$${HOME}"'
    with pytest.raises(escape.SystemdEscapeError):
        escape.exec_word("$HOME x", expand=True)


# Through Ansible 2.19's templating the refusal reaches the user, not "CapturedExceptionMarker": the cases found lost
# (TP 0, memory fraction 1.5, extra args as one string) and one of each other kind, in one run of the role per engine.
THROUGH_ANSIBLE = [REFUSALS[i] for i in (1, 5, 10, 13, 16)]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_roles_refusals_reach_the_user_through_ansible(engine, tmp_path):
    cases = THROUGH_ANSIBLE
    inventory = {"all": {"hosts": {f"case{index}": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                                    **{f"{engine}_model": "/m"},
                                                    **{engines.variable(engine, key): value for key, value in overrides.items()}}
                                   for index, (overrides, _message) in enumerate(cases)}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n    - block:\n        - ansible.builtin.include_role:\n"
        f"            name: gpufleet.serving.{engine}\n            tasks_from: render\n"
        "      rescue:\n        - ansible.builtin.copy:\n            content: '{{ ansible_failed_result.msg }}'\n"
        f"            dest: '{tmp_path}/{{{{ inventory_hostname }}}}.msg'\n            mode: '0644'\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_FORKS="10")
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for index, (_overrides, message) in enumerate(cases):
        expected = message.format(e=engine, **NAMES[engine])
        written = (tmp_path / f"case{index}.msg").read_text()
        assert expected in written and "CapturedExceptionMarker" not in written, f"case{index}: {written!r}"


@pytest.mark.parametrize(("variables", "expected"), [
    ({"vllm_tensor_parallel_size": "eight"}, "vllm role: argument 'vllm_tensor_parallel_size' is of type str and we were unable to convert to int"),
    ({"vllm_restart": "sometimes"}, "vllm role: value of vllm_restart must be one of: always, on-failure, on-abnormal, no, got: sometimes"),
    ({"vllm_port": "http"}, "vllm role: argument 'vllm_port' is of type str and we were unable to convert to int"),
])
def test_a_bad_engine_variable_is_one_short_line_naming_it(variables, expected):
    """Ansible's own role-argument check fails with the whole argument spec in its result (5 kB on one line)."""
    from ansible_collections.gpufleet.serving.plugins.filter.arguments import role_argument_errors
    errors = role_argument_errors("vllm", {**variables, "unrelated": object()}, "facts")
    assert len(errors) == 1 and errors[0].startswith(expected) and len(errors[0]) < 300, errors


def test_variables_in_their_documented_forms_pass():
    from ansible_collections.gpufleet.serving.plugins.filter.arguments import role_argument_errors
    assert role_argument_errors("sglang", {"sglang_tensor_parallel_size": "8", "sglang_speculative": {"draft_model": "d"}}, "facts") == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_started_to_park_renders_its_park_flags_parsed_by_the_real_options(engine):
    facts = engines.engine_facts(config(engine, parkable=True), engine)
    parsed = parse_rendered(engine, facts)
    if engine == "vllm":
        assert parsed.enable_sleep_mode and 'VLLM_SERVER_DEV_MODE=1' in " ".join(facts["environment_lines"])
    else:
        assert parsed.enable_memory_saver and parsed.enable_weights_cpu_backup, "without the CPU backup a release discards the weights"
    assert facts["parkable"]
    plain = engines.engine_facts(config(engine), engine)
    assert not plain["parkable"] and "VLLM_SERVER_DEV_MODE" not in " ".join(plain["environment_lines"])
    assert not {"--enable-sleep-mode", "--enable-memory-saver"} & set(plain["argv"])


def test_a_vllm_started_to_park_pins_its_host_copy_in_threads_unless_the_operator_says_otherwise():
    def pinning(**overrides):
        lines = engines.engine_facts(config("vllm", parkable=True, **overrides), "vllm")["environment_lines"]
        return [line.strip('"') for line in lines if "PYTORCH_CUDA_ALLOC_CONF" in line]  # systemd's quoted assignments

    assert pinning(park_pin_threads=16) == ["PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:16"]
    assert pinning(park_pin_threads=0) == pinning(park_pin_threads="") == [], "0 keeps PyTorch's default pinning"
    # the operator's own setting is written after the role's: systemd keeps the last assignment
    assert pinning(park_pin_threads=8, environment={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})[-1] == (
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    for threads in (12, 256, -1):
        with pytest.raises(engines.EngineArgsError, match="^vllm_sleep_pin_threads: "):
            engines.engine_facts(config("vllm", parkable=True, park_pin_threads=threads), "vllm")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in " ".join(engines.engine_facts(config("vllm", park_pin_threads=16), "vllm")["environment_lines"]), (
        "an engine that never parks pins nothing at park time")


def test_a_parkable_engine_never_opens_the_park_routes_beyond_loopback():
    # vLLM's API key guards /v1 only: its sleep routes would be open whatever the key
    with pytest.raises(engines.EngineArgsError, match="^vllm_sleep_mode: vLLM's sleep routes are not guarded by its API key and vllm_host 0.0.0.0"):
        engines.engine_facts(config("vllm", parkable=True, host="0.0.0.0", api_key="sk-key"), "vllm")
    with pytest.raises(engines.EngineArgsError, match="^sglang_memory_saver: sglang_host 0.0.0.0 is not a loopback address and sglang_api_key"):
        engines.engine_facts(config("sglang", parkable=True, host="0.0.0.0", allow_unauthenticated=True), "sglang")
    assert engines.engine_facts(config("sglang", parkable=True, host="0.0.0.0", api_key="sk-key"), "sglang")["parkable"]
    with pytest.raises(engines.EngineArgsError, match="^vllm_sleep_mode: give true or false, got 'sometimes'"):
        engines.engine_facts(config("vllm", parkable="sometimes"), "vllm")


def test_one_quant_of_a_hub_repository_is_served_from_the_file_it_was_merged_into():
    """vllm_model: org/name:QUANT (vLLM's own form): staged, the unit gets <dir>/model.gguf under the hub name; not
    staged, vLLM gets the name as given; a name that is none of the forms is refused naming the variable, whole."""
    staged = engines.engine_facts(config("vllm", model="unsloth/GLM-5-GGUF:UD-Q4_K_XL", served_model_name="",
                                         model_dir="/var/lib/gpufleet-models/unsloth--GLM-5-GGUF--UD-Q4_K_XL"), "vllm")
    assert staged["model_path"] == "/var/lib/gpufleet-models/unsloth--GLM-5-GGUF--UD-Q4_K_XL/model.gguf"
    assert staged["model_quant"] == "UD-Q4_K_XL"
    argv = staged["argv"]
    assert argv[2] == staged["model_path"] and argv[argv.index("--served-model-name") + 1] == "unsloth/GLM-5-GGUF:UD-Q4_K_XL"
    direct = engines.engine_facts(config("vllm", model="unsloth/Qwen3-0.6B-GGUF:Q4_K_M"), "vllm")
    assert direct["argv"][2] == "unsloth/Qwen3-0.6B-GGUF:Q4_K_M" and direct["model_path"] == "unsloth/Qwen3-0.6B-GGUF:Q4_K_M"
    for bad in ("unsloth/GLM-5-GGUF:UD Q4", "org:name:Q4", "unsloth/GLM-5-GGUF:"):
        with pytest.raises(engines.EngineArgsError, match=r"vllm_model: .* is not an absolute path, a hub repository \(org/name\) or one quant"):
            engines.engine_facts(config("vllm", model=bad), "vllm")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_model_path_with_spaces_and_parentheses_is_a_path_given_whole(engine):
    """An absolute path is a path: "/models/My Models/Llama 3.3 70B (fp8)" (and a tokenizer beside it) is one word of
    the command line, parsed by the engine's real options, and one quoted word of the unit's ExecStart=."""
    model, tokenizer = "/models/My Models/Llama 3.3 70B (fp8)", "/models/My Tokenizers/Llama 3.3 (base)"
    facts = engines.engine_facts(config(engine, model=model, tokenizer=tokenizer), engine)
    assert facts["model_path"] == model
    parsed = parse_rendered(engine, facts)
    assert vars(parsed)["model_tag" if engine == "vllm" else "model_path"] == model
    assert f'"{model}"' in facts["exec_start"]
    if engine == "vllm":
        assert parsed.tokenizer == tokenizer and f'"{tokenizer}"' in facts["exec_start"]


def test_a_gguf_is_served_with_its_base_models_tokenizer_and_config_staged_apart():
    """vllm_tokenizer: a hub name staged by the switch (tokenizer and config only) is given as --tokenizer and, for a GGUF,
    --hf-config-path (vLLM's GGUF docs); the unit stays offline; the rendered line parses with vLLM 0.33.0's own options."""

    facts = engines.engine_facts(config("vllm", model="unsloth/GLM-5-GGUF:UD-Q4_K_XL", model_dir="/m/unsloth--GLM-5-GGUF--UD-Q4_K_XL",
                                        tokenizer="zai-org/GLM-5", tokenizer_dir="/m/zai-org--GLM-5--tokenizer"), "vllm")
    argv = facts["argv"]
    assert argv[argv.index("--tokenizer") + 1] == "/m/zai-org--GLM-5--tokenizer" == argv[argv.index("--hf-config-path") + 1]
    assert facts["tokenizer"] == "zai-org/GLM-5" and facts["tokenizer_dir"] == "/m/zai-org--GLM-5--tokenizer"
    assert any(line.startswith("HF_HUB_OFFLINE=1") or "HF_HUB_OFFLINE=1" in line for line in facts["environment_lines"])
    parsed = engine_cli.parse("vllm", argv[2:])
    assert parsed.tokenizer == "/m/zai-org--GLM-5--tokenizer" and parsed.hf_config_path == "/m/zai-org--GLM-5--tokenizer"
    plain = engines.engine_facts(config("vllm", tokenizer="/models/tok"), "vllm")["argv"]
    assert plain[plain.index("--tokenizer") + 1] == "/models/tok" and "--hf-config-path" not in plain, "not a GGUF: its own config"
    with pytest.raises(engines.EngineArgsError, match="vllm_tokenizer: 'org/x:Q4' is not an absolute path or a hub repository"):
        engines.engine_facts(config("vllm", tokenizer="org/x:Q4"), "vllm")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_cleanup_reads_an_engines_unit_and_user_as_its_facts_have_them_without_rendering_the_rest(engine):
    owner = engines.engine_owner(config(engine, user="root"), engine)
    facts = engines.engine_facts(config(engine, user="root"), engine)
    assert owner == {key: facts[key] for key in ("engine", "unit", "user", "dedicated_user")}
    assert engines.engine_owner(config(engine), engine)["dedicated_user"]
    # the same checks for these two; the rest (a port out of range) is the facts' to refuse
    with pytest.raises(engines.EngineArgsError, match=f"{engine}_unit: give a service unit name"):
        engines.engine_owner(config(engine, unit="x.socket"), engine)
    assert engines.engine_owner(config(engine, port=99999), engine)["unit"] == f"{engine}.service"
