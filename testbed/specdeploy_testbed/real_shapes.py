"""Model forms of Kimi-K2.5 at its real shapes, for the lent H200 (test-bed tooling, never shipped).

A model form is a config.json (and a small tokenizer) with no weights: vLLM serves it with
`--load-format dummy` (random weights), at the real model's shapes and quantization:
- the target: `KimiK25ForConditionalGeneration` in the hub checkpoint's schema, its text model the real
  DeepSeek-V3 stack (hidden 7168, MLA, yarn, vocabulary 163840) with the shipped int4 `quantization_config`,
  its routed experts cut to EXPERTS per layer (top-8 kept: ~66 GiB at 61 layers) and its depth a parameter;
- its drafter: an MLA EAGLE-3 drafter of the real shape (`Eagle3DeepseekV2ForCausalLM`, one layer).
Each config records what was cut under MODEL_FORM_KEY. The shipped values are held to the fixture
tests/data/kimi_k25/config.json by tests/unit/testbed/test_real_shapes.py.

The configs are stdlib only (no torch); the maker imports tokenizers/transformers when it writes.
    python -m specdeploy_testbed.real_shapes OUT [--layers 61] [--experts 32]
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from specdeploy_testbed import tiny_configs

MODEL = "moonshotai/Kimi-K2.5"
MODEL_FORM_KEY = "specdeploy_model_form"
LAYERS = 61
EXPERTS = 32
# Kimi-K2.5 ships no EAGLE-3 drafter; lightseekorg/kimi-k2.5-eagle3-mla's config.json was not found
# here, so its draft vocabulary is the usual EAGLE-3 one.
DRAFT_VOCAB = 32000

# The shipped config.json's values (tests/data/kimi_k25/config.json; the test holds these to it).
QUANTIZATION: dict[str, Any] = {
    "config_groups": {
        "group_0": {
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": None,
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "minmax",
                "observer_kwargs": {},
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
}
TEXT: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 262144,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0,
    "pad_token_id": 163839,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": QUANTIZATION,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 64.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 50000.0,
    "routed_scaling_factor": 2.827,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 163840,
}
VISION: dict[str, Any] = {
    "init_pos_emb_height": 64,
    "init_pos_emb_time": 4,
    "init_pos_emb_width": 64,
    "merge_kernel_size": [2, 2],
    "merge_type": "sd2_tpool",
    "mm_hidden_size": 1152,
    "mm_projector_type": "patchmerger",
    "patch_size": 14,
    "pos_emb_type": "divided_fixed",
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-05,
    "text_hidden_size": 7168,
    "video_attn_type": "spatial_temporal",
    "vt_hidden_size": 1152,
    "vt_intermediate_size": 4304,
    "vt_num_attention_heads": 16,
    "vt_num_hidden_layers": 27,
}
TOP: dict[str, Any] = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "ignore_index": -100,
    "media_placeholder_token_id": 163605,
    "model_type": "kimi_k25",
    "pad_token_id": 163839,
    "tie_word_embeddings": False,
    "use_unified_vision_chunk": True,
    "video_placeholder": "<|kimi_k25_video_placeholder|>",
}
# What every model form changes of the shipped config, beyond the cuts it records with their values:
# no auto_map (no remote code in the folder: vLLM and transformers would look for its .py files), and the
# special-token ids are the small tokenizer's.
REMOVED = ("auto_map", "text_config.auto_map")
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "media_placeholder_token_id")
# Added keys: the hoisted quantization_config (the checkpoint's remote code copies text_config's to the
# top; transformers' Kimi_K25Config does not), image_token_id (transformers' name for the media token),
# torch_dtype, and the model-form record.
ADDED = ("quantization_config", "image_token_id", "torch_dtype", MODEL_FORM_KEY)


def aux_layer_ids(layers: int) -> list[int]:
    """Three target layers both engines read alike: above 1 (SGLang shifts ids starting at 1; vLLM's
    layer 0 has no residual) and below the last: [2, 30, 58] at 61 layers."""
    if layers < 7:
        raise ValueError(f"the drafter's aux layers need a target of at least 7 layers, not {layers}")
    return [2, (layers - 1) // 2, layers - 3]


def model_form(layers: int, experts: int, what: str) -> dict[str, Any]:
    cuts = {}
    if experts != TEXT["n_routed_experts"]:
        cuts["text_config.n_routed_experts"] = {"shipped": TEXT["n_routed_experts"], "here": experts}
    if layers != TEXT["num_hidden_layers"]:
        cuts["text_config.num_hidden_layers"] = {"shipped": TEXT["num_hidden_layers"], "here": layers}
    return {
        "of": MODEL,
        "what": what,
        "weights": "none: serve with --load-format dummy (random weights)",
        "cuts": cuts,
        "removed": list(REMOVED),
        "tokenizer": "a small BPE trained here (tiny_configs.train_tokenizer), padded to the model's vocabulary "
        "with ids that decode to text; the special-token ids are its own",
    }


def text_config(ids: dict[str, int], layers: int = LAYERS, experts: int = EXPERTS) -> dict[str, Any]:
    if not TEXT["num_experts_per_tok"] <= experts <= TEXT["n_routed_experts"]:
        raise ValueError(f"experts must be {TEXT['num_experts_per_tok']} … {TEXT['n_routed_experts']}, not {experts}")
    if not TEXT["first_k_dense_replace"] < layers <= TEXT["num_hidden_layers"]:
        raise ValueError(f"layers must be {TEXT['first_k_dense_replace'] + 1} … {TEXT['num_hidden_layers']}")
    return {
        **copy.deepcopy(TEXT),
        "n_routed_experts": experts,
        "num_hidden_layers": layers,
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": ids["[EOS]"],
        "pad_token_id": ids["[PAD]"],
        "torch_dtype": "bfloat16",
        MODEL_FORM_KEY: model_form(layers, experts, "Kimi-K2.5's text model"),
    }


def target_config(ids: dict[str, int], layers: int = LAYERS, experts: int = EXPERTS) -> dict[str, Any]:
    """The full target's config.json: the shipped schema, the cuts recorded, the tokenizer's ids."""
    return {
        **copy.deepcopy(TOP),
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": ids["[EOS]"],
        "pad_token_id": ids["[PAD]"],
        "media_placeholder_token_id": ids["<|media_pad|>"],
        "image_token_id": ids["<|media_pad|>"],
        "quantization_config": copy.deepcopy(QUANTIZATION),
        "torch_dtype": "bfloat16",
        "text_config": text_config(ids, layers, experts),
        "vision_config": copy.deepcopy(VISION),
        MODEL_FORM_KEY: model_form(layers, experts, "Kimi-K2.5 (KimiK25ForConditionalGeneration)"),
    }


def drafter_config(target: dict[str, Any]) -> dict[str, Any]:
    """An MLA EAGLE-3 drafter of the real shape for TARGET's text model: one dense layer (hidden 7168,
    intermediate 18432 as the target's dense layer), the target's MLA sizes and yarn rope_scaling (its
    rotary embedding needs the factor), unquantized."""
    text = target["text_config"]
    ids = aux_layer_ids(text["num_hidden_layers"])
    cfg = tiny_configs.drafter_config({k: v for k, v in text.items() if k not in ("quantization_config", "auto_map")})
    cfg.update(
        draft_vocab_size=DRAFT_VOCAB,
        eagle_aux_hidden_state_layer_ids=ids,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(ids)},
    )
    cfg[MODEL_FORM_KEY] = {
        "of": f"an MLA EAGLE-3 drafter for {MODEL} (like lightseekorg/kimi-k2.5-eagle3-mla)",
        "what": "Eagle3DeepseekV2ForCausalLM, one layer, the target's MLA sizes",
        "weights": "none: serve with --load-format dummy (random weights)",
        "draft_vocab_size": f"{DRAFT_VOCAB}: the real drafter's was not found",
        "aux_layer_ids": f"{ids}, for a target of {text['num_hidden_layers']} layers",
    }
    return cfg


def train_tokenizer(out: Path) -> dict[str, int]:
    names = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]"}
    return tiny_configs.train_tokenizer(
        out, tiny_configs.KIMI_SPECIALS, tiny_configs.KIMI_CHAT_TEMPLATE, names, fill_to=TEXT["vocab_size"]
    )


def make(out: Path, layers: int = LAYERS, experts: int = EXPERTS) -> dict[str, Path]:
    """Writes OUT/target (config, tokenizer, preprocessor config) and OUT/drafter (config): no weights."""
    target_dir, drafter_dir = out / "target", out / "drafter"
    target_dir.mkdir(parents=True, exist_ok=True)
    drafter_dir.mkdir(parents=True, exist_ok=True)
    aux_layer_ids(layers)  # refuse a depth the drafter cannot read before writing anything
    ids = train_tokenizer(target_dir)
    target = target_config(ids, layers, experts)
    (target_dir / "config.json").write_text(json.dumps(target, indent=2) + "\n")
    (target_dir / "preprocessor_config.json").write_text(
        json.dumps(tiny_configs.kimi_preprocessor_config(), indent=2) + "\n"
    )
    (drafter_dir / "config.json").write_text(json.dumps(drafter_config(target), indent=2) + "\n")
    return {"target": target_dir, "drafter": drafter_dir}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path, help="writes OUT/target and OUT/drafter")
    parser.add_argument("--layers", type=int, default=LAYERS, help="the target's depth (7 … 61)")
    parser.add_argument("--experts", type=int, default=EXPERTS, help="routed experts per layer (8 … 384)")
    args = parser.parse_args()
    try:
        text_config({"[BOS]": 0, "[EOS]": 0, "[PAD]": 0}, args.layers, args.experts)
        aux_layer_ids(args.layers)
    except ValueError as err:
        parser.error(str(err))
    paths = make(args.out, args.layers, args.experts)
    print(json.dumps({name: str(path) for name, path in paths.items()}))


if __name__ == "__main__":
    main()
