"""Model directories for the simulated lab: real files shaped like a Hugging Face checkpoint, made once and cached.

    python3 model_files.py DIR [--mib 64]

DIR gets Llama-3.3-70B-Instruct/ (config.json, tokenizer files, model-0000k-of-0000n.safetensors shards and their
index) and EAGLE3-LLaMA3.3-70B/ (a draft head, 1/16 of the size). Each shard is a valid safetensors file (an 8-byte
header length, a JSON header of tensors and offsets, then the bytes) filled with pseudo-random data, so that reading
it costs what reading weights costs. The engine doubles read every byte at start, as the engines do; the switch's
prewarm reads them into the page cache before the drain. A directory is complete when its `.complete` file exists.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

MODEL = "Llama-3.3-70B-Instruct"
DRAFT = "EAGLE3-LLaMA3.3-70B"
BLOCK = 8 << 20
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
          "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
          "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def write_shard(path: Path, size: int, name_prefix: str, block: bytes) -> dict:
    """One safetensors file of about `size` bytes: one BF16 tensor per 8 MiB block. Returns its tensor names."""
    tensors, offset, index = {}, 0, 0
    while offset < size:
        length = min(len(block), size - offset)
        length -= length % 2
        tensors[f"{name_prefix}.{index}.weight"] = {"dtype": "BF16", "shape": [length // 2], "data_offsets": [offset, offset + length]}
        offset += length
        index += 1
    header = json.dumps({"__metadata__": {"format": "pt"}, **tensors}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as out:
        out.write(len(header).to_bytes(8, "little") + header)
        for name in tensors:
            start, end = tensors[name]["data_offsets"]
            out.write(block[: end - start])
        out.flush()
        os.fsync(out.fileno())  # written back, so that dropping the page cache really makes the next read cold
    return {name: path.name for name in tensors}


def write_model(directory: Path, mib: int, shards: int, prefix: str) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=1) + "\n")
    (directory / "generation_config.json").write_text('{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}\n')
    (directory / "tokenizer_config.json").write_text('{"model_max_length": 131072}\n')
    block = os.urandom(BLOCK)
    weight_map = {}
    size = (mib << 20) // shards
    for shard in range(1, shards + 1):
        name = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        weight_map.update(write_shard(directory / name, size, f"{prefix}.layers.{shard}", block))
    index = {"metadata": {"total_size": size * shards}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")


def ensure(root: Path, mib: int) -> Path:
    """root/<mib>m/ with both models; made once, by one process at a time (labs start side by side)."""
    target = root / f"{mib}m"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second lab waits for the first one's models instead of racing it
        if (target / ".complete").exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{mib}m.", dir=root))
        write_model(work / MODEL, mib, min(8, max(2, mib // 128)), "model")
        write_model(work / DRAFT, max(4, mib // 16), 1, "draft")
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)  # readable by an engine's own user
        work.rename(target)
        (target / ".complete").write_text("")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    print(ensure(args.directory, args.mib))


if __name__ == "__main__":
    main()
