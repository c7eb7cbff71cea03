"""The engine's memory accounting read from real start-up logs (tests/data/real_logs, each with its source)."""

from __future__ import annotations

from pathlib import Path

from specdeploy.watch.memory import memory_figures

LOGS = Path(__file__).resolve().parents[2] / "data" / "real_logs"


def test_vllm_on_the_h200_states_weights_kv_memory_and_tokens() -> None:
    lines = (LOGS / "h200-vllm-0.26-tiny-kimi-eagle3-ready.log").read_text().splitlines()
    found = memory_figures(lines)
    assert found.weights_gib == [0.06] and found.weights_load_s == [0.680289]
    assert found.kv_available_gib == [127.32] and found.kv_tokens == [16_953_008]
    assert found.cuda_graph_gib == [0.46]
    assert found.max_concurrency == [8277.84] and found.max_concurrency_at_tokens == [2048]  # its own line in 0.26
    assert found.summary() == "weights 0.06 GiB; KV memory 127.32 GiB; KV 16,953,008 tokens; x8277.84 at 2,048 tokens"


def test_sglang_states_each_model_and_each_pool_in_load_order() -> None:
    lines = (LOGS / "h200-sglang-0.5.17-ds3-eagle3-default-backend-ready.log").read_text().splitlines()
    found = memory_figures(lines)
    assert found.weights_model == ["DeepseekV3ForCausalLM", "Eagle3DeepseekV2ForCausalLM"]
    assert found.weights_gib == [0.03, 0.01] and found.kv_tokens == [16_792_380, 16_792_380]
    assert found.kv_gib == [108.10, 18.02]


def test_the_lines_the_pinned_vllm_adds_are_read() -> None:
    """vLLM 0.33.0's kv_cache_utils.update_kv_cache_capacity joins the concurrency to the size line."""
    line = ("(EngineCore pid=9) INFO 12-04 10:00:00 [kv_cache_utils.py:1147] GPU KV cache size: 1,234,560 tokens, "
            "Maximum concurrency for 2,048 tokens per request: 602.81x")  # fmt: skip
    found = memory_figures([line])
    assert found.kv_tokens == [1_234_560] and found.max_concurrency == [602.81]
    assert found.max_concurrency_at_tokens == [2048]


def test_a_log_without_the_figures_says_so() -> None:
    assert memory_figures(["INFO starting"]).summary() == "no memory figures in the log"


def test_the_verdict_carries_the_engines_figures_and_they_stand_beside_a_prediction() -> None:
    """SGLang 0.5.23 at Kimi-K2.5's full depth on the H100 (2026-12-07): its log's KV figure, through the
    watch's verdict, beside the fit preflight predicted for that run (tests/unit/preflight/test_memory.py)."""
    from specdeploy.watch.memory import against_prediction  # noqa: PLC0415

    lines = (LOGS / "h100-sglang-0.5.23-kimi-k25-full-depth-16e-spec-off-ready.log").read_text().splitlines()
    found = memory_figures(lines).to_dict()
    assert found["kv_tokens"] == [281_803] and found["weights_gib"] == [46.0]
    assert against_prediction(found, 288_585) == {"engine_tokens": 281_803, "predicted_tokens": 288_585,
                                                  "error_pct": 2.4}  # fmt: skip
    assert against_prediction(found, 0) is None and against_prediction({}, 288_585) is None
