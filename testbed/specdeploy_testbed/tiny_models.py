"""Tiny targets and a matching MLA EAGLE-3 drafter, made locally (no model hub).

Two target architectures:
- `deepseek_v3`: a DeepSeek-V3 text model (`DeepseekV3ForCausalLM`);
- `kimi_k25`: the user's Kimi-K2.5 shape (`KimiK25ForConditionalGeneration`): the same DeepSeek-V3
  text model as `text_config`, wrapped with a tiny MoonViT vision tower and projector, in the hub
  checkpoint's config keys and tensor names, with a `preprocessor_config.json` for its media.

Random weights, a byte-level BPE tokenizer trained here. With `always_accept`, the output layers of
target and drafter are zeroed, so both always pick the same token and the drafter's proposals are
really accepted (acceptance > 0 is then testable).

Shapes a GPU engine accepts: the real model's MLA head sizes (qk_nope 128, qk_rope 64, v 128,
kv_lora 512; vLLM's GPU MLA backends refuse others, and the CPU decode kernel wants latent 576) and
Kimi-K2.5's yarn `rope_scaling` (the MLA drafter's rotary embedding reads its `factor`), with few
heads, layers and experts. The drafter's aux layer ids are ones vLLM and SGLang read alike (see
specdeploy.engine_image.drafter.aux_layer_readings).

Run with the engine's python:
    python -m specdeploy_testbed.tiny_models OUT [--always-accept] [--architecture kimi_k25]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

try:  # `python -m specdeploy_testbed.tiny_models`: the package is on the path
    from specdeploy_testbed import tiny_configs
except ModuleNotFoundError:  # run as a script (the test bed's role), next to a copy of tiny_configs.py
    import tiny_configs  # type: ignore[no-redef]


def text_model(cfg: dict[str, Any], always_accept: bool) -> DeepseekV3ForCausalLM:
    torch.manual_seed(0)
    # A copy: the config class turns rope_scaling into rope_parameters in place.
    config = DeepseekV3Config(**copy.deepcopy(cfg))
    model: DeepseekV3ForCausalLM = DeepseekV3ForCausalLM(config).to(torch.bfloat16)  # type: ignore[no-untyped-call]
    if always_accept:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    return model


def make_deepseek_target(out: Path, always_accept: bool) -> dict[str, Any]:
    names = {"bos_token": "<|begin|>", "eos_token": "<|end|>", "pad_token": "<|pad|>"}
    ids = tiny_configs.train_tokenizer(out, tiny_configs.SPECIALS, tiny_configs.CHAT_TEMPLATE, names)
    cfg = {**tiny_configs.target_config(), "bos_token_id": ids["<|begin|>"], "eos_token_id": ids["<|end|>"]}
    text_model(cfg, always_accept).save_pretrained(out, safe_serialization=True)
    # save_pretrained drops the router keys transformers does not model, and writes rope_scaling and
    # rope_theta as rope_parameters (transformers 5); put them back as the hub checkpoint has them.
    saved = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(tiny_configs.restore_hub_keys(saved, cfg), indent=2))
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
    ids = tiny_configs.train_tokenizer(out, tiny_configs.KIMI_SPECIALS, tiny_configs.KIMI_CHAT_TEMPLATE, names)
    text = {**tiny_configs.target_config(), "bos_token_id": ids["[BOS]"], "eos_token_id": ids["[EOS]"]}
    cfg = tiny_configs.kimi_config(text, ids)
    # The hub checkpoint nests the text model's tensors under language_model, named as
    # save_pretrained writes them (one tensor per expert, not transformers' fused in-memory form).
    with tempfile.TemporaryDirectory() as tmp:
        text_model(text, always_accept).save_pretrained(tmp, safe_serialization=True)
        tensors = {f"language_model.{k}": v for k, v in load_file(str(Path(tmp) / "model.safetensors")).items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors | vision_tensors(cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(tiny_configs.kimi_preprocessor_config(), indent=2))
    return text


def make_target(out: Path, always_accept: bool, architecture: str = "deepseek_v3") -> dict[str, Any]:
    """Writes the target folder; returns its text model's config (what the drafter must match)."""
    make = make_kimi_target if architecture == "kimi_k25" else make_deepseek_target
    return make(out, always_accept)


def make_drafter(out: Path, target: dict[str, Any], always_accept: bool) -> None:
    torch.manual_seed(1)
    cfg = tiny_configs.drafter_config(target)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in tiny_configs.drafter_shapes(cfg).items():  # in order: the seed gives each its weights
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(*shape, dtype=torch.bfloat16)
        elif name == "lm_head.weight" and always_accept:
            tensors[name] = torch.zeros(*shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(*shape) * 0.02).to(torch.bfloat16)
    # Draft token i is target token i + d2t[i]: the first DRAFT_VOCAB ids map onto themselves.
    tensors["d2t"] = torch.zeros(tiny_configs.DRAFT_VOCAB, dtype=torch.long)
    tensors["t2d"] = torch.arange(tiny_configs.VOCAB) < tiny_configs.DRAFT_VOCAB
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
    parser.add_argument("--architecture", choices=tiny_configs.ARCHITECTURES, default="deepseek_v3",
                        help="the target's")  # fmt: skip
    args = parser.parse_args()
    target = make_target(args.out / "target", args.always_accept, args.architecture)
    make_drafter(args.out / "drafter", target, args.always_accept)
    for folder in (args.out / "target", args.out / "drafter"):
        write_manifest(folder)
    print(json.dumps({"target": str(args.out / "target"), "drafter": str(args.out / "drafter")}))


if __name__ == "__main__":
    main()
