"""Kimi-K2.5's safetensors headers as the full-depth forms would ship them, for the fit's tests (test-bed
tooling, never shipped): as dicts, or written as model folders of header-only files (no weights).

The text model's tensors are the ones specdeploy_testbed.real_files writes (held to the fixture
tests/data/kimi_k25/tensors.json, whose README names its sources), at the form's depth and routed experts
(real_shapes' config). Two parts are not in the fixture and are written here from the pinned vLLM's
modules, so an estimate:
- the vision tower and projector (`kimi_k25_vit.py`: 27 MoonViT blocks of width 1152, MLP 4304, a
  learnt 64x64 position grid, a patch-merger projector 4608 -> 4608 -> 7168), all BF16;
- the EAGLE-3 drafter (`deepseek_eagle3.py`: one MLA decoder layer whose attention reads 2 x hidden,
  the target's dense MLP, `fc` over three aux hidden states, its own lm_head over the draft vocabulary,
  `d2t`/`t2d`; no embed_tokens, as EAGLE-3 checkpoints ship).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdeploy.preflight.weights import Tensor
from specdeploy_testbed import real_files, real_shapes

# real_shapes' tokenizer ids: the config names them, the tensors do not depend on them
IDS = {"[BOS]": 0, "[EOS]": 1, "[PAD]": 2, "<|media_pad|>": 3}


def target(layers: int = 61, experts: int = 16) -> dict[str, Tensor]:
    """The full-depth form's tensors (LAYERS decoder layers, EXPERTS routed experts a layer), vision included."""
    text = real_shapes.target_config(IDS, layers, experts)["text_config"]
    out = {t.name: Tensor(t.dtype, t.shape) for tensors in real_files.shards(text) for t in tensors}
    return {**out, **vision()}


def vision(blocks: int = 27, width: int = 1152, mlp: int = 4304, text_hidden: int = 7168) -> dict[str, Tensor]:
    def bf16(*shape: int) -> Tensor:
        return Tensor("BF16", shape)

    out = {"vision_tower.patch_embed.proj.weight": bf16(width, 3, 14, 14),
           "vision_tower.patch_embed.proj.bias": bf16(width),
           "vision_tower.patch_embed.pos_emb.weight": bf16(64, 64, width),
           "vision_tower.encoder.final_layernorm.weight": bf16(width),
           "vision_tower.encoder.final_layernorm.bias": bf16(width),
           "mm_projector.pre_norm.weight": bf16(width), "mm_projector.pre_norm.bias": bf16(width),
           "mm_projector.proj.0.weight": bf16(4 * width, 4 * width), "mm_projector.proj.0.bias": bf16(4 * width),
           "mm_projector.proj.2.weight": bf16(text_hidden, 4 * width),
           "mm_projector.proj.2.bias": bf16(text_hidden)}  # fmt: skip
    for b in range(blocks):
        at = f"vision_tower.encoder.blocks.{b}."
        for name, shape in (("wqkv", (3 * width, width)), ("wo", (width, width)), ("mlp.fc0", (mlp, width)),
                            ("mlp.fc1", (width, mlp))):  # fmt: skip
            out[f"{at}{name}.weight"], out[f"{at}{name}.bias"] = bf16(*shape), bf16(shape[0])
        for norm in ("norm0", "norm1"):
            out[f"{at}{norm}.weight"], out[f"{at}{norm}.bias"] = bf16(width), bf16(width)
    return out


def drafter(config: dict[str, Any]) -> dict[str, Tensor]:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    q_lora, kv_lora, rope = config["q_lora_rank"], config["kv_lora_rank"], config["qk_rope_head_dim"]
    nope, v, inter = config["qk_nope_head_dim"], config["v_head_dim"], config["intermediate_size"]

    def bf16(*shape: int) -> Tensor:
        return Tensor("BF16", shape)

    at = "layers.0."
    return {
        f"{at}input_layernorm.weight": bf16(hidden), f"{at}hidden_norm.weight": bf16(hidden),
        f"{at}post_attention_layernorm.weight": bf16(hidden),
        f"{at}self_attn.q_a_proj.weight": bf16(q_lora, 2 * hidden), f"{at}self_attn.q_a_layernorm.weight": bf16(q_lora),
        f"{at}self_attn.q_b_proj.weight": bf16(heads * (nope + rope), q_lora),
        f"{at}self_attn.kv_a_proj_with_mqa.weight": bf16(kv_lora + rope, 2 * hidden),
        f"{at}self_attn.kv_a_layernorm.weight": bf16(kv_lora),
        f"{at}self_attn.kv_b_proj.weight": bf16(heads * (nope + v), kv_lora),
        f"{at}self_attn.o_proj.weight": bf16(hidden, heads * v),
        f"{at}mlp.gate_proj.weight": bf16(inter, hidden), f"{at}mlp.up_proj.weight": bf16(inter, hidden),
        f"{at}mlp.down_proj.weight": bf16(hidden, inter),
        "fc.weight": bf16(hidden, 3 * hidden), "norm.weight": bf16(hidden),
        "lm_head.weight": bf16(config["draft_vocab_size"], hidden),
        "d2t": Tensor("I64", (config["draft_vocab_size"],)), "t2d": Tensor("BOOL", (config["vocab_size"],)),
    }  # fmt: skip


def write_form(folder: Path, headers: dict[str, Tensor], config: dict[str, Any]) -> Path:
    """A model folder of config.json and one safetensors file holding the headers alone (no weights: what
    the fit reads on a host is the header, so a folder of a few MB stands for a checkpoint of hundreds of GB)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    entries = {n: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [0, 0]} for n, t in headers.items()}
    raw = json.dumps(entries).encode()
    (folder / "model-00001-of-00001.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)
    return folder
