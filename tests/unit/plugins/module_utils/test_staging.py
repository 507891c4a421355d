"""model_stage's decisions: is a checkpoint complete (index, safetensors lengths, split GGUF), what to fetch, room,
what may be removed - from listings built in memory, with real safetensors headers."""

from __future__ import annotations

import json
import struct

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._models import staging
from ansible_collections.gpufleet.serving.plugins.module_utils._models.staging import (
    Listing,
    checkpoint_problems,
    parse_source,
    plan_fetch,
    plan_room,
    prune_candidates,
    safetensors_size,
)

GIB = 2**30


def safetensors_bytes(tensor_bytes: int) -> bytes:
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [tensor_bytes // 4], "data_offsets": [0, tensor_bytes]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * tensor_bytes


def listing(contents: dict[str, bytes], sizes: dict[str, int] | None = None) -> Listing:
    """A directory of these files (sizes may override the content's length: a file cut short or padded)."""
    return Listing({name: (sizes or {}).get(name, len(data)) for name, data in contents.items()},
                   lambda name, count: contents[name][:count])


def sharded(shards: int = 3) -> dict[str, bytes]:
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    files = {name: safetensors_bytes(64 * (i + 1)) for i, name in enumerate(names)}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {f"layer.{i}": name for i, name in enumerate(names)}}).encode()
    files["config.json"] = b"{}"
    return files


def test_a_complete_sharded_checkpoint_has_no_problem():
    assert checkpoint_problems(listing(sharded())) == []


def test_a_shard_the_index_names_is_missing():
    files = sharded()
    del files["model-00002-of-00003.safetensors"]
    assert checkpoint_problems(listing(files)) == ["model-00002-of-00003.safetensors, named by model.safetensors.index.json, is missing"]


def test_a_short_safetensors_file_is_found_by_its_own_header():
    """A download cut short: the header says how long the file must be."""
    files = sharded()
    name = "model-00003-of-00003.safetensors"
    full = len(files[name])
    problems = checkpoint_problems(listing(files, sizes={name: full - 10}))
    assert problems == [f"{name} has {full - 10} bytes, its header says {full} (cut short or padded)"]


def test_garbage_weights_are_not_a_checkpoint():
    files = {"config.json": b"{}", "model.safetensors": b"\xff" * 64}
    assert checkpoint_problems(listing(files)) == ["model.safetensors is not a safetensors file (its header length is garbage)"]


def test_split_gguf_parts_are_counted():
    files = {f"Llama-405B-Q4_K_M-{i:05d}-of-00010.gguf": b"GGUF" for i in (1, 2, 3, 5, 6, 7, 8, 9, 10)}
    assert checkpoint_problems(listing(files)) == ["split GGUF Llama-405B-Q4_K_M: part(s) 00004 of 00010 missing"]
    files["Llama-405B-Q4_K_M-00004-of-00010.gguf"] = b"GGUF"
    assert checkpoint_problems(listing(files)) == []


def test_a_directory_without_config_or_weights_says_both():
    assert checkpoint_problems(listing({"README.md": b"hi"})) == ["no config.json", "no weight files (*.safetensors, *.bin, *.pt, *.gguf)"]


def test_sizes_the_source_gives_are_checked_exactly():
    files = sharded(1)
    files["tokenizer.json"] = b"{}"
    assert checkpoint_problems(listing(files), {"tokenizer.json": 3, "generation_config.json": 10}) == [
        "generation_config.json is missing", "tokenizer.json has 2 bytes, the source has 3"]


def test_safetensors_size_reads_the_header():
    data = safetensors_bytes(400)
    assert safetensors_size(data) == len(data)
    assert safetensors_size(data[:5]) is None


@pytest.mark.parametrize(("source", "kind"), [("meta-llama/Llama-3.3-70B-Instruct", "hub"), ("/models/llama", "path")])
def test_sources(source, kind):
    assert parse_source(source) == kind


@pytest.mark.parametrize("source", ["llama", "org/name/extra", "../x", "org/..", "/models/../etc", "", "org/na me"])
def test_bad_sources_are_refused_naming_the_forms(source):
    with pytest.raises(InvalidInput) as error:
        parse_source(source)
    assert error.value.msg.startswith("source:")


def test_only_what_is_not_already_here_is_fetched():
    source = [("config.json", 10), ("model-1.safetensors", 5 * GIB), ("model-2.safetensors", 5 * GIB)]
    assert plan_fetch(source, {"config.json": 10, "model-1.safetensors": 2 * GIB}) == source[1:]


def test_room_counts_the_margin_and_prunes_only_with_the_opt_in():
    fetch = [("model.safetensors", 400 * GIB)]
    candidates = [{"path": "/models/old-a", "bytes": 300 * GIB}, {"path": "/models/old-b", "bytes": 200 * GIB}]
    refused = plan_room(fetch, 150 * GIB, 10 * GIB, candidates, prune=False)
    assert not refused.room and refused.remove == []
    assert refused.message == ("not enough room: 400.00 GiB to fetch + 10.00 GiB margin, 150.00 GiB free; 2 unused model "
                               "director(y/ies) under the models root hold 500.00 GiB (removed only with prune)")
    pruned = plan_room(fetch, 150 * GIB, 10 * GIB, candidates, prune=True)
    assert pruned.room and [c["path"] for c in pruned.remove] == ["/models/old-a"]
    too_big = plan_room([("model.safetensors", 600 * GIB)], 10 * GIB, 10 * GIB, candidates, prune=True)
    assert not too_big.room and too_big.remove == [], "nothing is removed when even that leaves too little room"
    assert plan_room([], 0, 10 * GIB, [], prune=False).room, "nothing to fetch needs no room"


def test_prune_never_offers_a_kept_model_or_anything_outside_the_root():
    directories = [{"path": "/models/llama-70b", "bytes": 1, "used": 30}, {"path": "/models/old", "bytes": 1, "used": 20},
                   {"path": "/models/older", "bytes": 1, "used": 10}, {"path": "/models/nested/deep", "bytes": 1},
                   {"path": "/srv/elsewhere", "bytes": 1}, {"path": "/models/eagle", "bytes": 1}]
    keep = ["/models/llama-70b", "/models/eagle/", "/models/nested/deep"]
    assert [d["path"] for d in prune_candidates(directories, keep, "/models/")] == ["/models/older", "/models/old"]


def test_a_directory_the_engines_user_cannot_pass_through_is_named():
    """A model staged where its engine cannot read it would fail the engine's start after the drain: refused first."""
    root_only = ("/var/lib/gpufleet", 0o40700, 0, 0)
    open_dirs = [("/var", 0o40755, 0, 0), ("/var/lib", 0o40755, 0, 0)]
    assert staging.blocked_parent(open_dirs + [root_only], uid=998, gids={998}) == "/var/lib/gpufleet (mode 0700, owner uid 0, group gid 0)"
    assert staging.blocked_parent(open_dirs + [("/srv/models", 0o40750, 0, 44)], uid=998, gids={998, 44}) is None, "through its group"
    assert staging.blocked_parent(open_dirs + [("/srv/models", 0o40700, 998, 0)], uid=998, gids={998}) is None, "its own directory"
    assert staging.blocked_parent(open_dirs + [("/srv/models", 0o40754, 0, 0)], uid=998, gids={998}) is not None, "read is not search"
    assert staging.blocked_parent([root_only], uid=0, gids={0}) is None


def test_a_split_gguf_merge_refuses_parts_doubled_missing_or_not_split():
    from ansible_collections.gpufleet.serving.plugins.module_utils._models.gguf import Part, plan_merge

    def part(name, number, count=3, **values):
        numbers = {"split.no": (2, number.to_bytes(2, "little")), "split.count": (2, count.to_bytes(2, "little"))}
        return Part(name, 3, {**numbers, **values}, tensors=[], data_start=64, size=64)

    with pytest.raises(InvalidInput, match="b-2.gguf and a-2.gguf are both part 2"):
        plan_merge([part("a-1.gguf", 0), part("a-2.gguf", 1), part("b-2.gguf", 1)])
    with pytest.raises(InvalidInput, match="missing: 3"):
        plan_merge([part("a-1.gguf", 0), part("a-2.gguf", 1)])
    with pytest.raises(InvalidInput, match="not a part of a split GGUF"):
        plan_merge([Part("whole.gguf", 3, {}, data_start=64, size=64)])
    merged = plan_merge([part("a-2.gguf", 1, count=2), part("a-1.gguf", 0, count=2, **{"general.name": (8, b"\x01" + bytes(7) + b"x")})])
    assert merged.copies == [("a-1.gguf", 64, 0), ("a-2.gguf", 64, 0)], "parts in their order, whatever the order given"
    assert b"general.name" in merged.header and b"split.no" not in merged.header and len(merged.header) % 32 == 0


# --- one quant of a repository of many (issue 52) ---------------------------------------------------------------------
GLM = [("README.md", 10), ("UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00001-of-00003.gguf", 100), ("UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00002-of-00003.gguf", 100),
       ("UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00003-of-00003.gguf", 50), ("Q8_0/GLM-5-Q8_0-00001-of-00002.gguf", 300),
       ("Q8_0/GLM-5-Q8_0-00002-of-00002.gguf", 200), ("GLM-5-Q4_K.gguf", 90), ("GLM-5-Q4_K_M.gguf", 95)]


def test_a_model_name_with_a_quant_is_the_repository_and_the_quant():
    assert staging.hub_quant("unsloth/Qwen3-0.6B-GGUF:Q4_K_M") == ("unsloth/Qwen3-0.6B-GGUF", "Q4_K_M")
    assert staging.hub_quant("unsloth/GLM-5-GGUF:UD-Q4_K_XL") == ("unsloth/GLM-5-GGUF", "UD-Q4_K_XL")
    assert staging.hub_quant("org/name") == ("org/name", None)
    assert staging.hub_quant("/models/a:b") == ("/models/a:b", None)


def test_only_the_selected_quant_is_listed_counted_and_fetched():
    """A repository of many quants: the quant names one split set (not the others, not Q4_K against Q4_K_M)."""
    chosen = staging.select_files("unsloth/GLM-5-GGUF", GLM, quant="UD-Q4_K_XL")
    assert [name for name, _size in chosen] == [name for name, _size in GLM[1:4]] and sum(size for _n, size in chosen) == 250
    assert staging.select_files("r/x", GLM, quant="Q4_K") == [("GLM-5-Q4_K.gguf", 90)]
    assert staging.select_files("r/x", GLM, quant="q8_0") == GLM[4:6], "the hub's names vary in case"
    assert staging.gguf_selection([name for name, _size in chosen]) == [name for name, _size in GLM[1:4]]
    assert staging.select_files("r/x", GLM) == GLM, "no selection: the whole repository"


def test_a_selection_that_is_not_one_model_is_refused_naming_what_there_is():
    with pytest.raises(InvalidInput, match=r"r/x: no GGUF file of the quant 'IQ1_S'; its GGUF files: UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00001"):
        staging.select_files("r/x", GLM, quant="IQ1_S")
    with pytest.raises(InvalidInput, match=r"the quant 'GLM-5' names 4 GGUF models, not one split set"):
        staging.select_files("r/x", GLM, quant="GLM-5")
    with pytest.raises(InvalidInput, match=r"the file pattern '\*.safetensors' matches none of its 8 files"):
        staging.select_files("r/x", GLM, patterns=["*.safetensors"])
    assert staging.select_files("r/x", GLM, patterns=["Q8_0/*", "README.md"]) == [GLM[0]] + GLM[4:6]
    assert staging.gguf_selection(["README.md", "a.gguf"]) is None


def test_a_tokenizer_is_staged_with_its_files_only_and_must_hold_one():
    base = [("config.json", 1), ("tokenizer.json", 9), ("tokenizer_config.json", 2), ("model-00001-of-00002.safetensors", 10**9),
            ("model-00002-of-00002.safetensors", 10**9)]
    chosen = staging.select_files("zai-org/GLM-5", base, patterns=staging.TOKENIZER_FILES, optional=True)
    assert [name for name, _size in chosen] == ["config.json", "tokenizer.json", "tokenizer_config.json"], "never the weights"
    with pytest.raises(InvalidInput, match="none of its 1 files matches"):
        staging.select_files("org/x", [("model.safetensors", 5)], patterns=staging.TOKENIZER_FILES, optional=True)
    assert staging.tokenizer_problem(["config.json", "tokenizer.json"]) is None
    assert staging.tokenizer_problem(["config.json"]).startswith("no tokenizer file")
