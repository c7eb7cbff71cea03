"""serving_speculative_schedule's rules, held to vLLM 0.33's own (vllm/v1/spec_decode/dynamic/utils.py), its
lookup, and the choice `auto` makes from measured speeds (issue 37)."""

from __future__ import annotations

import json

import pytest

from specdeploy import draft_schedule as ds
from specdeploy.serve.config import ServingConfig

BASE = {"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m"}


@pytest.mark.parametrize(
    "good", ["", "auto", [[1, 4, 3], [5, 256, 0]], "1-4:3, 5-256:1", [[1, 1, 2]], [[9, 64, 1], [1, 8, 2]]]
)
def test_good_schedules_pass(good):
    assert ds.problem(good) is None


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ([], '"", auto, or ranges'),
        ("fast", "start-end:length"),
        ([[1, 4]], "[start, end, length] entries"),
        ([[1, 4, "3"]], "[start, end, length] entries"),
        ([[0, 4, 3]], "positive batch sizes"),
        ([[1, 4, 3], [5, 2, 1]], "start is at most their end"),
        ([[1, 4, -1]], "draft lengths of 0 or more"),
        ([[1, 8, 3], [4, 16, 1]], "do not overlap (1-8:3 and 4-16:1)"),
        ([[2, 4, 1]], "first starts at 1"),  # the error vLLM raises only once the model is loaded
    ],
)
def test_bad_schedules_are_refused_with_vllms_rule(bad, said):
    assert said in (ds.problem(bad) or "")


def test_the_config_keeps_one_text_whatever_form_the_inventory_wrote():
    assert ds.canonical([[5, 256, 1], [1, 4, 3]]) == ds.canonical("1-4:3,5-256:1") == "1-4:3,5-256:1"
    assert ds.vllm_words("1-4:3,5-256:1") == [[1, 4, 3], [5, 256, 1]]
    with pytest.raises(ValueError, match="leave num_speculative_tokens_per_batch_size out"):
        ds.vllm_words("auto")  # never [] (vLLM half-enables on it)


def test_the_lookup_is_vllms_a_gap_takes_the_range_before_the_tail_the_last():
    spans = ds.parse("1-16:3,32-128:2")
    assert [ds.length_at(spans, b) for b in (1, 16, 17, 31, 32, 128, 500)] == [3, 3, 3, 3, 2, 2, 2]


def test_auto_picks_the_fastest_length_per_level_each_holding_up_to_the_next():
    speeds = {0: {1: 10.0, 2: 19.0, 4: 40.0}, 1: {1: 12.0, 2: 20.0, 4: 35.0}, 2: {1: 14.0, 2: 18.0, 4: 30.0}}
    assert ds.text(ds.choose(speeds, 64)) == "1-1: 2, 2-3: 1, 4-64: none"
    # Neighbours with one length merge; a length within TIE of the fastest keeps the range before it.
    tied = {0: {1: 10.0, 2: 10.0}, 1: {1: 13.0, 2: 12.9}, 2: {1: 12.0, 2: 13.0}}
    assert ds.choose(tied, 8) == (ds.Span(1, 8, 1),)
    chosen = ds.chosen({0: {1: 10.0}, 1: {1: 9.0}}, 0)
    assert chosen["schedule"] == "1-1:0" and not chosen["drafts"] and chosen["speeds"]["1"] == {"1": 9.0}


def test_a_length_missing_at_a_level_is_said():
    with pytest.raises(ValueError, match="concurrency 4"):
        ds.choose({0: {1: 1.0}, 1: {1: 2.0, 4: 0.0}}, 4)


def config(**fields):
    return ServingConfig.from_vars({**BASE, **fields})


def test_vllm_renders_the_ranges_in_its_speculative_config_and_one_length_without_them():
    cfg = config(speculative_schedule=[[1, 4, 3], [5, 256, 1]])
    assert cfg.problems() == []
    assert '"num_speculative_tokens_per_batch_size":[[1,4,3],[5,256,1]]' in " ".join(cfg.command())
    assert "num_speculative_tokens_per_batch_size" not in " ".join(config().command())
    # auto renders nothing until the rollout has chosen; then what it chose, under the declared digest.
    auto = config(speculative_schedule="auto")
    assert "per_batch_size" not in " ".join(auto.command())
    chosen = ServingConfig.from_vars({**BASE, "speculative_schedule": "auto", "resolved_schedule": "1-2:3,3-8:0"})
    assert '"num_speculative_tokens_per_batch_size":[[1,2,3],[3,8,0]]' in " ".join(chosen.command())
    assert chosen.digest() == auto.digest() != config().digest()
    # One length for every range: said as num_speculative_tokens (no per-batch schedule, which would turn
    # off vLLM's uniform decode padding and its full CUDA graphs).
    one = ServingConfig.from_vars({**BASE, "speculative_schedule": "auto", "resolved_schedule": "1-1:2,2-4:2"})
    spec = json.loads(one.command()[one.command().index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 2 and "num_speculative_tokens_per_batch_size" not in spec
    off = ServingConfig.from_vars({**BASE, "speculative_schedule": "auto", "resolved_schedule": "1-8:0"})
    assert "--speculative-config" not in off.command() and not off.drafts


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"speculative_schedule": [[1, 4, 5]]}, "drafts 5 tokens, more than serving_num_speculative_tokens (3)"),
        ({"speculative_schedule": [[1, 256, 0]]}, "drafts nothing at any batch size: set serving_speculative_method"),
        ({"speculative_schedule": "auto", "speculative_method": "none"}, "needs a drafter"),
        ({"speculative_schedule": "auto", "nnodes": 2, "master_addr": "10.0.0.1"}, "does not run on a multi-node"),
        (
            {"speculative_schedule": [[2, 4, 1]]},
            "serving_speculative_schedule='[[2, 4, 1]]': must be ranges whose first",
        ),
        ({"engine": "sglang", "speculative_schedule": "auto"}, "--speculative-adaptive"),
    ],
)
def test_what_the_engine_would_refuse_late_or_do_silently_is_refused_before_any_host(fields, said):
    assert any(said in p for p in config(**fields).problems()), config(**fields).problems()


def test_drafts_are_expected_only_where_the_schedule_drafts():
    """The READY completion (one request) and the gate's run (its concurrency) wait for drafts only where the
    schedule drafts there: a schedule with no drafts at one request would otherwise never be READY."""
    late = config(speculative_schedule=[[1, 1, 0], [2, 8, 2]])
    assert (late.drafts_within(1), late.drafts_within(4)) == (False, True)
    assert config().drafts_within(1) and not config(speculative_method="none").drafts_within(4)
    assert not config(speculative_schedule="auto").drafts_within(64)  # not chosen yet: nothing to wait for
    chosen = ServingConfig.from_vars({**BASE, "speculative_schedule": "auto", "resolved_schedule": "1-2:1,3-8:0"})
    assert chosen.drafts_within(1) and not ds.drafts_within(ds.parse("1-2:0,3-8:1"), 2)
