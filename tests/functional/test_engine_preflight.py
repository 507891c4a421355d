"""engine_preflight and weights_prewarm as Ansible runs them: real files and modes, a real listening socket, a real
version command, the real nvidia-ml-py over the simulated NVML library, a check as another user."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import struct
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import run_module


def safetensors_bytes(tensor_bytes: int = 4096) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [tensor_bytes], "data_offsets": [0, tensor_bytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * tensor_bytes


def model_dir(root, weights=2, config=True):
    root.mkdir(parents=True)
    if config:
        (root / "config.json").write_text("{}")
    for index in range(weights):
        (root / f"model-{index:05d}.safetensors").write_bytes(safetensors_bytes())
    return root


def version_script(tmp_path, prints="0.33.0", code=0):
    script = tmp_path / "vllm"
    script.write_text(f"#!/bin/sh\necho 'INFO import noise'\necho {prints}\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def args(tmp_path, model, **extra):
    return {"engine": "vllm", "version_argv": [version_script(tmp_path), "--version"], "model": str(model), "gpus_needed": 4,
            "port": free_port(), "checks": ["executable", "model", "gpus", "port"], **extra}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_every_check_passes_on_a_node_ready_for_the_engine(tmp_path, nvml_env):
    result = run_module("engine_preflight", args(tmp_path, model_dir(tmp_path / "m"), version="0.33.0"), env=nvml_env)
    assert not result.failed, result["msg"] if result.failed else ""
    expected = [("executable", True), ("compiler", True), ("model", True), ("gpus", True), ("port", True)]
    assert [(c["name"], c["passed"]) for c in result["checks"]] == expected
    assert result["checks"][0]["detail"] == "vllm 0.33.0" and len(result["gpus"]) == 4 and result["changed"] is False
    assert result["checks"][1]["detail"].startswith("vllm 0.33.0 compiles kernels at run time with gcc (/")


def test_each_failure_is_named_and_the_module_fails(tmp_path, nvml_env):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        result = run_module("engine_preflight", args(tmp_path, tmp_path / "absent", version="0.34.0", gpus_needed=16, port=port,
                                                     draft_model=str(model_dir(tmp_path / "draft", weights=0))), env=nvml_env)
    finally:
        listener.close()
    assert result.failed
    assert result["failures"] == [
        f"{tmp_path}/vllm --version reports 0.33.0, the pinned version is 0.34.0",
        f"model {tmp_path}/absent does not exist",
        f"draft model {tmp_path}/draft has no weight files (*.safetensors, *.bin, *.pt, *.gguf)",
        "tensor x data parallel needs 16 GPU(s), 4 seen by NVML",
        result["failures"][-1],
    ]
    assert result["failures"][-1].startswith(f"port {port} is taken by pid {os.getpid()} (")  # this test's own listener
    assert result["failures"][-1].endswith(", not by the engine being replaced")
    assert result["msg"].startswith("preflight: ") and "does not exist" in result["msg"]


def test_the_model_is_read_as_the_engines_user(tmp_path, nvml_env, request):
    """A file the engine's user cannot read fails, though root (the module) can: the check runs as that user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to check as another user")
    hidden = run_module("engine_preflight", args(tmp_path, model_dir(tmp_path / "hidden"), user="nobody", checks=["model"]), env=nvml_env)
    assert hidden["failures"] == [f"model {tmp_path}/hidden cannot be read by nobody"], "pytest's base directory is root's only"
    shared = Path(tempfile.mkdtemp(prefix="gpufleet-preflight-"))
    request.addfinalizer(lambda: shutil.rmtree(shared))
    shared.chmod(0o755)
    model = model_dir(shared / "m")
    model.chmod(0o755)
    for path in model.iterdir():
        path.chmod(0o644)
    (model / "model-00001.safetensors").chmod(stat.S_IRUSR | stat.S_IWUSR)  # root only
    result = run_module("engine_preflight", args(tmp_path, model, user="nobody", checks=["model"]), env=nvml_env)
    assert result.failed and result["failures"] == [f"model {model}: nobody cannot read model-00001.safetensors"]
    as_root = run_module("engine_preflight", args(tmp_path, model, user="root", checks=["model"]), env=nvml_env)
    assert not as_root.failed
    # a user the engine role has not created yet (a plan before the first switch to it): the check is skipped, saying why
    missing_user = run_module("engine_preflight", args(tmp_path, model, user="no-such-user", checks=["model"]), env=nvml_env)
    assert not missing_user.failed and [(c["passed"], c["skipped"]) for c in missing_user["checks"]] == [(True, True)]
    assert "the user no-such-user does not exist yet (the engine role creates it" in missing_user["checks"][0]["detail"]


def test_check_mode_runs_the_same_read_only_checks(tmp_path, nvml_env):
    result = run_module("engine_preflight", args(tmp_path, tmp_path / "absent", checks=["model"]), check_mode=True, env=nvml_env)
    assert result.failed and result["failures"] == [f"model {tmp_path}/absent does not exist"]


def test_prewarm_reads_every_weight_byte_or_says_why_not(tmp_path):
    model = model_dir(tmp_path / "m", weights=3)
    read = run_module("weights_prewarm", {"paths": [str(model), "hub/name"], "margin_mib": 0})
    assert read["bytes"] == read["total_bytes"] == 3 * len(safetensors_bytes()) and read["files"] == 3 and read["finished"] and read["skipped_reason"] is None
    planned = run_module("weights_prewarm", {"paths": [str(model)], "margin_mib": 0}, check_mode=True)
    assert planned["bytes"] == 0 and planned["total_bytes"] == 3 * len(safetensors_bytes()) and planned["skipped_reason"] == "check mode: nothing read"
    too_big = run_module("weights_prewarm", {"paths": [str(model)], "margin_mib": 1 << 30})
    assert too_big["bytes"] == 0 and "do not fit" in too_big["skipped_reason"] and not too_big.failed
    missing = run_module("weights_prewarm", {"paths": [str(tmp_path / "absent")]})
    assert missing.failed and "is not a model directory" in missing["msg"]


def test_another_users_gpu_holder_fails_the_holders_check_and_an_escaped_worker_does_not(tmp_path, devices, processes, nvml_env):
    """An engine's worker left outside its unit (the engine's user, here daemon) is the engine's; a job of another user
    (nobody) stops the switch here, named by pid, user and command - unless the teardown may kill it."""
    _helper, (escaped,) = processes.holder("--open", devices.gpu(0), "--user", "daemon")
    _helper, (foreign,) = processes.holder("--open", devices.gpu(1), "--user", "nobody")
    holders_args = args(tmp_path, model_dir(tmp_path / "m"), checks=["holders"], units=["vllm.service"], owners=["daemon"],
                        device_paths=devices.globs)
    refused = run_module("engine_preflight", holders_args, env=nvml_env)
    assert refused.failed and [check["name"] for check in refused["checks"]] == ["holders"]
    detail = refused["checks"][0]["detail"]
    assert detail.startswith(f"1 process(es) of other users hold GPUs: pid {foreign} python of user nobody in ")
    assert f"the engines' own outside their units, killed by the teardown: pid {escaped} python of user daemon" in detail
    assert [h["pid"] for h in refused["holders"]["foreign"]] == [foreign] and [h["pid"] for h in refused["holders"]["escaped"]] == [escaped]
    assert refused["holders"]["foreign"][0]["user"] == "nobody"

    allowed = run_module("engine_preflight", dict(holders_args, outside_units="kill"), env=nvml_env)
    assert not allowed.failed and "killed by the teardown (outside_units: kill)" in allowed["checks"][0]["detail"]
    alone = run_module("engine_preflight", dict(holders_args, owners=["daemon", "nobody"]), env=nvml_env)
    assert not alone.failed and alone["holders"]["foreign"] == [] and len(alone["holders"]["escaped"]) == 2
    assert processes.started[0].poll() is None and processes.started[1].poll() is None, "the preflight signals nothing"

    # without CAP_SYS_PTRACE the same node cannot be read whole: the switch stops here, naming the capability once
    if shutil.which("setpriv"):
        blind = run_module("engine_preflight", dict(holders_args, outside_units="kill"), env=nvml_env,
                           prefix=("setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--"))
        detail = blind["checks"][0]["detail"]
        assert blind.failed and detail.startswith("the scan for GPU holders is incomplete: this module runs without CAP_SYS_PTRACE")
        assert detail.count("CAP_SYS_PTRACE") == 1 and "process(es) may hold the GPUs (pid " in detail


def test_an_incomplete_checkpoint_fails_the_model_check_before_anything_is_disrupted(tmp_path, nvml_env):
    """A shard the index names is missing, and another is cut short: both named (a download that stopped halfway)."""
    model = model_dir(tmp_path / "m", weights=3)
    names = sorted(path.name for path in model.glob("*.safetensors"))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"t{i}": name for i, name in enumerate(names)}}))
    (model / names[2]).unlink()
    with (model / names[1]).open("r+b") as shard:
        shard.truncate(1000)
    result = run_module("engine_preflight", args(tmp_path, model, checks=["model"]), env=nvml_env)
    assert result.failed
    detail = result["checks"][0]["detail"]
    assert detail.startswith(f"model {model} is incomplete: ")
    assert f"{names[2]}, named by model.safetensors.index.json, is missing" in detail and f"{names[1]} has 1000 bytes" in detail


def test_a_staged_hub_model_is_checked_where_it_is_staged_and_said_so(tmp_path, nvml_env):
    """Issue 42 (7): a hub model the switch stages was reported "fetched by the engine". With its staged directory
    the check says where it is and what was verified; a broken staged copy fails; one not staged yet passes, named."""
    staged = tmp_path / "models" / "lab--tiny-llama"
    checks = ["model"]
    absent = run_module("engine_preflight", args(tmp_path, "lab/tiny-llama", model_dir=str(staged), checks=checks), env=nvml_env)
    assert not absent.failed and absent["checks"][0]["detail"] == (
        f"model lab/tiny-llama: not staged yet - the stage step downloads it into {staged} and verifies it before the drain")
    model_dir(staged)
    verified = run_module("engine_preflight", args(tmp_path, "lab/tiny-llama", model_dir=str(staged), checks=checks), env=nvml_env)
    assert not verified.failed
    assert verified["checks"][0]["detail"] == f"model lab/tiny-llama staged at {staged}: 2 weight file(s), 0.00 GiB, readable by root"
    assert "fetched by the engine" not in verified["checks"][0]["detail"]
    (staged / "config.json").unlink()
    broken = run_module("engine_preflight", args(tmp_path, "lab/tiny-llama", model_dir=str(staged), checks=checks), env=nvml_env)
    assert broken.failed and broken["checks"][0]["detail"] == f"model lab/tiny-llama staged at {staged} has no config.json"
    unstaged = run_module("engine_preflight", args(tmp_path, "lab/tiny-llama", checks=checks), env=nvml_env)
    assert unstaged["checks"][0]["detail"] == "model lab/tiny-llama: a hub name, fetched by the engine when it starts (not staged, not checked here)"


def test_a_gguf_models_loader_is_checked_in_the_engines_own_python(tmp_path):
    """The probe runs in the interpreter the engine's entry point names (its #! line): this one has the gguf package but
    no vLLM, so the check fails naming vllm-gguf-plugin; one without gguf names gguf too (python -I with an empty path)."""
    pytest.importorskip("gguf")
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch import preflight_node

    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nprint('0.33.0')\n")
    script.chmod(0o755)
    probe = preflight_node.NodeProbe(load_nvml=None)
    assert probe.interpreter(str(script)) == sys.executable
    found, error = probe.gguf_loader(sys.executable, 60)
    assert error is None and found["gguf"] and not found["in_tree"]
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    found, error = probe.gguf_loader(str(bare), 60)
    assert error is None and not found["gguf"]
