"""Tiny targets and a matching MLA EAGLE-3 drafter, made locally (no model hub).

Two target architectures:
- `deepseek_v3`: a DeepSeek-V3 text model (`DeepseekV3ForCausalLM`);
- `kimi_k25`: the user's Kimi-K2.5 shape (`KimiK25ForConditionalGeneration`): the same DeepSeek-V3
  text model as `text_config`, wrapped with a tiny MoonViT vision tower and projector, in the hub
  checkpoint's config keys and tensor names, with a `preprocessor_config.json` for its media.

Random weights, a byte-level BPE tokenizer trained here. With `always_accept`, the output layers of
target and drafter are zeroed, so both always pick the same token and the drafter's proposals are
really accepted (acceptance > 0 is then testable). Shapes are fixed by the CPU MLA decode kernel
(latent 576 = kv_lora_rank 512 + qk_rope_head_dim 64); see ../shared/ENGINE_FACTS.md.

Run with the engine's python:
    python -m specdeploy_testbed.tiny_models OUT [--always-accept] [--architecture kimi_k25]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

VOCAB = 2048
DRAFT_VOCAB = 1024
ARCHITECTURES = ("deepseek_v3", "kimi_k25")
SPECIALS = ["<|begin|>", "<|end|>", "<|user|>", "<|assistant|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# Kimi-K2.5's special tokens by name (its real ids are 163584+; here they follow the trained merges):
# the chat roles, the media tokens its processor and vLLM's Kimi code look up by name, and the
# tool-call and thinking tokens the kimi_k2 tool-call and reasoning parsers require.
KIMI_SPECIALS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>", "<|kimi_k25_video_placeholder|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>", "[PAD]",
]  # fmt: skip
KIMI_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_' + m['role'] + '|>' + m['role'] + '<|im_middle|>' + m['content']"
    " + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_assistant|>assistant<|im_middle|>' }}{% endif %}"
)
CORPUS = [
    "speculative decoding drafts tokens that the target model verifies in one pass",
    "the quick brown fox jumps over the lazy dog while the engine loads its weights",
    "mixture of experts routes each token to a few experts and a shared expert",
    "multi head latent attention compresses keys and values into a small latent",
] * 64


def target_config() -> dict[str, Any]:
    """The DeepSeek-V3 text model (alone, or as Kimi-K2.5's text_config)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 64,
        "v_head_dim": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        # transformers' DeepseekV3Config omits these; vLLM then misses e_score_correction_bias.
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def drafter_config(target: dict[str, Any]) -> dict[str, Any]:
    # An MLA drafter for an MLA target; model_type deepseek_v2 (deepseek_v3 would be rewritten to MTP).
    return {
        **target,
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "num_hidden_layers": 1,
        "first_k_dense_replace": 1,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": target["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
    }


def kimi_config(text: dict[str, Any], ids: dict[str, int]) -> dict[str, Any]:
    """Kimi-K2.5's config.json keys (the hub checkpoint's schema), tiny.

    No `auto_map`: this folder ships no custom code (the real one does, for its tokenizer). The hub
    vision_config names the tower's sizes `vt_*`; vLLM 0.32 reads them through transformers'
    Kimi_K25VisionConfig, whose fields are `hidden_size`, `num_hidden_layers`, ... and default to the
    real model's sizes. The tiny tower therefore carries both spellings.
    """
    vision = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128}
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": ids["[EOS]"],
        "pad_token_id": ids["[PAD]"],
        "ignore_index": -100,
        "media_placeholder_token_id": ids["<|media_pad|>"],
        # transformers' Kimi_K25Config names it image_token_id (default: the real model's 163605);
        # vLLM 0.32 takes the tokenizer's <|media_pad|> id when they differ, with a warning.
        "image_token_id": ids["<|media_pad|>"],
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": text,
        "vision_config": {
            "patch_size": 14,
            "init_pos_emb_height": 8,
            "init_pos_emb_width": 8,
            "init_pos_emb_time": 4,
            "pos_emb_type": "divided_fixed",
            "merge_kernel_size": [2, 2],
            "merge_type": "sd2_tpool",
            "video_attn_type": "spatial_temporal",
            "mm_projector_type": "patchmerger",
            "mm_hidden_size": vision["hidden_size"],
            "projector_hidden_act": "gelu",
            "projector_ln_eps": 1e-5,
            "text_hidden_size": text["hidden_size"],
            **{f"vt_{k}": v for k, v in vision.items()},
            **vision,
        },
    }


def kimi_preprocessor_config() -> dict[str, Any]:
    """The media processor's settings, bounded so an image is at most 64 patches (16 tokens)."""
    return {
        "image_processor_type": "KimiK25ImageProcessor",
        "media_proc_cfg": {
            "patch_size": 14,
            "merge_kernel_size": 2,
            "in_patch_limit": 64,
            "patch_limit_on_one_side": 8,
            "in_patch_limit_each_frame": 64,
            "in_patch_limit_video": None,
            "fixed_output_tokens": None,
            "sample_fps": 2.0,
            "max_num_frames_each_video": None,
            "temporal_merge_kernel_size": 4,
            "timestamp_mode": "hh:mm:ss.fff",
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    }


def train_tokenizer(out: Path, specials: list[str], chat_template: str, names: dict[str, str]) -> dict[str, int]:
    """Saves the tokenizer; returns the special tokens' ids (after the merges the corpus yields)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_special_tokens(specials)  # at the end of the vocabulary
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    return {token: int(tok.token_to_id(token)) for token in specials}


def text_model(cfg: dict[str, Any], always_accept: bool) -> DeepseekV3ForCausalLM:
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).to(torch.bfloat16)
    if always_accept:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    return model


def make_deepseek_target(out: Path, always_accept: bool) -> dict[str, Any]:
    names = {"bos_token": "<|begin|>", "eos_token": "<|end|>", "pad_token": "<|pad|>"}
    ids = train_tokenizer(out, SPECIALS, CHAT_TEMPLATE, names)
    cfg = {**target_config(), "bos_token_id": ids["<|begin|>"], "eos_token_id": ids["<|end|>"]}
    text_model(cfg, always_accept).save_pretrained(out, safe_serialization=True)
    # save_pretrained drops the router keys transformers does not model; put them back.
    saved = json.loads((out / "config.json").read_text())
    saved.update({k: cfg[k] for k in ("topk_method", "scoring_func", "n_group", "topk_group")})
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    return cfg


def vision_tensors(cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The MoonViT tower and patch-merger projector, under the hub checkpoint's tensor names."""
    vis, text_h = cfg["vision_config"], cfg["text_config"]["hidden_size"]
    h, inner, p = vis["hidden_size"], vis["intermediate_size"], vis["patch_size"]
    merged = h * vis["merge_kernel_size"][0] * vis["merge_kernel_size"][1]
    shapes: dict[str, tuple[int, ...]] = {
        "vision_tower.patch_embed.proj.weight": (h, 3, p, p),
        "vision_tower.patch_embed.proj.bias": (h,),
        "vision_tower.patch_embed.pos_emb.weight": (vis["init_pos_emb_height"], vis["init_pos_emb_width"], h),
        "vision_tower.encoder.final_layernorm.weight": (h,),
        "vision_tower.encoder.final_layernorm.bias": (h,),
        "mm_projector.pre_norm.weight": (h,),
        "mm_projector.pre_norm.bias": (h,),
        "mm_projector.proj.0.weight": (merged, merged),
        "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_h, merged),
        "mm_projector.proj.2.bias": (text_h,),
    }
    for i in range(vis["num_hidden_layers"]):
        block = f"vision_tower.encoder.blocks.{i}."
        shapes |= {
            f"{block}wqkv.weight": (3 * h, h), f"{block}wqkv.bias": (3 * h,),
            f"{block}wo.weight": (h, h), f"{block}wo.bias": (h,),
            f"{block}mlp.fc0.weight": (inner, h), f"{block}mlp.fc0.bias": (inner,),
            f"{block}mlp.fc1.weight": (h, inner), f"{block}mlp.fc1.bias": (h,),
            f"{block}norm0.weight": (h,), f"{block}norm0.bias": (h,),
            f"{block}norm1.weight": (h,), f"{block}norm1.bias": (h,),
        }  # fmt: skip
    torch.manual_seed(2)
    return {name: (torch.randn(*shape) * 0.02).to(torch.bfloat16) for name, shape in shapes.items()}


def make_kimi_target(out: Path, always_accept: bool) -> dict[str, Any]:
    names = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]"}
    ids = train_tokenizer(out, KIMI_SPECIALS, KIMI_CHAT_TEMPLATE, names)
    text = {**target_config(), "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"]}
    cfg = kimi_config(text, ids)
    # The hub checkpoint nests the text model's tensors under language_model, named as
    # save_pretrained writes them (one tensor per expert, not transformers' fused in-memory form).
    with tempfile.TemporaryDirectory() as tmp:
        text_model(text, always_accept).save_pretrained(tmp, safe_serialization=True)
        tensors = {f"language_model.{k}": v for k, v in load_file(str(Path(tmp) / "model.safetensors")).items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors | vision_tensors(cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(kimi_preprocessor_config(), indent=2))
    return text


def make_target(out: Path, always_accept: bool, architecture: str = "deepseek_v3") -> dict[str, Any]:
    """Writes the target folder; returns its text model's config (what the drafter must match)."""
    make = make_kimi_target if architecture == "kimi_k25" else make_deepseek_target
    return make(out, always_accept)


def make_drafter(out: Path, target: dict[str, Any], always_accept: bool) -> None:
    torch.manual_seed(1)
    cfg = drafter_config(target)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    layer = "layers.0."
    tensors = {
        # The first drafter layer attends over [embedding, fused target state]: 2 * hidden inputs.
        f"{layer}self_attn.q_a_proj.weight": w(cfg["q_lora_rank"], 2 * h),
        f"{layer}self_attn.q_a_layernorm.weight": ones(cfg["q_lora_rank"]),
        f"{layer}self_attn.q_b_proj.weight": w(heads * qk_head, cfg["q_lora_rank"]),
        f"{layer}self_attn.kv_a_proj_with_mqa.weight": w(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], 2 * h),
        f"{layer}self_attn.kv_a_layernorm.weight": ones(cfg["kv_lora_rank"]),
        f"{layer}self_attn.kv_b_proj.weight": w(
            heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]
        ),
        f"{layer}self_attn.o_proj.weight": w(h, heads * cfg["v_head_dim"]),
        f"{layer}mlp.gate_proj.weight": w(cfg["intermediate_size"], h),
        f"{layer}mlp.up_proj.weight": w(cfg["intermediate_size"], h),
        f"{layer}mlp.down_proj.weight": w(h, cfg["intermediate_size"]),
        f"{layer}input_layernorm.weight": ones(h),
        f"{layer}post_attention_layernorm.weight": ones(h),
        f"{layer}hidden_norm.weight": ones(h),
        "fc.weight": w(h, 3 * h),
        "norm.weight": ones(h),
        "embed_tokens.weight": w(VOCAB, h),
        "lm_head.weight": torch.zeros(DRAFT_VOCAB, h, dtype=torch.bfloat16) if always_accept else w(DRAFT_VOCAB, h),
        # Draft token i is target token i + d2t[i]: the first DRAFT_VOCAB ids map onto themselves.
        "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.long),
        "t2d": torch.arange(VOCAB) < DRAFT_VOCAB,
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def write_manifest(folder: Path) -> None:
    """SHA256SUMS, which the image build checks the drafter against (written last: it marks done)."""
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o644)  # safetensors writes 0600; the engine and the build read as other users
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(folder)}"
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "SHA256SUMS"]  # fmt: skip
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="writes OUT/target and OUT/drafter")
    parser.add_argument("--always-accept", action="store_true", help="zero both output layers")
    parser.add_argument("--architecture", choices=ARCHITECTURES, default="deepseek_v3", help="the target's")
    args = parser.parse_args()
    target = make_target(args.out / "target", args.always_accept, args.architecture)
    make_drafter(args.out / "drafter", target, args.always_accept)
    for folder in (args.out / "target", args.out / "drafter"):
        write_manifest(folder)
    print(json.dumps({"target": str(args.out / "target"), "drafter": str(args.out / "drafter")}))


if __name__ == "__main__":
    main()
