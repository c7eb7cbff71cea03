from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.gate.rules import (
    GateSettings,
    crossover,
    failed_levels,
    flag,
    incomparable,
    measuring_starts,
    output_tokens,
    refusals,
    speedups,
    sweep_rounds,
)
from specdeploy.record_types import Figures


def figures(length: float | None = 3.0, tok_s: float = 100.0, **changes: object) -> Figures:
    base = {"completed": 36, "failed": 0, "duration_s": 20.0, "concurrency": 4, "max_tokens": 64,
            "output_tokens_per_s": tok_s, "ttft_ms": {"p50": 50.0, "p99": 90.0}, "itl_ms": {"p50": 10.0, "p99": 20.0},
            "acceptance_rate": None if length is None else (length - 1) / 3, "acceptance_length": length,
            "per_position_acceptance": []}  # fmt: skip
    return Figures(**{**base, **changes})  # type: ignore[arg-type]


def test_a_fall_beyond_the_limit_is_refused_with_the_figure_and_how_much():
    settings = GateSettings(max_regression=0.10)
    assert refusals(figures(2.8, 95.0), figures(3.0, 100.0), settings, speculative=True) == []
    refused = refusals(figures(1.2, 60.0), figures(3.0, 100.0), settings, speculative=True)
    assert refused == [
        "mean acceptance length fell from 3.00 to 1.20 (-60%; serving_bench_max_regression 10%)",
        "output tokens/s fell from 100.00 to 60.00 (-40%; serving_bench_max_regression 10%)",
    ]


def test_another_number_of_speculative_tokens_compares_position_by_position():
    before = figures(4.0, per_position_acceptance=[0.9, 0.8, 0.7])
    fewer = figures(2.7, per_position_acceptance=[0.9, 0.8])  # k 3 -> 2: a shorter mean length, no fall
    assert refusals(fewer, before, GateSettings(), speculative=True) == []
    worse = figures(1.6, per_position_acceptance=[0.5, 0.1])
    assert refusals(worse, before, GateSettings(), True) == [
        "acceptance at draft position 1 fell from 0.90 to 0.50 (-44%; serving_bench_max_regression 10%)",
        "acceptance at draft position 2 fell from 0.80 to 0.10 (-88%; serving_bench_max_regression 10%)",
    ]


def test_tokens_per_second_compare_only_for_the_same_workload():
    other = figures(3.0, 40.0, max_tokens=128)
    assert refusals(other, figures(3.0, 100.0), GateSettings(), speculative=True) == []


def test_throughput_under_another_host_load_does_not_compare_but_acceptance_still_does():
    """The fleet of issue 26: idle 44.72 tok/s, then 20.36 beside two serving engines: not the version's fault."""
    idle, busy = figures(3.0, 44.72, host_load=0.4), figures(3.0, 20.36, host_load=1.6)
    assert incomparable(busy, idle) == "the host was not as busy (load 1.60 per CPU now, 0.40 then)"
    assert refusals(busy, idle, GateSettings(), speculative=True) == []
    worse = figures(1.2, 20.36, host_load=1.6)
    assert refusals(worse, idle, GateSettings(), True) == [
        "mean acceptance length fell from 3.00 to 1.20 (-60%; serving_bench_max_regression 10%)"
    ]
    # Within the tolerance (or unread), a fall is a fall.
    assert incomparable(figures(3.0, 20.0, host_load=0.7), idle) is None
    assert refusals(figures(3.0, 20.0, host_load=0.7), idle, GateSettings(), True)[0].startswith("output tokens/s fell")
    assert incomparable(figures(3.0, 20.0), idle) is None


def test_the_floor_failures_and_a_missing_acceptance_are_refused_without_a_previous_version():
    settings = GateSettings(min_acceptance_length=2.0)
    assert refusals(figures(1.5), None, settings, True) == [
        "mean acceptance length 1.50 is below serving_bench_min_acceptance_length 2.00"
    ]
    assert refusals(figures(None), None, settings, True) == [
        "speculative decoding is on, but the benchmark read no acceptance figure from the engine"
    ]
    assert refusals(figures(None), None, settings, speculative=False) == []
    failed = refusals(figures(3.0, completed=30, failed=6), None, GateSettings(), True)
    assert failed == ["6 of 36 benchmark requests failed"]


def test_the_budget_sizes_the_tokens_per_request():
    settings = GateSettings(budget_s=60, concurrency=4, max_tokens=256)
    # 36 prompts in 0.8 x 30 s at 150 tok/s (all requests in flight together): 100 tokens each.
    assert output_tokens(settings, 36, 150.0, 30.0) == 100
    assert output_tokens(settings, 36, 10_000.0, 30.0) == 256  # the ceiling
    assert output_tokens(settings, 36, 1.0, 30.0) == 8  # the floor
    assert output_tokens(settings, 36, 150.0, -5.0) == 8  # the sizing run ate the budget


@pytest.mark.parametrize(("values", "problem"), [
    ({"budget": 10}, "leaves no time to measure"),
    ({"max_regression": 10}, "is a fraction"),
    ({"concurrency": 0}, "bench_concurrency must be"),
])  # fmt: skip
def test_settings_that_cannot_work_are_refused_before_the_rollout(values, problem):
    assert any(problem in p for p in GateSettings.from_vars(values).problems())
    assert GateSettings.from_vars({}).problems() == []


def test_flags_however_templated():
    assert [flag(v) for v in (True, "True", "yes", 1, False, "False", "no", 0, "")] == [True] * 4 + [False] * 5
    assert GateSettings.from_vars({"gate": "False"}).enabled is False


def test_the_crossover_says_up_to_where_speculation_pays_with_each_figure():
    from specdeploy.gate.rules import at_concurrency  # noqa: PLC0415

    # What users of 8x RTX PRO 6000 report for Kimi-K2.x (docs/engine-facts.md): 92.4 -> 122.0 at 1,
    # 2,245.8 -> 2,222.6 at 128.
    spec = [{"concurrency": 1, "output_tokens_per_s": 122.0}, {"concurrency": 128, "output_tokens_per_s": 2222.6},
            {"concurrency": 4, "error": "killed at its time limit"}]  # fmt: skip
    off = [{"concurrency": 1, "output_tokens_per_s": 92.4}, {"concurrency": 128, "output_tokens_per_s": 2245.8},
           {"concurrency": 4, "output_tokens_per_s": 300.0}]  # fmt: skip
    speedup = speedups(spec, off)
    assert speedup == {1: 1.32, 128: 0.99}  # the level one sweep missed is left out
    assert crossover(speedup) == "EAGLE-3 pays up to 1 concurrent requests on this host (x1.32 at 1, x0.99 at 128)"
    assert crossover({1: 1.2, 4: 1.1}).startswith("EAGLE-3 pays at every measured concurrency on this host, up to 4")
    assert crossover({1: 0.9}) == "EAGLE-3 does not pay on this host at any measured concurrency (x0.90 at 1)"
    assert at_concurrency(speedup, 100) == (128, 0.99) and at_concurrency({}, 4) is None


@pytest.mark.parametrize(("values", "problem"), [
    ({"baseline": "once"}, "serving_bench_baseline: once compares a sweep"),
    ({"sweep": [1, 4], "expected_concurrency": 4}, "set serving_bench_baseline: once"),
])  # fmt: skip
def test_a_baseline_needs_a_sweep_and_an_expected_concurrency_a_baseline(values, problem):
    assert any(problem in p for p in GateSettings.from_vars(values).problems())


@pytest.mark.parametrize(
    ("level", "round_s", "rounds"),
    [
        (1, None, 4),  # the first level: at least 4 requests
        (16, None, 2),  # ... and at least 2 rounds
        (16, 0.5, 8),  # 8 s wanted, a round takes 0.5 s: capped at 8 rounds
        (4, 2.0, 4),
        (64, 30.0, 2),  # a slow level still runs 2 rounds
    ],
)
def test_a_sweep_level_runs_whole_rounds_for_about_eight_seconds(level: int, round_s: float | None, rounds: int):
    assert sweep_rounds(level, round_s) == rounds


def test_a_level_whose_requests_failed_is_no_speed_up() -> None:
    """The H200's first full-depth gate (vLLM 0.33.0, 2026-12-04): random-weight tokens decoded to no
    text, so the client failed most requests; the old rule divided the few that finished and printed
    'pays at every measured concurrency (x9.19 at 16, x4.88 at 64)'."""
    runs = Path(__file__).resolve().parents[2] / "data" / "gpu_truth" / "vllm-0.33-full-depth"
    bench = json.loads((runs / "acc2.3-bench.json").read_text())
    baseline = json.loads((runs / "baseline.json").read_text())
    assert bench["crossover"].startswith("EAGLE-3 pays at every measured concurrency")  # what it said then
    assert speedups(bench["sweep"], baseline["sweep"]) == {}
    assert failed_levels(bench["sweep"], baseline["sweep"]) == [1, 4, 16, 64]
    assert crossover({}, [1, 4, 16, 64]) == ("EAGLE-3's speed-up: no concurrency was measured both with and without "
                                             "speculation; not measured (requests failed) at 1, 4, 16, 64")  # fmt: skip
    whole = [{"concurrency": 1, "output_tokens_per_s": 100.0, "failed": 0}]
    assert speedups(whole, [{"concurrency": 1, "output_tokens_per_s": 80.0, "failed": 1}]) == {}
    assert speedups(whole, [{"concurrency": 1, "output_tokens_per_s": 80.0, "failed": 0}]) == {1: 1.25}


def test_a_first_rollout_starts_the_baseline_and_each_auto_length_beside_the_engine_only_when_measured():
    once = GateSettings(sweep=(1, 4, 16), baseline="once")
    assert measuring_starts(once, True, True, False, 3) == ["the speculation-off baseline"]
    assert measuring_starts(once, True, True, True, 2) == ["the speculation-off baseline", "draft length 1",
                                                          "draft length 2"]  # fmt: skip
    assert measuring_starts(once, False, True, True, 3) == []  # serving_bench: false measures nothing
    assert measuring_starts(once, True, False, True, 3) == []  # no speculation: no baseline to measure
    assert measuring_starts(GateSettings(sweep=(1, 4)), True, True, True, 3) == []  # serving_bench_baseline: never
    assert measuring_starts(GateSettings(baseline="once"), True, True, True, 3) == []  # no sweep
