"""model_stage as Ansible runs it: the real huggingface_hub client downloading through a hub-compatible endpoint on
127.0.0.1 (tests/sim/hf_endpoint.py) into real directories - check mode, the download, a rerun, an interrupted
download resumed, a model too large for the disk, the prune opt-in, and local checkpoints verified."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_module, start_module

pytest.importorskip("huggingface_hub")
ENDPOINT = REPO / "tests" / "sim" / "hf_endpoint.py"
MIB = 1 << 20


def safetensors_file(path: Path, tensor_bytes: int) -> None:
    header = json.dumps({"w": {"dtype": "U8", "shape": [tensor_bytes], "data_offsets": [0, tensor_bytes]}}).encode()
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        out.write(os.urandom(tensor_bytes))


@pytest.fixture
def hub(tmp_path):
    """A repository acme/tiny (config, tokenizer, two safetensors shards with their index, 6 MiB) behind the endpoint."""
    repository = tmp_path / "hub" / "acme" / "tiny"
    repository.mkdir(parents=True)
    (repository / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (repository / "tokenizer.json").write_text("{}")
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for shard in shards:
        safetensors_file(repository / shard, 3 * MIB)
    (repository / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    servers = []

    def start(rate_mib: float = 0) -> str:
        server = subprocess.Popen([sys.executable, str(ENDPOINT), "--root", str(tmp_path / "hub"), "--rate-mib", str(rate_mib)],
                                  stdout=subprocess.PIPE, text=True)
        servers.append(server)
        return f"http://127.0.0.1:{server.stdout.readline().split()[1]}"

    yield repository, start
    for server in servers:
        server.kill()
        server.wait()


def stage_args(endpoint: str, dest: Path, **extra) -> dict:
    return {"source": "acme/tiny", "dest": str(dest), "endpoint": endpoint, "margin_mib": 0, **extra}


def test_check_mode_says_what_would_be_fetched_then_the_download_is_complete_and_a_rerun_fetches_nothing(tmp_path, hub):
    repository, start = hub
    endpoint, dest = start(), tmp_path / "models" / "tiny"
    plan = run_module("model_stage", stage_args(endpoint, dest), check_mode=True)
    total = sum(path.stat().st_size for path in repository.iterdir())
    assert plan["changed"] and plan["bytes"] == total and len(plan["fetch"]) == 5 and not dest.exists()
    assert plan["room"]["ok"] and plan["room"]["needed_bytes"] == total
    # pytest's own directories are root's alone: the engine's user could not read a model there, and is not given one
    refused = run_module("model_stage", stage_args(endpoint, dest, owner="daemon"))
    assert refused.failed and "daemon could not read the model" in refused["msg"] and "nothing was fetched" in refused["msg"]
    assert not dest.exists() and not Path(f"{dest}.partial").exists()
    opened = {directory: directory.stat().st_mode for directory in [tmp_path, *tmp_path.parents] if not directory.stat().st_mode & 0o001}
    for directory, mode in opened.items():
        directory.chmod(mode | 0o005)
    try:
        staged = run_module("model_stage", stage_args(endpoint, dest, owner="daemon"))
        again = run_module("model_stage", stage_args(endpoint, dest, owner="daemon"))
    finally:
        for directory, mode in opened.items():
            directory.chmod(mode)
    assert staged["changed"] and staged["bytes"] == total and not staged["present"] and staged["rate_mib_s"] > 0
    for path in repository.iterdir():
        assert (dest / path.name).read_bytes() == path.read_bytes()
        assert (dest / path.name).stat().st_uid == 1  # daemon
    assert not Path(f"{dest}.partial").exists()
    assert not again["changed"] and again["present"] and again["bytes"] == 0


def test_an_interrupted_download_is_not_a_model_and_a_plain_rerun_resumes_it(tmp_path, hub):
    repository, start = hub
    dest = tmp_path / "models" / "tiny"
    slow = start(rate_mib=2)  # 6 MiB at 2 MiB/s: the 1 s timeout cuts it
    cut = run_module("model_stage", stage_args(slow, dest, timeout=1))
    assert cut.failed and "not downloaded within timeout 1s" in cut["msg"] and "a rerun resumes" in cut["msg"]
    partial = Path(f"{dest}.partial")
    assert not dest.exists() and partial.is_dir()
    finished = {path.name for path in partial.iterdir() if path.is_file()}
    assert finished and "model-00002-of-00002.safetensors" not in finished, "cut halfway: some files done, not all"
    resumed = run_module("model_stage", stage_args(start(), dest))
    assert resumed["changed"] and not finished & {entry["name"] for entry in resumed["fetch"]}, "what was finished is not fetched again"
    assert resumed["bytes"] < sum(path.stat().st_size for path in repository.iterdir())
    # a file cut halfway is resumed, not fetched again: what this run fetched and what was there make the files it finished
    assert resumed["bytes"] + resumed["resumed_bytes"] == sum(entry["bytes"] for entry in resumed["fetch"])
    assert (dest / "model-00002-of-00002.safetensors").read_bytes() == (repository / "model-00002-of-00002.safetensors").read_bytes()


def test_a_model_too_large_for_the_disk_fails_with_the_figures_and_writes_nothing(tmp_path, hub):
    _repository, start = hub
    dest = tmp_path / "models" / "tiny"
    free_mib = shutil.disk_usage(tmp_path).free // MIB
    refused = run_module("model_stage", stage_args(start(), dest, margin_mib=free_mib))
    assert refused.failed and "not enough room" in refused["msg"] and "nothing was written" in refused["msg"]
    assert not refused["room"]["ok"] and not dest.exists() and not Path(f"{dest}.partial").exists()


def test_prune_removes_only_an_unused_model_and_only_with_the_opt_in(tmp_path, hub):
    _repository, start = hub
    endpoint, models = start(), tmp_path / "models"
    unused, in_use = models / "old-unused", models / "llama-in-use"
    for directory in (unused, in_use):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"\0" * 64 * MIB)
    # leave room for everything but about 32 MiB: only removing one 64 MiB model makes room
    margin = shutil.disk_usage(tmp_path).free // MIB - 6 - 32 + 40
    args = stage_args(endpoint, models / "tiny", margin_mib=margin, models_root=str(models), keep=[str(in_use)])
    refused = run_module("model_stage", args)
    assert refused.failed and "1 unused model director(y/ies) under the models root hold" in refused["msg"] and unused.exists()
    plan = run_module("model_stage", dict(args, prune=True), check_mode=True)
    assert [entry["path"] for entry in plan["removed"]] == [str(unused)] and unused.exists()
    pruned = run_module("model_stage", dict(args, prune=True))
    assert pruned["changed"] and [entry["path"] for entry in pruned["removed"]] == [str(unused)]
    assert not unused.exists() and in_use.exists() and (models / "tiny" / "config.json").exists()


def test_a_local_checkpoint_missing_a_shard_or_cut_short_is_named(tmp_path, hub):
    repository, _start = hub
    local = tmp_path / "local"
    shutil.copytree(repository, local)
    assert run_module("model_stage", {"source": str(local)})["present"]
    shard = local / "model-00002-of-00002.safetensors"
    with shard.open("r+b") as cut:
        cut.truncate(shard.stat().st_size - 100)
    short = run_module("model_stage", {"source": str(local)})
    assert short.failed and "model-00002-of-00002.safetensors has" in short["msg"] and "cut short" in short["msg"]
    shard.unlink()
    missing = run_module("model_stage", {"source": str(local)})
    assert missing.failed and "named by model.safetensors.index.json, is missing" in missing["msg"]


def test_a_download_writes_its_progress_beside_its_destination_while_it_runs(tmp_path, hub):
    """Issue 42 (6): while the download runs, <dest>.progress holds the bytes on the node of the total and the rate
    (the switch's wait prints them); it is gone once the model is in place."""
    repository, start = hub
    # huggingface_hub writes a file 10 MB at a time: a 24 MiB file at 8 MiB/s shows on the node while it comes
    (repository / "tokenizer.model").write_bytes(os.urandom(24 * MIB))
    dest = tmp_path / "models" / "tiny"
    total = sum(path.stat().st_size for path in repository.iterdir())
    progress = Path(f"{dest}.progress")
    module = start_module("model_stage", stage_args(start(rate_mib=8), dest))
    seen = []
    try:
        deadline = time.monotonic() + 30
        while module.poll() is None and time.monotonic() < deadline:
            if progress.exists():
                seen.append(json.loads(progress.read_text()))
            time.sleep(0.3)
    finally:
        out, _err = module.communicate(timeout=60)
    assert json.loads(out)["changed"] and dest.is_dir() and not progress.exists()
    assert seen and all(reading["bytes_total"] == total for reading in seen)
    assert any(0 < reading["bytes_done"] < total and (reading["rate_mib_s"] or 0) > 0 for reading in seen), seen


def test_the_lab_hub_holds_each_file_after_the_mib_its_hold_file_says_then_sends_the_rest(tmp_path, hub):
    """The Molecule case of an interrupted download relies on it: halfway on any machine, not when its pace allows."""
    import threading
    import urllib.request

    repository, _start = hub
    hold = tmp_path / "hold"
    hold.write_text("1\n")
    server = subprocess.Popen([sys.executable, str(ENDPOINT), "--root", str(tmp_path / "hub"), "--hold", str(hold)], stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().split()[1]
        received = bytearray()

        def fetch():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/acme/tiny/resolve/main/model-00001-of-00002.safetensors", timeout=30) as body:
                while chunk := body.read(64 * 1024):
                    received.extend(chunk)

        reader = threading.Thread(target=fetch)
        reader.start()
        deadline = time.monotonic() + 10
        while len(received) < MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # held: nothing more comes while the file exists
        assert MIB <= len(received) < 3 * MIB
        hold.unlink()
        reader.join(30)
        assert bytes(received) == (repository / "model-00001-of-00002.safetensors").read_bytes()
    finally:
        server.kill()
        server.wait()
