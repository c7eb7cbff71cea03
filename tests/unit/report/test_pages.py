"""The pages: the rollout table, escaping, the report on disk, and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.cli import main
from specdeploy.errors import SpecdeployError
from specdeploy.report import pages, plots, reading
from tests.unit.report.helpers import HOST, REFUSAL, RUN_IDS, STAGES, bench, page_of, parse_page, verdict, write_run


def test_the_table_has_every_rollout_newest_first(runs: Path) -> None:
    table = page_of(runs).one("table", id="rollouts")
    rows = table.all("tr", cls="rollout")
    assert [r.attrs["id"] for r in rows] == [f"run-{i}" for i in reversed(RUN_IDS)]
    assert [r.one(cls="badge").text() for r in rows] == ["READY", "READY", "READY", "FAILED", "READY"]
    newest_benchmarked = rows[1]
    assert newest_benchmarked.one("td", cls="tps").text() == "410.7"
    assert newest_benchmarked.one("td", cls="ttft").text() == "38.0 / 80.0"
    assert newest_benchmarked.one("td", cls="itl").text() == "10.0 / 30.0"
    assert newest_benchmarked.one("td", cls="acc-rate").text() == "71.0%"
    assert newest_benchmarked.one("td", cls="acc-length").text() == "2.40"
    assert newest_benchmarked.one("td", cls="image").text() == "specdeploy/vllm-cpu:17be88d464ba"
    startup = newest_benchmarked.one("td", cls="startup")
    assert startup.text().startswith("READY in 33.4 s")
    assert [li.text() for li in startup.all("li")] == [f"{at:.1f} s {label}" for label, at in STAGES]
    failed = rows[3].one("td", cls="startup").text()
    assert failed.startswith("not READY: resolving config, 15.3 s")
    # No benchmark: the start-up probe's acceptance, marked as not a measurement.
    assert rows[0].one("td", cls="acc-rate").text() == "100.0%†" and rows[0].one("td", cls="tps").text() == "—"


def test_a_refused_gate_shows_its_problem_text(runs: Path) -> None:
    page = page_of(runs)
    refused = page.one("tr", id="run-20261201T110000-303").one("td", cls="gate")
    assert refused.text() == f"refused: {REFUSAL}" and "gate-refused" in refused.classes
    gates = [td.text() for td in page.all("td", cls="gate")]
    assert gates == ["not run", "passed", f"refused: {REFUSAL}", "not run", "passed"]


def test_strings_from_the_files_are_escaped(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
    data = bench(100.0, problems=(hostile,))
    data["image"] = '"><script>alert(2)</script>'
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(headline=hostile), data)
    markup = pages.render_host_page(reading.read_host(tmp_path / HOST))
    assert "<script" not in markup.lower() and "<img" not in markup.lower()
    assert "&lt;script&gt;" in markup
    page = parse_page(markup)
    row = page.one("tr", cls="rollout")
    assert row.one(cls="headline").text() == hostile  # escaped, so shown as written
    assert row.one("td", cls="gate").text() == f"refused: {hostile}"
    assert row.one("td", cls="image").text() == '"><script>alert(2)</script>'


def test_write_report_writes_the_index_and_a_page_per_host(runs: Path, tmp_path: Path) -> None:
    write_run(runs / "gpu box#1", "20261201T090000-1", verdict())  # a name a file system or URL may mind
    out = tmp_path / "report"
    written = pages.write_report(runs, out, last=2)
    assert written == [out / "index.html", out / "gpu_box_1.html", out / f"{HOST}.html"]
    index = parse_page((out / "index.html").read_text())
    links = {a.text(): a.attrs["href"] for a in index.one("table", id="hosts").all("a")}
    assert links == {"gpu box#1": "gpu_box_1.html", HOST: f"{HOST}.html"}
    newest = [tr.all("td")[3].text() for tr in index.all("tr", cls="host")]
    assert newest == ["READY", "READY"]
    assert len(parse_page((out / f"{HOST}.html").read_text()).all("tr", cls="rollout")) == 2


def test_no_rollouts_is_an_error_that_says_to_deploy(tmp_path: Path) -> None:
    (tmp_path / "runs" / HOST / "20261201T085500").mkdir(parents=True)  # only an image build
    with pytest.raises(SpecdeployError) as err:
        pages.write_report(tmp_path / "runs", tmp_path / "out")
    assert "no rollouts" in err.value.message and err.value.hint == "deploy once first: make deploy"
    assert not (tmp_path / "out").exists()


def test_cli_report_prints_the_pages_and_how_to_open_them(runs: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_STATE", str(runs.parent))
    assert main(["report", "--last", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    index = runs.parent / "report" / "index.html"
    assert lines == [str(index), str(runs.parent / "report" / f"{HOST}.html"), f"open it: xdg-open {index}"]
    assert len(parse_page((runs.parent / "report" / f"{HOST}.html").read_text()).all("tr", cls="rollout")) == 3


def test_cli_report_without_runs_is_a_clear_error(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_STATE", str(tmp_path))
    assert main(["report", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no rollouts recorded" in err and "make deploy" in err and "Traceback" not in err


def test_a_figure_that_is_not_finite_shows_as_missing(tmp_path: Path) -> None:
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(), bench(float("nan"), ttft=(float("inf"), 90.0)))
    page = page_of(tmp_path)
    row = page.one("tr", cls="rollout")
    assert row.one("td", cls="tps").text() == "—" and row.one("td", cls="ttft").text() == "— / 90.0"
    assert page.one("p", id="plot-throughput").text() == plots.NO_BENCHMARK  # nothing to plot
    assert [p.tooltip() for p in page.one("svg", id="plot-latency").all("circle")] == [
        "20261201T090000-1: TTFT p99 90.0 ms", "20261201T090000-1: ITL p50 10.0 ms",
        "20261201T090000-1: ITL p99 30.0 ms"]  # fmt: skip
