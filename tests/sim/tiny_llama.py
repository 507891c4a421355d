"""A tiny Llama checkpoint that a real vLLM (its CPU build) loads and serves: made once, from the standard library alone.

    python3 tiny_llama.py DIR

DIR/tiny-llama/ gets config.json, model.safetensors (random float32 weights of a 2-layer Llama: hidden size 128,
head dim 32 - the CPU attention refuses 16 -, vocabulary 1000), generation_config.json and a byte-level tokenizer
(tokenizer.json: the 256 bytes and four special tokens, no merges; tokenizer_config.json with a chat template). What
it generates is noise; that it loads, lists its model, completes one token and drains is what the lab needs.
The directory is complete when its `.complete` file exists (made last; a partial one is removed and made again).
"""

from __future__ import annotations

import argparse
import array
import json
import random
import shutil
import sys
from pathlib import Path

NAME = "tiny-llama"
HIDDEN, INTERMEDIATE, LAYERS, HEADS, HEAD_DIM, VOCAB, POSITIONS = 128, 256, 2, 4, 32, 1000, 512
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
          "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
          "vocab_size": VOCAB, "max_position_embeddings": POSITIONS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 256, "eos_token_id": 257,
          "pad_token_id": 259}
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def tensor_shapes() -> dict[str, list[int]]:
    shapes = {"model.embed_tokens.weight": [VOCAB, HIDDEN], "model.norm.weight": [HIDDEN], "lm_head.weight": [VOCAB, HIDDEN]}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{prefix}.self_attn.{projection}.weight"] = [HEADS * HEAD_DIM, HIDDEN]
        shapes[f"{prefix}.mlp.gate_proj.weight"] = [INTERMEDIATE, HIDDEN]
        shapes[f"{prefix}.mlp.up_proj.weight"] = [INTERMEDIATE, HIDDEN]
        shapes[f"{prefix}.mlp.down_proj.weight"] = [HIDDEN, INTERMEDIATE]
        shapes[f"{prefix}.input_layernorm.weight"] = [HIDDEN]
        shapes[f"{prefix}.post_attention_layernorm.weight"] = [HIDDEN]
    return shapes


def write_safetensors(path: Path, seed: int = 0) -> None:
    """float32 tensors: norms 1.0, the rest uniform in [-0.05, 0.05] (a fixed seed: the same file every time)."""
    generator = random.Random(seed)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape in sorted(tensor_shapes().items()):
        count = 1
        for size in shape:
            count *= size
        values = array.array("f", [1.0] * count if name.endswith("norm.weight") else (generator.uniform(-0.05, 0.05) for _index in range(count)))
        if sys.byteorder != "little":
            values.byteswap()
        blob = values.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as out:
        out.write(len(encoded).to_bytes(8, "little"))
        out.write(encoded)
        for blob in blobs:
            out.write(blob)


def byte_level_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE stands each byte for (GPT-2's mapping)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[byte] = chr(byte)
        else:
            characters[byte] = chr(256 + extra)
            extra += 1
    return [characters[byte] for byte in range(256)]


def tokenizer_files() -> dict[str, dict]:
    vocab = {character: index for index, character in enumerate(byte_level_alphabet())}
    specials = {token: 256 + index for index, token in enumerate(SPECIALS)}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": index, "content": token, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True} for token, index in specials.items()],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": {**vocab, **specials}, "merges": []},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "pad_token": "<pad>", "model_max_length": POSITIONS, "add_bos_token": False, "chat_template": CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False}
    special_map = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": special_map}


def ensure(directory: Path) -> Path:
    """DIR/tiny-llama, made when it is not complete."""
    model = directory / NAME
    if (model / ".complete").exists():
        return model
    shutil.rmtree(model, ignore_errors=True)
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (model / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": 257, "do_sample": False}) + "\n")
    for name, content in tokenizer_files().items():
        (model / name).write_text(json.dumps(content, ensure_ascii=False) + "\n")
    write_safetensors(model / "model.safetensors")
    (model / ".complete").write_text("")
    return model


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    print(ensure(parser.parse_args(argv).directory))


if __name__ == "__main__":
    main(sys.argv[1:])
