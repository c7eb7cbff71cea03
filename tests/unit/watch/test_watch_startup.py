"""The start-up table (specdeploy.watch.startup), on the stages of a real READY verdict of the test
bed's engine (.state/runs/testbed-1/20261201T222059-94342/verdict.json, 2026-12-01)."""

from __future__ import annotations

from specdeploy.watch.startup import render, startup_table

REAL_STAGES = [{"stage": "launched", "at_s": 0.0}, {"stage": "importing engine", "at_s": 13.33},
               {"stage": "resolving config", "at_s": 13.33},
               {"stage": "initialising distributed (NCCL/gloo)", "at_s": 51.07},
               {"stage": "loading weights", "at_s": 63.78}, {"stage": "profiling KV cache", "at_s": 66.0},
               {"stage": "API server up", "at_s": 69.95}]  # fmt: skip
REAL_ELAPSED = 70.93


def test_the_stages_are_in_order_and_add_up_to_the_time_to_ready():
    rows = startup_table(REAL_STAGES, REAL_ELAPSED)
    assert [r["stage"] for r in rows] == [s["stage"] for s in REAL_STAGES]
    assert [r["began_s"] for r in rows] == sorted(r["began_s"] for r in rows)
    assert all(r["seconds"] >= 0 for r in rows)
    assert abs(sum(r["seconds"] for r in rows) - REAL_ELAPSED) < 0.05
    assert rows[3] == {"stage": "initialising distributed (NCCL/gloo)", "began_s": 51.07, "seconds": 12.71}
    assert rows[-1]["seconds"] == 0.98  # API up to the proof of a real completion


def test_stages_seen_out_of_enum_order_are_sorted_by_when_they_began():
    rows = startup_table([{"stage": "b", "at_s": 5.0}, {"stage": "a", "at_s": 1.0}], 9.0)
    assert [(r["stage"], r["seconds"]) for r in rows] == [("a", 4.0), ("b", 4.0)]
    assert startup_table([], 3.0) == []


def test_the_printed_table_gives_each_share_and_the_total():
    lines = render(startup_table(REAL_STAGES, REAL_ELAPSED))
    assert lines[0].startswith("launched") and lines[0].rstrip().endswith("19%")
    assert lines[-1].split() == ["to", "READY", "70.9", "s"]
    assert len(lines) == len(REAL_STAGES) + 1
