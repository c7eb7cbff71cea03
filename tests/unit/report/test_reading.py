"""Reading a host's run folders: verdict.json and bench.json as records, a bad file noted and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.record_types import Figures
from specdeploy.report import pages, reading
from tests.unit.report.helpers import HOST, REFUSAL, RUN_IDS, bench, parse_page, verdict, write_run


def test_rollouts_are_read_oldest_first_and_cut_to_the_last_n(runs: Path) -> None:
    history = reading.read_host(runs / HOST, last=3)
    assert [r.run_id for r in history.rollouts] == RUN_IDS[2:]
    assert history.found == 5 and history.notes == ()  # the image build's folder is not a rollout
    refused = history.rollouts[0]
    assert refused.bench is not None and refused.bench.figures.output_tokens_per_s == 250.2
    assert refused.bench.previous is not None and refused.bench.previous.output_tokens_per_s == 400.5
    assert refused.stages[-1] == reading.Stage("API server up", 33.22)


def test_gate_outcomes_are_passed_refused_with_the_problem_or_not_run(runs: Path) -> None:
    outcomes = [r.gate_outcome for r in reading.read_host(runs / HOST).rollouts]
    assert outcomes == ["passed", "not run", f"refused: {REFUSAL}", "passed", "not run"]


def test_a_malformed_bench_json_is_noted_and_skipped(tmp_path: Path) -> None:
    host = tmp_path / HOST
    write_run(host, "20261201T090000-1", verdict(), bench(300.0))
    write_run(host, "20261201T100000-2", verdict(), '{"schema": 1, "figures": ')  # cut short
    write_run(host, "20261201T110000-3", verdict(), {**bench(1.0), "schema": 2})
    write_run(host, "20261201T120000-4", "not json at all")
    history = reading.read_host(host)
    assert [r.run_id for r in history.rollouts] == ["20261201T090000-1", "20261201T100000-2", "20261201T110000-3"]
    assert len(history.notes) == 3
    assert history.notes[0].startswith("20261201T100000-2/bench.json skipped:")
    assert history.notes[1].startswith("20261201T110000-3/bench.json skipped: schema 2")
    assert history.notes[2].startswith("20261201T120000-4/verdict.json skipped:")
    page = parse_page(pages.render_host_page(history))
    assert [li.text() for li in page.one(id="notes").all("li")] == list(history.notes)
    assert page.one("tr", id="run-20261201T100000-2").one("td", cls="gate").text() == "bench.json unreadable"
    tips = [p.tooltip() for p in page.one("svg", id="plot-throughput").all("circle")]
    assert tips == ["20261201T090000-1: output 300.0 tokens/s"]  # the unreadable ones plot nothing


def test_figures_are_read_back_into_the_gates_figures(tmp_path: Path) -> None:
    kept = Figures(completed=30, failed=2, duration_s=11.5, concurrency=4, max_tokens=64, output_tokens_per_s=321.5,
                   ttft_ms={"p50": 40.0, "p99": 95.5}, itl_ms={"p50": 9.0, "p99": 28.0}, acceptance_rate=0.7,
                   acceptance_length=2.5, per_position_acceptance=[0.9, 0.6])  # fmt: skip
    data = {**bench(1.0), "figures": kept.to_dict(), "previous": kept.to_dict()}  # as the gate writes bench.json
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), data)
    read = reading.read_host(tmp_path / HOST).rollouts[0].bench
    assert read is not None and read.figures == kept and read.previous == kept


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [("ttft_ms", None, "figures 'ttft_ms' is not an object"), ("itl_ms", {"p50": 1.0}, "figures itl_ms 'p99' is not"),
     ("completed", 3.5, "figures 'completed' is not a whole number"), ("acceptance_rate", "high", "'acceptance_rate'")],
)  # fmt: skip
def test_figures_not_shaped_as_the_gate_writes_them_are_skipped(
    tmp_path: Path, key: str, value: object, why: str
) -> None:
    data = bench(100.0)
    assert isinstance(data["figures"], dict)
    data["figures"] = {**data["figures"], key: value}
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), data)
    history = reading.read_host(tmp_path / HOST)
    assert history.rollouts[0].bench is None and history.rollouts[0].gate_outcome == "bench.json unreadable"
    assert len(history.notes) == 1 and why in history.notes[0]


def test_a_gate_that_measured_nothing_shows_its_judgement_not_an_unreadable_file(tmp_path: Path) -> None:
    """bench.json with `figures: null`, as the gate writes it for an SGLang engine or a client that failed."""
    nothing = {**bench(1.0), "figures": None, "gate": {"enabled": True, "passed": True, "problems": [], "seconds": 0.0,
                                                       "note": "benchmark gate: not built for sglang yet"}}  # fmt: skip
    failed = {**bench(1.0), "figures": None, "gate": {"enabled": True, "passed": False, "seconds": 3.0,
                                                      "problems": ["the benchmark could not run: exit 1"]}}  # fmt: skip
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), nothing)
    write_run(tmp_path / HOST, "20261201T100000-2", verdict(), failed)
    history = reading.read_host(tmp_path / HOST)
    assert history.notes == () and history.benchmarked == []
    outcomes = ["nothing measured", "refused: the benchmark could not run: exit 1"]
    assert [r.gate_outcome for r in history.rollouts] == outcomes
    assert [r.refused for r in history.rollouts] == [False, True]
    page = parse_page(pages.render_host_page(history))
    assert page.one("tr", id="run-20261201T100000-2").one("td", cls="gate").text().startswith("refused: the benchmark")
