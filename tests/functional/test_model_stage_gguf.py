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
    from ansible_collections.gpufleet.serving.plugins.module_utils._staging import TOKENIZER_FILES

    dest = tmp_path / "models" / "acme--tiny-base--tokenizer"
    args = {"source": "acme/tiny-base", "files": TOKENIZER_FILES, "files_optional": True, "dest": str(dest), "endpoint": endpoint,
            "margin_mib": 0}
    staged = run_module("model_stage", args)
    assert not staged.failed, staged["msg"]
    assert sorted(line.split()[1] for line in log.read_text().splitlines()) == ["config.json", "tokenizer.json"]
    assert sorted(path.name for path in dest.iterdir() if path.name != ".cache") == ["config.json", "tokenizer.json"]
    again = run_module("model_stage", args)
    assert not again.failed and again["present"] and again["changed"] is False
