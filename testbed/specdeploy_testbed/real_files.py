"""Kimi-K2.5's weights written to disk as the checkpoint ships them, cut in depth, for timing loads on
the lent GPU machine (test-bed tooling, never shipped).

The shipped checkpoint (moonshotai/Kimi-K2.5, ~595 GB) is one safetensors file per decoder layer or so,
its routed experts int4 `pack-quantized` (compressed-tensors, group 32: an int32 `weight_packed` of 8
values a word, a bf16 `weight_scale` a group, an int64 `weight_shape`), everything else bf16 (the
quantization block's `ignore`: attention, shared experts, the dense MLP, lm_head). Here: the first
LAYERS decoder layers (one dense, then MoE) with all 384 routed experts, about 35 GB at 4 layers, in
one file per layer (the embeddings with the first, the final norm and lm_head with the last), with the
config of `real_shapes` cut to that depth. A loader reads these bytes as it would the shipped ones.

The names follow the checkpoint's `language_model.model.layers.N...` (vLLM 0.33's
`KimiK25ForConditionalGeneration.hf_to_vllm_mapper` maps only the legacy `language_model.layers.`);
tests/unit/testbed/test_real_files.py holds the names, dtypes and shapes to the fixture
tests/data/kimi_k25/tensors.json, which names its source. The values are random but finite (bf16 and
f32 with a small exponent; packed int4 any bits), so nothing a loader does with them overflows.

Stdlib only: the safetensors format is an 8-byte header length, a JSON header and the raw bytes.
    python -m specdeploy_testbed.real_files OUT [--layers 4] [--experts 384]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_testbed import real_shapes

LAYERS = 4  # one dense layer (first_k_dense_replace) and three MoE layers
PREFIX = "language_model."
GROUP = 32  # the quantization block's group_size
PACK = 8  # int4 values per int32 word
DTYPE_BYTES = {"BF16": 2, "F32": 4, "I32": 4, "I64": 8}
BLOCK = 1 << 24  # bytes of the random pattern each tensor's bytes are cut from


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # safetensors' dtype names
    shape: tuple[int, ...]
    values: tuple[int, ...] = ()  # I64 tensors hold these (weight_shape); others are random

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPE_BYTES[self.dtype]


def _linear(name: str, rows: int, cols: int) -> list[Tensor]:
    return [Tensor(f"{name}.weight", "BF16", (rows, cols))]


def _packed(name: str, rows: int, cols: int) -> list[Tensor]:
    """An int4 pack-quantized linear as compressed-tensors writes it: ROWS outputs, COLS inputs."""
    return [
        Tensor(f"{name}.weight_packed", "I32", (rows, cols // PACK)),
        Tensor(f"{name}.weight_scale", "BF16", (rows, cols // GROUP)),
        Tensor(f"{name}.weight_shape", "I64", (2,), (rows, cols)),
    ]


def _norm(name: str, size: int) -> Tensor:
    return Tensor(f"{name}.weight", "BF16", (size,))


def layer_tensors(text: dict[str, Any], layer: int) -> list[Tensor]:
    """Decoder layer LAYER of TEXT (the text_config): MLA attention, then the dense MLP or the MoE."""
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    q_head = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    kv_head = text["qk_nope_head_dim"] + text["v_head_dim"]
    at = f"{PREFIX}model.layers.{layer}"
    out = [
        _norm(f"{at}.input_layernorm", hidden),
        _norm(f"{at}.post_attention_layernorm", hidden),
        *_linear(f"{at}.self_attn.q_a_proj", text["q_lora_rank"], hidden),
        _norm(f"{at}.self_attn.q_a_layernorm", text["q_lora_rank"]),
        *_linear(f"{at}.self_attn.q_b_proj", heads * q_head, text["q_lora_rank"]),
        *_linear(f"{at}.self_attn.kv_a_proj_with_mqa", text["kv_lora_rank"] + text["qk_rope_head_dim"], hidden),
        _norm(f"{at}.self_attn.kv_a_layernorm", text["kv_lora_rank"]),
        *_linear(f"{at}.self_attn.kv_b_proj", heads * kv_head, text["kv_lora_rank"]),
        *_linear(f"{at}.self_attn.o_proj", hidden, heads * text["v_head_dim"]),
    ]
    if layer < text["first_k_dense_replace"]:
        size = text["intermediate_size"]
        return [
            *out,
            *_linear(f"{at}.mlp.gate_proj", size, hidden),
            *_linear(f"{at}.mlp.up_proj", size, hidden),
            *_linear(f"{at}.mlp.down_proj", hidden, size),
        ]
    experts, size = text["n_routed_experts"], text["moe_intermediate_size"]
    shared = size * text["n_shared_experts"]
    out += [
        *_linear(f"{at}.mlp.gate", experts, hidden),
        Tensor(f"{at}.mlp.gate.e_score_correction_bias", "F32", (experts,)),
        *_linear(f"{at}.mlp.shared_experts.gate_proj", shared, hidden),
        *_linear(f"{at}.mlp.shared_experts.up_proj", shared, hidden),
        *_linear(f"{at}.mlp.shared_experts.down_proj", hidden, shared),
    ]
    for expert in range(experts):
        e = f"{at}.mlp.experts.{expert}"
        out += [*_packed(f"{e}.gate_proj", size, hidden), *_packed(f"{e}.up_proj", size, hidden),
                *_packed(f"{e}.down_proj", hidden, size)]  # fmt: skip
    return out


def shards(text: dict[str, Any]) -> list[list[Tensor]]:
    """One file per decoder layer; the embeddings in the first, the final norm and lm_head in the last."""
    hidden, vocab = text["hidden_size"], text["vocab_size"]
    files = [layer_tensors(text, layer) for layer in range(text["num_hidden_layers"])]
    files[0].insert(0, Tensor(f"{PREFIX}model.embed_tokens.weight", "BF16", (vocab, hidden)))
    files[-1] += [_norm(f"{PREFIX}model.norm", hidden), Tensor(f"{PREFIX}lm_head.weight", "BF16", (vocab, hidden))]
    return files


def _pattern() -> tuple[bytes, bytes]:
    """Random bytes for int tensors, and the same bytes made finite little-endian bf16/f32 for floats:
    each 2-byte word's high byte set to 0x3C or 0xBC (sign kept, exponent about 2**-7)."""
    raw = os.urandom(BLOCK)
    table = bytes(0xBC if b & 0x80 else 0x3C for b in range(256))
    finite = bytearray(raw)
    finite[1::2] = raw[1::2].translate(table)
    return raw, bytes(finite)


def write_file(path: Path, tensors: list[Tensor], pattern: tuple[bytes, bytes]) -> int:
    """One safetensors file; returns its size. Written to PATH.part and renamed: a cut write leaves none."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    part = path.with_name(path.name + ".part")
    with part.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors:
            if t.dtype == "I64":
                f.write(struct.pack(f"<{len(t.values)}q", *t.values))
                continue
            source = pattern[0] if t.dtype == "I32" else pattern[1]
            left = t.nbytes
            while left:
                chunk = min(left, len(source))
                f.write(source[:chunk])
                left -= chunk
    part.rename(path)
    return path.stat().st_size


def write(out: Path, layers: int = LAYERS, experts: int | None = None) -> dict[str, Any]:
    """OUT/target: config.json, the tokenizer and the safetensors files with their index. The config is
    real_shapes' at LAYERS (7 or more would also carry the drafter; a load needs no drafter)."""
    experts = experts if experts is not None else real_shapes.TEXT["n_routed_experts"]
    target = out / "target"
    target.mkdir(parents=True, exist_ok=True)
    config = real_shapes.target_config(real_shapes.train_tokenizer(target), layers, experts)
    config[real_shapes.MODEL_FORM_KEY]["weights"] = (
        "on disk as the checkpoint ships them (specdeploy_testbed.real_files): random finite values"
    )
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return write_weights(target, config["text_config"])


def write_weights(target: Path, text: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    pattern = _pattern()
    files = shards(text)
    weight_map: dict[str, str] = {}
    total = 0
    for n, tensors in enumerate(files, 1):
        name = f"model-{n:05d}-of-{len(files):05d}.safetensors"
        total += write_file(target / name, tensors, pattern)
        weight_map |= {t.name: name for t in tensors}
    index = {"metadata": {"total_size": sum(t.nbytes for f in files for t in f)}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"files": len(files), "bytes": total, "tensors": len(weight_map),
            "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path, help="writes OUT/target")
    parser.add_argument("--layers", type=int, default=LAYERS)
    parser.add_argument("--experts", type=int, default=None, help="routed experts per layer (default: all 384)")
    args = parser.parse_args()
    print(json.dumps(write(args.out, args.layers, args.experts)))


if __name__ == "__main__":
    main()
