"""The lab hub's GGUF repositories, written on a node with llama.cpp's own GGUF library (the gguf package).

    python3 tests/sim/gguf_repo.py --root /srv/hub [--tensor-mib 4]

<root>/lab/Tiny-GGUF holds quants side by side, as unsloth lays a repository out: Q4_K_M split in three parts in its
own folder (llama.cpp's split metadata, as its converter writes it), Q8_0 as one file, and a README. <root>/lab/tiny-base
is the base model's repository: its config, tokenizer files and a safetensors shard of weights that a tokenizer's
staging must never fetch. Tensors hold float32 counting data, so that a merge's bytes can be compared with the parts'.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import gguf
import numpy as np

TENSOR_COUNT = 6


def write(path: Path, tensor_mib: int, split_max_tensors: int = 0) -> None:
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    writer.add_name("Tiny")
    writer.add_context_length(4096)
    elements = tensor_mib * (1 << 20) // 4
    for index in range(TENSOR_COUNT):
        writer.add_tensor(f"blk.{index}.attn_q.weight", np.arange(elements, dtype=np.float32) + index)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--tensor-mib", type=int, default=4)
    args = parser.parse_args()
    quants = Path(args.root) / "lab" / "Tiny-GGUF"
    (quants / "Q4_K_M").mkdir(parents=True, exist_ok=True)
    write(quants / "Q4_K_M" / "Tiny-Q4_K_M.gguf", args.tensor_mib, split_max_tensors=2)  # -00001-of-00003 ...
    write(quants / "Tiny-Q8_0.gguf", args.tensor_mib)
    (quants / "README.md").write_text("Tiny, in two quants\n")
    base = Path(args.root) / "lab" / "tiny-base"
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}) + "\n")
    (base / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"<s>": 0}}}) + "\n")
    (base / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    with open(base / "model.safetensors", "wb") as weights:
        header = json.dumps({"w": {"dtype": "U8", "shape": [8 << 20], "data_offsets": [0, 8 << 20]}}).encode()
        weights.write(len(header).to_bytes(8, "little") + header + os.urandom(8 << 20))
    print(json.dumps({"quants": sorted(str(p.relative_to(quants)) for p in quants.rglob("*") if p.is_file())}))


if __name__ == "__main__":
    main()
