"""The plots: a point per benchmarked rollout, acceptance bars, a text where nothing was measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.report import plots
from tests.unit.report.helpers import BENCHMARKED, HOST, RUN_IDS, bench, page_of, verdict, write_run


def test_plots_have_one_point_per_benchmarked_rollout_with_its_value(runs: Path) -> None:
    page = page_of(runs)
    throughput = page.one("svg", id="plot-throughput")
    assert throughput.one("title", id="plot-throughput-title").text() == "Output tokens/s over rollouts"
    points = throughput.all("circle", cls="point")
    assert [p.tooltip() for p in points] == [
        "20261201T090000-101: output 400.5 tokens/s",
        "20261201T110000-303: output 250.2 tokens/s (gate refused)",
        "20261201T120000-404: output 410.7 tokens/s",
    ]
    heights = [float(p.attrs["cy"]) for p in points]
    assert heights[1] > heights[0] > heights[2]  # SVG y grows downwards: the lowest value sits lowest
    assert "refused" in points[1].classes and "refused" not in points[0].classes
    ticks = [t.text() for t in throughput.all("text", cls="y-tick")]
    assert ticks == ["0", "100", "200", "300", "400", "500"]

    latency = page.one("svg", id="plot-latency")
    expected = {("ttft-p50", "TTFT p50"): ["41.0", "40.1", "38.0"],
                ("ttft-p99", "TTFT p99"): ["91.0", "90.2", "80.0"],
                ("itl-p50", "ITL p50"): ["11.0", "10.0", "10.0"],
                ("itl-p99", "ITL p99"): ["31.0", "30.0", "30.0"]}  # fmt: skip
    for (series, label), values in expected.items():
        tips = [p.tooltip() for p in latency.one("g", cls=f"series {series}").all("circle")]
        assert tips == [f"{run}: {label} {v} ms" + (" (gate refused)" if run == RUN_IDS[2] else "")
                        for run, v in zip(BENCHMARKED, values, strict=True)]  # fmt: skip
    assert [t.text() for t in latency.all("text", cls="x-tick")] == ["12-01 09:00", "12-01 11:00", "12-01 12:00"]


def test_acceptance_bars_are_the_newest_benchmark_beside_the_previous_version(runs: Path) -> None:
    plot = page_of(runs).one("svg", id="plot-acceptance")
    newest = [b.tooltip() for b in plot.all("rect", cls="newest")]
    previous = [b.tooltip() for b in plot.all("rect", cls="previous")]
    assert newest == [f"position {i}: {v}% (20261201T120000-404)" for i, v in ((1, "90.0"), (2, "70.0"), (3, "50.0"))]
    assert previous == [f"position {i}: {v}% (previous promoted version)" for i, v in ((1, "90.0"), (2, "70.0"),
                                                                                       (3, "50.0"))]  # fmt: skip
    assert [t.text() for t in plot.all("text", cls="x-tick")] == ["1", "2", "3"]
    assert plot.one("title", id="plot-acceptance-title").text().endswith("20261201T120000-404")


def test_without_a_previous_version_only_the_newest_bars(tmp_path: Path) -> None:
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), bench(100.0, positions=(0.8, 0.4)))
    plot = page_of(tmp_path).one("svg", id="plot-acceptance")
    assert len(plot.all("rect", cls="newest")) == 2 and plot.all("rect", cls="previous") == []


def test_no_speculative_decoding_has_no_acceptance_bars(tmp_path: Path) -> None:
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), bench(100.0, rate=None, length=None, positions=()))
    page = page_of(tmp_path)
    assert "no per-position acceptance" in page.one(id="plot-acceptance").text()
    assert len(page.one("svg", id="plot-throughput").all("circle")) == 1
    row = page.one("tr", cls="rollout")
    assert row.one("td", cls="acc-rate").text() == "—" and row.one("td", cls="acc-length").text() == "—"


@pytest.mark.parametrize("with_rollouts", [True, False])
def test_a_host_without_benchmarks_says_so_instead_of_empty_plots(tmp_path: Path, with_rollouts: bool) -> None:
    (tmp_path / HOST).mkdir()
    if with_rollouts:
        write_run(tmp_path / HOST, "20261201T090000-1", verdict())
        write_run(tmp_path / HOST, "20261201T100000-2", verdict("STALLED"))
    page = page_of(tmp_path)
    assert page.all("svg", cls="plot") == []
    for plot in ("plot-acceptance", "plot-throughput", "plot-latency", "plot-speedup", "plot-schedule"):
        assert page.one("p", id=plot).text() == plots.NO_BENCHMARK
    assert len(page.all("tr", cls="rollout")) == (2 if with_rollouts else 0)


def test_the_speedup_plot_draws_each_rollouts_speedup_against_concurrency_and_the_break_even(tmp_path: Path) -> None:
    line = "EAGLE-3 pays up to 4 concurrent requests on this host (x1.32 at 1, x1.10 at 4, x0.97 at 16)"
    swept = {**bench(100.0), "speedup": {"1": 1.32, "4": 1.1, "16": 0.97}, "crossover": line}
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), bench(90.0))  # no baseline: not drawn
    write_run(tmp_path / HOST, "20261201T100000-2", verdict(), swept)
    plot = page_of(tmp_path).one("svg", id="plot-speedup")
    assert plot.one("title", id="plot-speedup-title").text() == f"EAGLE-3 speed-up by concurrency: {line}"
    assert [p.tooltip() for p in plot.all("circle", cls="point")] == [
        "20261201T100000-2: x1.32 at 1",
        "20261201T100000-2: x1.10 at 4",
        "20261201T100000-2: x0.97 at 16",
    ]
    assert [t.text() for t in plot.all("text", cls="x-tick")] == ["1", "4", "16"]
    (even,) = plot.all("line", cls="break-even")
    above, below = (float(p.attrs["cy"]) for p in plot.all("circle", cls="point")[1:])
    assert above < float(even.attrs["y1"]) < below  # x1.10 above the break-even line, x0.97 under it


def test_without_a_baseline_the_speedup_plot_says_how_to_get_one(runs: Path) -> None:
    assert "serving_bench_baseline: once" in page_of(runs).one("p", id="plot-speedup").text()


def test_nice_ticks_end_on_a_round_value_above_the_top() -> None:
    assert plots.nice_ticks(447.9) == [0, 100, 200, 300, 400, 500]
    assert plots.nice_ticks(142.6) == [0, 50, 100, 150]
    assert plots.nice_ticks(0.0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_the_schedule_plot_draws_each_length_auto_chose_from_and_the_schedule_it_proved(tmp_path: Path) -> None:
    """issue 37: serving_speculative_schedule: auto's choice, from bench.json's `schedule`."""
    schedule = {"schedule": "1-1:2,2-4:0", "said": "1-1: 2, 2-4: none", "drafts": True,
                "speeds": {"0": {"1": 50.0, "2": 100.0, "4": 160.0}, "1": {"1": 55.0, "2": 98.0, "4": 150.0},
                           "2": {"1": 60.0, "2": 90.0, "4": 140.0}}}  # fmt: skip
    chose = {**bench(100.0), "speedup": {"1": 1.18, "2": 0.99, "4": 1.0}, "crossover": "c", "schedule": schedule}
    write_run(tmp_path / HOST, "20261201T100000-2", verdict(), chose)
    plot = page_of(tmp_path).one("svg", id="plot-schedule")
    title = "Draft schedule (auto), 20261201T100000-2: 1-1: 2, 2-4: none"
    assert plot.one("title", id="plot-schedule-title").text() == title
    tips = {css: [p.tooltip() for p in plot.one("g", cls=f"series {css}").all("circle")]
            for css in ("length-1", "length-2", "schedule")}  # fmt: skip
    assert tips == {"length-1": ["length 1: x1.10 at 1", "length 1: x0.98 at 2", "length 1: x0.94 at 4"],
                    "length-2": ["length 2: x1.20 at 1", "length 2: x0.90 at 2", "length 2: x0.88 at 4"],
                    "schedule": [f"the schedule: {s}" for s in ("x1.18 at 1", "x0.99 at 2", "x1.00 at 4")]}  # fmt: skip
    other = tmp_path / "other"
    write_run(other / HOST, "20261201T100000-2", verdict(), bench(90.0))  # benchmarked, no schedule
    assert "serving_speculative_schedule: auto" in page_of(other).one(id="plot-schedule").text()
