"""The tiny test-bed models' configs and their tokenizer's training, torch-free: what tiny_models
writes, and what the unit tests hold to transformers' config classes (tests/unit/testbed/test_tiny_configs.py).

Stdlib only: tiny_models.py also runs as a script on a test-bed host, in a venv without specdeploy,
with this file copied next to it (testbed/roles/setup_tiny_models).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

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
ROPE_SCALING = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 512,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
AUX_LAYER_IDS = (2, 3, 4)


CORPUS = [
    "speculative decoding drafts tokens that the target model verifies in one pass",
    "the quick brown fox jumps over the lazy dog while the engine loads its weights",
    "mixture of experts routes each token to a few experts and a shared expert",
    "multi head latent attention compresses keys and values into a small latent",
] * 64


def train_tokenizer(
    out: Path, specials: list[str], chat_template: str, names: dict[str, str], fill_to: int = 0
) -> dict[str, int]:
    """Saves a byte-level BPE tokenizer trained on CORPUS; returns the special tokens' ids (after the
    merges the corpus yields). tokenizers/transformers are imported here, so this module stays
    importable without them (and without torch: the real-shape forms train it too).

    FILL_TO > 0: the vocabulary is padded to that many ids with tokens that each decode to text (" w<id>"),
    never produced by encoding (no merge leads to them). A random-weight model of a real vocabulary
    (Kimi-K2.5: 163,840) samples ids far past the trained ones; ids the tokenizer lacks decode to nothing,
    and vLLM's benchmark client counts a request that streamed no text as failed (the H200, 2026-12-04)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    if fill_to:
        doc = json.loads(tok.to_str())
        vocab = doc["model"]["vocab"]
        vocab |= {f"\u0120w{i}": i for i in range(len(vocab), fill_to - len(specials))}  # "Ġ": a space, byte-level
        tok = Tokenizer.from_str(json.dumps(doc))
    tok.add_special_tokens(specials)  # at the end of the vocabulary
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **names)  # type: ignore[no-untyped-call]
    fast.chat_template = chat_template
    fast.save_pretrained(out)
    ids = {token: tok.token_to_id(token) for token in specials}
    return {token: i for token, i in ids.items() if i is not None}


def target_config() -> dict[str, Any]:
    """The DeepSeek-V3 text model (alone, or as Kimi-K2.5's text_config)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        # Six layers: aux ids [2, 3, 4] start above 1 (SGLang shifts ids that start at 1) and
        # above 0 (vLLM's layer 0 has no residual yet), and end below the last layer.
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
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
        "rope_theta": 50000.0,
        # Kimi-K2.5's schema (yarn, its keys and betas); factor x original = max_position_embeddings
        # here (the real model: 64 x 4096 = 262144), so the engines derive the same 2048-token limit.
        "rope_scaling": dict(ROPE_SCALING),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def drafter_config(target: dict[str, Any]) -> dict[str, Any]:
    # An MLA drafter for an MLA target; model_type deepseek_v2 (deepseek_v3 would be rewritten to MTP).
    return {
        **copy.deepcopy(target),  # its own rope_scaling: transformers' config classes edit theirs in place
        "architectures": ["Eagle3DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "num_hidden_layers": 1,
        "first_k_dense_replace": 1,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": target["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS)},
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


# Keys of the hub checkpoint's config.json that transformers' save_pretrained drops or rewrites:
# the router keys DeepseekV3Config does not model, and Kimi-K2.5's `rope_scaling` / `rope_theta`
# (transformers 5 writes them as `rope_parameters` only).
HUB_KEYS = ("topk_method", "scoring_func", "n_group", "topk_group", "rope_scaling", "rope_theta")


def restore_hub_keys(saved: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """SAVED (the config.json save_pretrained wrote) with CFG's hub keys put back as CFG has them."""
    return {**saved, **{key: copy.deepcopy(cfg[key]) for key in HUB_KEYS if key in cfg}}


def drafter_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The MLA EAGLE-3 drafter's tensor shapes, from its config (the d2t/t2d maps aside)."""
    h, heads, inner = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    q_rank, kv_rank, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    layer = "layers.0."
    return {
        # The first drafter layer attends over [embedding, fused target state]: 2 * hidden inputs.
        f"{layer}self_attn.q_a_proj.weight": (q_rank, 2 * h),
        f"{layer}self_attn.q_a_layernorm.weight": (q_rank,),
        f"{layer}self_attn.q_b_proj.weight": (heads * (nope + rope), q_rank),
        f"{layer}self_attn.kv_a_proj_with_mqa.weight": (kv_rank + rope, 2 * h),
        f"{layer}self_attn.kv_a_layernorm.weight": (kv_rank,),
        f"{layer}self_attn.kv_b_proj.weight": (heads * (nope + v), kv_rank),
        f"{layer}self_attn.o_proj.weight": (h, heads * v),
        f"{layer}mlp.gate_proj.weight": (inner, h),
        f"{layer}mlp.up_proj.weight": (inner, h),
        f"{layer}mlp.down_proj.weight": (h, inner),
        f"{layer}input_layernorm.weight": (h,),
        f"{layer}post_attention_layernorm.weight": (h,),
        f"{layer}hidden_norm.weight": (h,),
        "fc.weight": (h, aux * h),  # one target state per aux layer id, fused
        "norm.weight": (h,),
        "embed_tokens.weight": (cfg["vocab_size"], h),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
    }


def maker_digest() -> str:
    """The tiny models' maker (this file and tiny_models.py): folders made by another are remade."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("tiny_configs.py", "tiny_models.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()
