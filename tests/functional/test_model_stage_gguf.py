"""model_stage's merge of a split GGUF (issue 27): the parts written by llama.cpp's own GGUF library (gguf-py, as its
converter splits a model), merged by the module run as Ansible runs it, and the merged file read back by that library:
the same metadata but the split keys, every tensor with its data. A missing part, a second run and check mode too."""

from __future__ import annotations

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
