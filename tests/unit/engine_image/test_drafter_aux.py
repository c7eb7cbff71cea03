"""EAGLE-3 aux layer ids as each pinned engine reads them from the drafter (drafter.aux_layer_readings,
mirroring vLLM 0.33.0's and SGLang 0.5.23's deepseek_v2.py), refused before any build when the image's
engine would crash on them or read them other than written."""

from __future__ import annotations

import json

import pytest

from specdeploy import pins
from specdeploy.engine_image import drafter

VLLM = ("vllm", pins.VLLM_CUDA)
VLLM_CPU = ("vllm", pins.VLLM_CPU)
SGLANG = ("sglang", pins.SGLANG_CUDA)
MLA = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": 256, "vocab_size": 2048}


def mla(ids: list[int]) -> dict[str, object]:
    """A drafter with its ids where both engines look (vLLM: top level; SGLang: eagle_config)."""
    return {**MLA, "eagle_aux_hidden_state_layer_ids": ids, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}


def target(layers: int, model_type: str = "deepseek_v3") -> dict[str, object]:
    return {"model_type": model_type, "hidden_size": 256, "vocab_size": 2048, "num_hidden_layers": layers}


def problems(ids: list[int], engine: tuple[str, str], layers: int) -> list[str]:
    return drafter.engine_problems(mla(ids), "mla-eagle3", engine, target(layers))


def test_the_readings_follow_each_engines_source():
    assert drafter.aux_layer_readings([1, 2, 3], "vllm") == [1, 2, 3]
    assert drafter.aux_layer_readings([1, 2, 3], "sglang") == [2, 3, 4]  # `if layer_ids[0] == 1`: +1
    assert drafter.aux_layer_readings([2, 3, 4], "sglang") == [2, 3, 4]
    assert drafter.aux_layer_readings([0, 1, 2], "sglang") == [0, 1, 2]  # only a first id of 1 shifts
    assert drafter.aux_layer_readings([3, 1, 2], "sglang") == [3, 1, 2]
    assert drafter.aux_layer_readings([], "sglang") == []


def test_ids_starting_at_1_are_refused_for_sglang_and_accepted_for_vllm():
    assert problems([1, 2, 3], VLLM, 4) == []
    assert problems([1, 2, 3], VLLM_CPU, 4) == []
    (shifted,) = problems([1, 2, 3], SGLANG, 4)
    assert f"SGLang {pins.SGLANG_CUDA} reads eagle_aux_hidden_state_layer_ids [1, 2, 3] as layers [2, 3, 4]" in shifted
    assert "set_eagle3_layers_to_capture" in shifted and "captured 2 of 3 aux hidden states" in shifted
    assert "start above 1 and end below the last layer, read alike by vLLM and SGLang" in shifted
    # On a deeper target the shifted layers exist: no crash, but other states than the drafter's ids name.
    (silent,) = problems([1, 2, 3], SGLANG, 8)
    assert "as layers [2, 3, 4]" in silent and "captured" not in silent


def test_layer_0_is_refused_for_vllm():
    (zero,) = problems([0, 1, 2], VLLM, 6)
    assert "[0, 1, 2]" in zero and "1 … 5" in zero and "layer 0 has no residual" in zero
    assert problems([0, 1, 2], SGLANG, 6) == []  # SGLang's layer 0 input is the embedding (served on the H200)


def test_ids_above_1_and_below_the_last_layer_are_read_alike_by_both():
    for engine in (VLLM, VLLM_CPU, SGLANG):
        assert problems([2, 3, 4], engine, 6) == []
    assert drafter.aux_layer_readings([2, 3, 4], "vllm") == drafter.aux_layer_readings([2, 3, 4], "sglang")


@pytest.mark.parametrize("engine", [VLLM, SGLANG])
def test_layers_past_the_last_are_refused(engine):
    (past,) = problems([2, 3, 6], engine, 6)
    assert "[2, 3, 6]" in past and "… 5" in past
    (dup,) = problems([2, 2, 3], engine, 6)
    assert "distinct" in dup


def test_each_engine_reads_the_ids_where_it_looks():
    top_only = {**MLA, "eagle_aux_hidden_state_layer_ids": [2, 3, 4]}
    nested_only = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3, 4]}}
    assert drafter.engine_problems(top_only, "mla-eagle3", VLLM, target(6)) == []
    (ignored,) = drafter.engine_problems(top_only, "mla-eagle3", SGLANG, target(6))
    assert "only from eagle_config.eagle_aux_hidden_state_layer_ids" in ignored and "default layers" in ignored
    assert drafter.engine_problems(nested_only, "mla-eagle3", SGLANG, target(6)) == []
    (v2,) = drafter.engine_problems(nested_only, "mla-eagle3", VLLM, target(6))
    assert "V2 model runner" in v2 and "top-level eagle_aux_hidden_state_layer_ids" in v2
    split = {**top_only, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    assert any("differs from eagle_config" in p for p in drafter.engine_problems(split, "mla-eagle3", VLLM, None))


def test_the_shift_is_deepseeks_only():
    """SGLang's Llama shifts every id (sglang/srt/models/llama.py): not the DeepSeek rule, not checked."""
    llama = drafter.engine_problems(mla([1, 2, 3]), "mla-eagle3", SGLANG, target(8, "llama"))
    assert llama == []
    kimi = drafter.engine_problems(mla([1, 2, 3]), "mla-eagle3", SGLANG, target(8, "kimi_k2"))
    assert kimi and "as layers [2, 3, 4]" in kimi[0]


def test_the_build_check_passes_the_engine_through():
    """problems() and check_on_host() (the build's action plugin) reach the engine-aware rule."""
    files = {"config.json": "a" * 64}
    manifest = f"{'a' * 64}  config.json\n"
    kimi = '{"model_type": "kimi_k25", "text_config": {"model_type": "deepseek_v3", "hidden_size": 256, ' \
           '"vocab_size": 2048, "num_hidden_layers": 4}}'  # fmt: skip
    config = json.dumps(mla([1, 2, 3]))
    assert drafter.problems(config, manifest, files, kimi, VLLM) == []
    (found,) = drafter.problems(config, manifest, files, kimi, SGLANG)
    assert "as layers [2, 3, 4]" in found
    read = drafter.DrafterOnHost(files, {"config.json": config, "SHA256SUMS": manifest, "target": kimi}, [], True)
    assert drafter.check_on_host(read, "/d", "deploy", SGLANG) == [found]
