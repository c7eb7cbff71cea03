"""A tiny DeepSeek-V3-architecture target and a matching MLA EAGLE-3 drafter, made locally.

No model hub: random weights, a byte-level BPE tokenizer trained here. With `always_accept`,
the output layers of both are zeroed, so both always pick the same token and the drafter's
proposals are really accepted (acceptance > 0 is then testable). Shapes are fixed by the CPU
MLA decode kernel (latent 576 = kv_lora_rank 512 + qk_rope_head_dim 64); see ../shared/ENGINE_FACTS.md.

Run with the engine's python:  python -m specdeploy.engine_side.tiny_models OUT [--always-accept]
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, PreTrainedTokenizerFast

VOCAB = 2048
DRAFT_VOCAB = 1024
SPECIALS = ["<|begin|>", "<|end|>", "<|user|>", "<|assistant|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
CORPUS = [
    "speculative decoding drafts tokens that the target model verifies in one pass",
    "the quick brown fox jumps over the lazy dog while the engine loads its weights",
    "mixture of experts routes each token to a few experts and a shared expert",
    "multi head latent attention compresses keys and values into a small latent",
] * 64


def target_config() -> dict[str, Any]:
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
        "bos_token_id": VOCAB - len(SPECIALS),
        "eos_token_id": VOCAB - len(SPECIALS) + 1,
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


def train_tokenizer(out: Path) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.add_special_tokens(SPECIALS)  # at the end of the vocabulary
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>", pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def make_target(out: Path, always_accept: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    cfg = target_config()
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**cfg)).to(torch.bfloat16)
    if always_accept:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    model.save_pretrained(out, safe_serialization=True)
    # save_pretrained drops the router keys transformers does not model; put them back.
    saved = json.loads((out / "config.json").read_text())
    saved.update({k: cfg[k] for k in ("topk_method", "scoring_func", "n_group", "topk_group")})
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    train_tokenizer(out)
    return cfg


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
    args = parser.parse_args()
    target = make_target(args.out / "target", args.always_accept)
    make_drafter(args.out / "drafter", target, args.always_accept)
    for folder in (args.out / "target", args.out / "drafter"):
        write_manifest(folder)
    print(json.dumps({"target": str(args.out / "target"), "drafter": str(args.out / "drafter")}))


if __name__ == "__main__":
    main()
