"""model_stage's merge of a split GGUF (issue 27): the parts written by llama.cpp's own GGUF library (gguf-py, as its
converter splits a model), merged by the module run as Ansible runs it, and the merged file read back by that library:
the same metadata but the split keys, every tensor with its data. A missing part, a second run and check mode too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_module

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

TENSORS = {f"blk.{index}.attn_q.weight": np.arange(17 * (index + 1), dtype=np.float32) * (index + 1) for index in range(5)}


@pytest.fixture
def split_gguf(tmp_path) -> Path:
    """tiny-00001-of-00003.gguf ... 00003: two tensors a part, the model's metadata in the first (a tokenizer array too)."""
    writer = gguf.GGUFWriter(str(tmp_path / "tiny.gguf"), "llama", split_max_tensors=2)
    writer.add_name("tiny")
    writer.add_context_length(4096)
    writer.add_token_list(["<s>", "hello", "world"])
    for name, data in TENSORS.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"tiny-0000{n}-of-00003.gguf" for n in (1, 2, 3)]
    return tmp_path


def merge_args(source: Path, **extra) -> dict:
    return {"source": str(source), "merge_gguf": True, "margin_mib": 0, **extra}


def test_a_split_gguf_is_merged_into_one_file_that_llama_cpps_reader_reads_whole(split_gguf):
    plan = run_module("model_stage", merge_args(split_gguf), check_mode=True)
    assert plan["changed"] and plan["merged"]["parts"] == 3 and not (split_gguf / "tiny.gguf").exists()

    merged = run_module("model_stage", merge_args(split_gguf / "tiny-00002-of-00003.gguf"))
    assert merged["changed"] and merged["merged"]["path"] == str(split_gguf / "tiny.gguf")
    assert (split_gguf / "tiny.gguf").stat().st_size == merged["merged"]["bytes"] and not (split_gguf / "tiny.gguf.partial").exists()
    reader = gguf.GGUFReader(str(split_gguf / "tiny.gguf"))
    keys = [name for name in reader.fields if not name.startswith("GGUF.")]
    assert keys == ["general.architecture", "general.name", "llama.context_length", "tokenizer.ggml.tokens"], "no split.* key left"
    assert {tensor.name: list(tensor.data) for tensor in reader.tensors} == {name: list(data) for name, data in TENSORS.items()}
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert [bytes(tokens.parts[index]).decode() for index in tokens.data] == ["<s>", "hello", "world"]

    again = run_module("model_stage", merge_args(split_gguf))
    assert not again["changed"] and again["merged"]["bytes"] == merged["merged"]["bytes"]


def test_a_split_gguf_missing_a_part_is_named_and_nothing_is_merged(split_gguf):
    (split_gguf / "tiny-00002-of-00003.gguf").unlink()
    refused = run_module("model_stage", merge_args(split_gguf))
    assert refused.failed and "part(s) 00002 of 00003 missing" in refused["msg"]
    assert not (split_gguf / "tiny.gguf").exists()


def test_a_part_cut_short_is_refused(split_gguf):
    part = split_gguf / "tiny-00003-of-00003.gguf"
    part.write_bytes(part.read_bytes()[:40])
    refused = run_module("model_stage", merge_args(split_gguf))
    assert refused.failed and "tiny-00003-of-00003.gguf" in refused["msg"] and not (split_gguf / "tiny.gguf").exists()


# --- one quant of a hub repository of many, merged for vLLM (issue 52) -------------------------------------------------
ENDPOINT = Path(__file__).resolve().parents[1] / "sim" / "hf_endpoint.py"


def write_gguf(path: Path, tensors: dict, split_max_tensors: int = 0) -> None:
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    writer.add_name("tiny")
    writer.add_context_length(4096)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def quant_hub(tmp_path):
    """acme/Tiny-GGUF as unsloth lays a repository out: a split Q4_K_M in its own folder (3 parts), a single-file Q8_0,
    a README; behind the lab's hub endpoint, whose log says which files were fetched."""
    import subprocess
    import sys

    repository = tmp_path / "hub" / "acme" / "Tiny-GGUF"
    (repository / "Q4_K_M").mkdir(parents=True)
    write_gguf(repository / "Q4_K_M" / "Tiny-Q4_K_M.gguf", TENSORS, split_max_tensors=2)
    write_gguf(repository / "Tiny-Q8_0.gguf", TENSORS)
    (repository / "README.md").write_text("tiny\n")
    base = tmp_path / "hub" / "acme" / "tiny-base"
    base.mkdir(parents=True)
    (base / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (base / "tokenizer.json").write_text("{}")
    (base / "model.safetensors").write_bytes(b"\0" * 4096)
    log = tmp_path / "hub.log"
    server = subprocess.Popen([sys.executable, str(ENDPOINT), "--root", str(tmp_path / "hub"), "--log", str(log)], stdout=subprocess.PIPE, text=True)
    endpoint = f"http://127.0.0.1:{server.stdout.readline().split()[1]}"
    yield repository, endpoint, log
    server.kill()
    server.wait()


def test_one_quant_is_fetched_alone_merged_verified_and_served_from_one_file(tmp_path, quant_hub):
    """Only the quant's three parts are listed, counted for room (the parts plus the merged file), fetched (the hub's log)
    and merged into <dest>/model.gguf, which llama.cpp's reader reads whole; the parts are gone; a rerun fetches nothing."""
    pytest.importorskip("huggingface_hub")
    repository, endpoint, log = quant_hub
    dest = tmp_path / "models" / "acme--Tiny-GGUF--Q4_K_M"
    args = {"source": "acme/Tiny-GGUF", "quant": "Q4_K_M", "merge_gguf": True, "dest": str(dest), "endpoint": endpoint, "margin_mib": 0}
    parts = sorted(str(path.relative_to(repository)) for path in (repository / "Q4_K_M").iterdir())
    part_bytes = sum((repository / name).stat().st_size for name in parts)
    plan = run_module("model_stage", args, check_mode=True)
    assert not plan.failed, plan["msg"]
    assert [entry["name"] for entry in plan["fetch"]] == parts and plan["bytes"] == part_bytes
    assert plan["room"]["merge_bytes"] == part_bytes and plan["room"]["needed_bytes"] == 2 * part_bytes
    assert plan["gguf"] == {"file": str(dest / "model.gguf"), "parts": 3, "merge": True} and not dest.exists()

    staged = run_module("model_stage", args)
    assert not staged.failed, staged["msg"]
    assert sorted(line.split()[1] for line in log.read_text().splitlines()) == parts, "only the quant's parts were fetched"
    assert staged["gguf"]["merged"] and staged["gguf"]["bytes"] == (dest / "model.gguf").stat().st_size
    reader = gguf.GGUFReader(str(dest / "model.gguf"))
    assert {tensor.name: list(tensor.data) for tensor in reader.tensors} == {name: list(data) for name, data in TENSORS.items()}
    assert not any(name.startswith("split.") for name in reader.fields)
    assert sorted(path.name for path in dest.iterdir() if path.name != ".cache") == [".gguf-model.json", "model.gguf"], "the parts went"
    assert not Path(f"{dest}.partial").exists()

    again = run_module("model_stage", args)
    assert not again.failed and again["changed"] is False and again["present"]
    assert len(log.read_text().splitlines()) == len(parts), "a rerun fetches nothing"


def test_a_single_file_quant_is_served_as_it_is_and_a_wrong_quant_is_refused_naming_the_quants(tmp_path, quant_hub):
    pytest.importorskip("huggingface_hub")
    repository, endpoint, log = quant_hub
    dest = tmp_path / "models" / "q8"
    args = {"source": "acme/Tiny-GGUF", "quant": "Q8_0", "merge_gguf": True, "dest": str(dest), "endpoint": endpoint, "margin_mib": 0}
    staged = run_module("model_stage", args)
    assert not staged.failed, staged["msg"]
    assert (dest / "model.gguf").read_bytes() == (repository / "Tiny-Q8_0.gguf").read_bytes() and not staged["gguf"]["merged"]
    assert log.read_text().split() == ["acme/Tiny-GGUF", "Tiny-Q8_0.gguf"]
    wrong = run_module("model_stage", dict(args, quant="IQ2_XS", dest=str(tmp_path / "models" / "x")), check_mode=True)
    assert wrong.failed and "no GGUF file of the quant 'IQ2_XS'; its GGUF files: Q4_K_M/Tiny-Q4_K_M-00001-of-00003.gguf" in wrong["msg"]
    assert "Tiny-Q8_0.gguf" in wrong["msg"]


def test_room_for_the_parts_and_the_merge_is_checked_before_the_first_byte(tmp_path, quant_hub):
    pytest.importorskip("huggingface_hub")
    _repository, endpoint, log = quant_hub
    dest = tmp_path / "models" / "q4"
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    refused = run_module("model_stage", {"source": "acme/Tiny-GGUF", "quant": "Q4_K_M", "merge_gguf": True, "dest": str(dest),
                                         "endpoint": endpoint, "margin_mib": free // (1 << 20) + 1024})
    assert refused.failed and refused["room"]["ok"] is False and refused["room"]["merge_bytes"] > 0
    assert "nothing was written" in refused["msg"] and not log.exists() and not dest.exists()


def test_a_tokenizer_is_staged_without_its_models_weights(tmp_path, quant_hub):
    """The base model's tokenizer and config for a GGUF: only those files fetched (never the weights), verified by their
    sizes; a rerun finds them complete."""
    pytest.importorskip("huggingface_hub")
    _repository, endpoint, log = quant_hub
    from ansible_collections.gpufleet.serving.plugins.module_utils._models.staging import TOKENIZER_FILES

    dest = tmp_path / "models" / "acme--tiny-base--tokenizer"
    args = {"source": "acme/tiny-base", "files": TOKENIZER_FILES, "files_optional": True, "dest": str(dest), "endpoint": endpoint,
            "margin_mib": 0}
    staged = run_module("model_stage", args)
    assert not staged.failed, staged["msg"]
    assert sorted(line.split()[1] for line in log.read_text().splitlines()) == ["config.json", "tokenizer.json"]
    assert sorted(path.name for path in dest.iterdir() if path.name != ".cache") == ["config.json", "tokenizer.json"]
    again = run_module("model_stage", args)
    assert not again.failed and again["present"] and again["changed"] is False


# --- the model it replaces: room made only after the previous engine's stop (issue 52, item 5) ------------------------
def previous_model(root: Path, apparent_gib: int = 64) -> Path:
    """The previous engine's staged model: a sparse shard whose length counts for room as the module counts it (the
    model's bytes) though it takes no disk, so that 'only removing it makes room' holds however full the disk is."""
    directory = root / "lab--previous"
    directory.mkdir(parents=True)
    with open(directory / "model.safetensors", "wb") as shard:
        shard.truncate(apparent_gib << 30)
    return directory


def test_a_model_that_fits_only_in_place_of_the_previous_one_is_deferred_then_fetched_after_the_stop(tmp_path, quant_hub):
    """Never: refused with the way through in the message. after_stop: nothing removed or fetched, the figures and an
    estimate at the rate the last download under the root measured. now: in check mode the same, nothing touched; for
    real the previous model removed, then this one fetched and merged."""
    pytest.importorskip("huggingface_hub")
    _repository, endpoint, log = quant_hub
    root = tmp_path / "models"
    previous = previous_model(root)
    # a margin 8 GiB over what is free (other jobs write beside this one): only the previous model's 64 GiB make room
    free_mib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize // (1 << 20)
    args = {"source": "acme/Tiny-GGUF", "quant": "Q4_K_M", "merge_gguf": True, "dest": str(root / "acme--Tiny-GGUF--Q4_K_M"),
            "endpoint": endpoint, "models_root": str(root), "keep": [str(previous)], "replaceable": str(previous),
            "margin_mib": free_mib + 8192}

    refused = run_module("model_stage", args)
    assert refused.failed and "not enough room" in refused["msg"]
    assert f"removing the model it replaces, {previous} (64.00 GiB)" in refused["msg"] and "switch_engine_replace_model" in refused["msg"]
    assert previous.exists() and not log.exists()

    deferred = run_module("model_stage", dict(args, replace="after_stop"))
    assert not deferred.failed, deferred["msg"]
    assert deferred["deferred"] and deferred["changed"] is False and deferred["replace"]["removed"] is False
    assert deferred["replace"]["path"] == str(previous) and deferred["room"]["replace_bytes"] == 64 << 30
    assert deferred["replace"]["estimate_s"] is None, "no download measured under this root yet"
    assert previous.exists() and not log.exists()

    # a download measured under the root (the other quant, with room): the estimate is taken from its rate
    measured = run_module("model_stage", dict(args, quant="Q8_0", dest=str(root / "acme--Tiny-GGUF--Q8_0"), margin_mib=0, replaceable=None))
    assert not measured.failed and (root / ".gpufleet-rates.json").is_file()
    estimated = run_module("model_stage", dict(args, replace="after_stop"), check_mode=True)
    assert estimated["deferred"] and estimated["replace"]["estimate_s"] is not None and "at the last measured rate" in estimated["replace"]["message"]

    planned = run_module("model_stage", dict(args, replace="now"), check_mode=True)
    assert not planned.failed and planned["changed"] and planned["replace"]["removed"] is False and previous.exists()

    replaced = run_module("model_stage", dict(args, replace="now"))
    assert not replaced.failed, replaced["msg"]
    assert replaced["replace"]["removed"] and not previous.exists()
    assert replaced["gguf"]["merged"] and (root / "acme--Tiny-GGUF--Q4_K_M" / "model.gguf").is_file()


def test_only_a_model_staged_under_the_models_root_can_be_replaced(tmp_path, quant_hub):
    """A model given as a path elsewhere could not be staged again for a rollback: never removed."""
    pytest.importorskip("huggingface_hub")
    _repository, endpoint, log = quant_hub
    elsewhere = previous_model(tmp_path / "operator")
    free_mib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize // (1 << 20)
    refused = run_module("model_stage", {"source": "acme/Tiny-GGUF", "quant": "Q8_0", "dest": str(tmp_path / "models" / "q8"),
                                         "endpoint": endpoint, "models_root": str(tmp_path / "models"), "replaceable": str(elsewhere),
                                         "replace": "now", "margin_mib": free_mib + 8192})
    assert refused.failed and "is not a model staged directly under" in refused["msg"]
    assert elsewhere.exists() and not log.exists()


def test_a_merge_says_how_far_it_got(split_gguf, tmp_path, monkeypatch):
    """The merge writes its bytes and rate where the switch's wait reads them (step: merge), as a download does."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._models import stage_node

    monkeypatch.setattr(stage_node, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(stage_node, "MERGE_CHUNK", 64)
    progress = tmp_path / "model.progress"
    parts = sorted(str(path) for path in split_gguf.glob("tiny-0000*-of-00003.gguf"))
    merged = stage_node.merge_parts(parts, str(split_gguf / "tiny.gguf"), "", "tiny", str(progress))
    shown = __import__("json").loads(progress.read_text())
    assert shown["step"] == "merge" and shown["bytes_total"] == merged["bytes"] and 0 < shown["bytes_done"] <= merged["bytes"]
