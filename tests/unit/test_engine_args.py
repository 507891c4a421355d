"""Every command line the vllm and sglang roles can render, held against the real engines' parser specs."""

from __future__ import annotations

import itertools
import shlex
import sys

import pytest
from conftest import REPO

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engine_args as engine_args

sys.path.insert(0, str(REPO / "tests" / "sim"))
import engine_cli  # noqa: E402

SPECULATIVE = [{}, {"draft_model": "/models/EAGLE3-LLaMA3.3-70B"},
               {"draft_model": "/models/EAGLE3", "num_speculative_tokens": 5, "eagle_topk": 4, "num_draft_tokens": 8}]
QUANT = {"vllm": ["", "fp8", "awq"], "sglang": ["", "fp8", "awq"]}
KV = {"vllm": ["", "fp8", "auto"], "sglang": ["", "fp8_e4m3", "bf16"]}
EXTRA = {"vllm": ["--seed", "7"], "sglang": ["--random-seed", "7"]}  # each engine's own spelling


def configs(engine: str):
    """The role variables' space: each option off and on, in combination."""
    for spec, quant, kv, (tp, dp), ep, limits, key, extra in itertools.product(
            SPECULATIVE, QUANT[engine], KV[engine], [(1, 1), (8, 1), (4, 2)], [False, True],
            [{}, {"max_model_len": 32768, "memory_fraction": 0.9, "max_running_requests": 256}],
            [False, True], [[], EXTRA[engine]]):
        yield {"model": "/models/Llama-3.3-70B-Instruct", "served_model_name": "llama70b", "host": "127.0.0.1", "port": 8001,
               "tensor_parallel_size": tp, "data_parallel_size": dp, "expert_parallel": ep, "quantization": quant,
               "kv_cache_dtype": kv, "speculative": spec, "extra_args": extra, "shutdown_timeout": 60, "api_key": key, **limits}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_rendered_command_line_parses_with_the_real_options(engine):
    count = 0
    for config in configs(engine):
        argv = engine_args.engine_argv(config, engine)
        parsed = engine_cli.parse(engine, [arg.replace(engine_args.SGLANG_API_KEY_REFERENCE, "key") for arg in argv])
        count += 1
        if engine == "vllm":
            assert argv[0] == config["model"], "vLLM's model must come first (--api-key and --served-model-name are nargs='+')"
            assert parsed.model_tag == config["model"] and parsed.served_model_name == ["llama70b"]
            assert parsed.tensor_parallel_size == config["tensor_parallel_size"]
            assert parsed.api_key is None, "vLLM gets its key from VLLM_API_KEY, never the command line"
            if config["speculative"]:
                assert '"method":"eagle3"' in parsed.speculative_config
        else:
            assert parsed.model_path == config["model"] and parsed.tp_size == config["tensor_parallel_size"]
            assert parsed.enable_metrics, "the drain reads SGLang's metrics, which need --enable-metrics"
            assert (parsed.api_key == "key") == config["api_key"]
            if config["speculative"]:
                assert parsed.speculative_algorithm == "EAGLE3" and parsed.speculative_draft_model_path
    assert count == 3 * 3 * 3 * 3 * 2 * 2 * 2 * 2


@pytest.mark.parametrize(("config", "message"), [
    ({}, "model: the model path or name is required"),
    ({"model": "m", "tensor_parallel_size": 0}, "tensor_parallel_size: must be at least 1"),
    ({"model": "m", "tensor_parallel_size": "eight"}, "tensor_parallel_size: 'eight' is not a whole number"),
    ({"model": "m", "memory_fraction": 1.5}, "memory_fraction: must be in (0, 1]"),
    ({"model": "m", "extra_args": "--seed 7"}, "extra_args: give a list"),
    ({"model": "m", "speculative": {"num_speculative_tokens": 3}}, "speculative: give at least draft_model"),
    ({"model": "m", "speculative": {"draft_model": "d", "method": "medusa"}}, "only eagle3 is supported"),
])
def test_bad_role_variables_are_named(config, message):
    with pytest.raises(engine_args.EngineArgsError, match=None) as error:
        engine_args.engine_argv(config, "vllm")
    assert message in str(error.value)


def test_systemd_quoting_keeps_every_argument_whole():
    """What systemd will split back: each word one argument; $ and % never expanded, the key reference is."""
    argv = ["/usr/local/bin/vllm", "serve", "/models/a b", '--x={"a":1}', "100%", "$HOME", "back\\slash", engine_args.SGLANG_API_KEY_REFERENCE]
    quoted = engine_args.systemd_quote(argv)
    assert '"100%%"' in quoted and '"$$HOME"' in quoted and f'"{engine_args.SGLANG_API_KEY_REFERENCE}"' in quoted
    unescaped = quoted.replace("%%", "%").replace("$$", "$")
    assert shlex.split(unescaped)[:-1] == argv[:-1]
