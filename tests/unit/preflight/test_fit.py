"""The KV bytes a token takes (specdeploy.preflight.fit), held to the pinned engines' own KV figures on
the lent GPUs (tests/data/gpu_truth: each run's memory.json, read from the engine's log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.preflight import fit
from specdeploy_testbed import real_shapes

RUNS = Path(__file__).parents[2] / "data" / "gpu_truth"
IDS = {"[BOS]": 0, "[EOS]": 1, "[PAD]": 2, "<|media_pad|>": 3}
# (memory.json, command.json) of each run: vLLM 0.33 on the H100, SGLang 0.5.23 on the H100 and the H200
RECORDED = [
    ("vllm-0.33-full-depth-h100/spec-off-memory.json", "vllm-0.33-full-depth-h100/spec-off-command.json"),
    ("vllm-0.33-full-depth-h100/acc2.3-memory.json", "vllm-0.33-full-depth-h100/acc2.3-command.json"),
    ("vllm-0.33-full-depth-h100/acc1.6-memory.json", "vllm-0.33-full-depth-h100/acc1.6-command.json"),
    ("sglang-0.5.23-full-depth-h100/spec-off-memory.json", "sglang-0.5.23-full-depth-h100/spec-off-command.json"),
    ("sglang-0.5.23-full-depth-h100/acc2.3-memory.json", "sglang-0.5.23-full-depth-h100/acc2.3-command.json"),
    ("sglang-0.5.23-full-depth-h200/spec-off-timeout/memory.json",
     "sglang-0.5.23-full-depth-h200/spec-off-timeout/command.json"),
]  # fmt: skip


@pytest.mark.parametrize(("memory", "command"), RECORDED)
def test_the_kv_tokens_are_the_engines_own_within_a_tenth_of_a_percent(memory: str, command: str) -> None:
    """The engine's KV memory (vLLM's "Available KV cache memory", SGLang's "KV size" of the target and
    the drafter's pools) divided by the predicted bytes a token gives the engine's own token count."""
    figures = json.loads((RUNS / memory).read_text())
    ran = json.loads((RUNS / command).read_text())["rendered_command"]
    target = real_shapes.target_config(IDS, layers=61, experts=16)
    speculative = any(a in ran for a in ("--speculative-config", "--speculative-algorithm"))
    drafter = real_shapes.drafter_config(target) if speculative else None
    per_token = fit.kv_bytes_per_token(target, drafter=drafter)
    kv_bytes = sum(figures.get("kv_available_gib") or figures["kv_gib"]) * fit.GIB
    predicted, said = fit.kv_tokens(kv_bytes, per_token), figures["kv_tokens"][0]
    assert abs(predicted - said) / said < 0.001, (per_token, predicted, said)


def test_mla_keeps_one_latent_a_layer_on_every_tp_rank_and_other_attention_splits_its_kv_heads() -> None:
    target = real_shapes.target_config(IDS, layers=61, experts=16)
    assert fit.kv_bytes_per_token(target) == 61 * (512 + 64) * 2 == 70_272
    assert fit.kv_bytes_per_token(target, "fp8", tensor_parallel=8) == 61 * 576  # the latent is not split
    assert fit.kv_bytes_per_token(target, pipeline_parallel=2) == 31 * 576 * 2  # the first stage's 31 layers
    gqa = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    assert fit.kv_bytes_per_token(gqa) == 32 * 2 * 8 * 128 * 2
    assert fit.kv_bytes_per_token(gqa, tensor_parallel=4) == 32 * 2 * 2 * 128 * 2
    with pytest.raises(ValueError, match="KV dtype 'int3'"):
        fit.kv_bytes_per_token(gqa, "int3")


def test_a_length_beyond_the_config_and_a_cache_short_of_one_sequence_are_refused_naming_the_variable() -> None:
    target = real_shapes.target_config(IDS, layers=61, experts=16)
    allowed = target["text_config"]["max_position_embeddings"]
    assert fit.length_problems(target, allowed) == []
    (too_long,) = fit.length_problems(target, allowed + 1)
    assert too_long.startswith(f"serving_max_model_len={allowed + 1}: beyond the model's max_position_embeddings")
    per_token = fit.kv_bytes_per_token(target)
    assert fit.sequence_problems(1 * fit.GIB, per_token, 4096) == []
    (short,) = fit.sequence_problems(0.25 * fit.GIB, per_token, 99_999)  # the serving_max_model_len
    assert "the KV cache holds 3,819 tokens" in short and "less than one sequence" in short


def test_the_preflight_role_reads_the_hosts_config_json_as_slurp_gives_it() -> None:
    import base64  # noqa: PLC0415

    config = base64.b64encode(json.dumps({"text_config": {"max_position_embeddings": 2048}}).encode()).decode()
    assert fit.config_problems(config, 2048) == [] and fit.config_problems("", 99_999) == []  # not there yet
    (refused,) = fit.config_problems(config, 99_999)
    assert refused.startswith("serving_max_model_len=99999: beyond the model's max_position_embeddings (2048")
    assert fit.config_problems(base64.b64encode(b"{nope").decode(), 512)[0].startswith(
        "the model's config.json is not JSON"
    )
