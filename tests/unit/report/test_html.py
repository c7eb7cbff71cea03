from __future__ import annotations

import json
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specdeploy.cli import main
from specdeploy.errors import SpecdeployError
from specdeploy.report import html as report

HOST = "testbed-1"
STAGES = [("launched", 0.0), ("resolving config", 5.97), ("compiling (torch.compile / autotune)", 19.37),
          ("profiling KV cache", 31.97), ("API server up", 33.22)]  # fmt: skip
REFUSAL = "mean acceptance length fell from 2.40 to 1.10 (-54%; bench_max_regression 10%)"


# --- A page as a tree: the tests query elements, not the markup's spelling -------------------

_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def all(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> list[Node]:
        found = []
        for child in self.children:
            if isinstance(child, Node):
                if (
                    (tag is None or child.tag == tag)
                    and (cls is None or set(cls.split()) <= child.classes)
                    and (id is None or child.attrs.get("id") == id)
                ):
                    found.append(child)
                found += child.all(tag, cls, id)
        return found

    def one(self, tag: str | None = None, cls: str | None = None, id: str | None = None) -> Node:
        found = self.all(tag, cls, id)
        assert len(found) == 1, f"{len(found)} <{tag} class={cls} id={id}>"
        return found[0]

    def tooltip(self) -> str:
        return self.one("title").text()


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse_page(markup: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(markup)
    builder.close()
    return builder.root


# --- Runs trees shaped like the controller's -------------------------------------------------


def verdict(status: str = "READY", headline: str | None = None, elapsed_s: float = 33.41) -> dict[str, object]:
    """A verdict.json with the watchdog's field names (as in .state/runs/*/*/verdict.json)."""
    ready = status == "READY"
    stages = STAGES if ready else STAGES[:2]
    return {
        "status": status, "elapsed_s": elapsed_s, "stage": stages[-1][0],
        "headline": headline or ("model=tiny-deepseek-v3 completion=8 tokens acceptance=100.0%" if ready else
                                 "ValueError: User-specified max_model_len (99999) (last stage: resolving config)"),
        "root_cause": None, "exit_code": None if ready else 1, "noise": {"future-warning": 4},
        "noise_catalogue_version": 2, "grammar_version": 3,
        "stages": [{"stage": label, "at_s": at} for label, at in stages],
        "acceptance": {"rate": 1.0, "mean_length": 4.0, "drafts": 2.0, "draft_tokens": 6.0, "accepted_tokens": 6.0}
        if ready else None,
        "completion": {"tokens": 8, "text": "!!!!!!!!"} if ready else None,
        "stack_summary": [], "diagnostics": "/x", "detected_after_exit_s": None, "notes": [],
    }  # fmt: skip


def figures(tps: float, *, ttft: tuple[float, float] = (40.1, 90.2), itl: tuple[float, float] = (10.0, 30.0),
            rate: float | None = 0.71, length: float | None = 2.4,
            positions: tuple[float, ...] = (0.9, 0.7, 0.5)) -> dict[str, object]:  # fmt: skip
    return {"completed": 32, "failed": 0, "duration_s": 12.3, "concurrency": 4, "max_tokens": 64,
            "output_tokens_per_s": tps, "ttft_ms": {"p50": ttft[0], "p99": ttft[1]},
            "itl_ms": {"p50": itl[0], "p99": itl[1]}, "acceptance_rate": rate, "acceptance_length": length,
            "per_position_acceptance": list(positions)}  # fmt: skip


def bench(
    tps: float, previous: dict[str, object] | None = None, problems: tuple[str, ...] = (), **kw: object
) -> dict[str, object]:
    return {"schema": 1, "host": HOST, "time": "2026-12-01T22:10:00Z", "image": "specdeploy/vllm-cpu:17be88d464ba",
            "image_id": "sha256:" + "ab" * 32, "config_digest": "cd" * 8, "hardware": "16 CPU cores",
            "figures": figures(tps, **kw),
            "previous": previous,
            "gate": {"enabled": True, "passed": not problems, "problems": list(problems), "seconds": 14.2}}  # fmt: skip


def write_run(host: Path, run_id: str, verdict_data: object, bench_data: object = None) -> Path:
    run = host / run_id
    run.mkdir(parents=True)
    (run / "verdict.json").write_text(verdict_data if isinstance(verdict_data, str) else json.dumps(verdict_data))
    if bench_data is not None:
        (run / "bench.json").write_text(bench_data if isinstance(bench_data, str) else json.dumps(bench_data))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Five rollouts, oldest first: benchmarked, failed start-up, refused by the gate, benchmarked, no gate."""
    host = tmp_path / "runs" / HOST
    write_run(host, "20261201T090000-101", verdict(), bench(400.5, ttft=(41.0, 91.0), itl=(11.0, 31.0)))
    write_run(host, "20261201T100000-202", verdict("FAILED", elapsed_s=15.3))
    write_run(host, "20261201T110000-303", verdict(), bench(250.2, previous=figures(400.5), problems=(REFUSAL,),
                                                            length=1.1, positions=(0.5, 0.3, 0.1)))  # fmt: skip
    write_run(host, "20261201T120000-404", verdict(), bench(410.7, previous=figures(400.5), ttft=(38.0, 80.0)))
    write_run(host, "20261201T130000-505", verdict())  # an older run, or a gate that was not run
    (host / "20261201T085500").mkdir()  # an image build's folder: a log, no verdict, not a rollout
    (host / "20261201T085500" / "image-build.log").write_text("built\n")
    return tmp_path / "runs"


def page_of(runs_root: Path, host: str = HOST, last: int = 20) -> Node:
    return parse_page(report.render_host_page(report.read_host(runs_root / host, last)))


RUN_IDS = ["20261201T090000-101", "20261201T100000-202", "20261201T110000-303", "20261201T120000-404",
           "20261201T130000-505"]  # fmt: skip
BENCHMARKED = [RUN_IDS[0], RUN_IDS[2], RUN_IDS[3]]


# --- Reading ---------------------------------------------------------------------------------


def test_rollouts_are_read_oldest_first_and_cut_to_the_last_n(runs: Path) -> None:
    history = report.read_host(runs / HOST, last=3)
    assert [r.run_id for r in history.rollouts] == RUN_IDS[2:]
    assert history.found == 5 and history.notes == ()  # the image build's folder is not a rollout
    refused = history.rollouts[0]
    assert refused.bench is not None and refused.bench.figures.output_tokens_per_s == 250.2
    assert refused.bench.previous is not None and refused.bench.previous.output_tokens_per_s == 400.5
    assert refused.stages[-1] == report.Stage("API server up", 33.22)


def test_gate_outcomes_are_passed_refused_with_the_problem_or_not_run(runs: Path) -> None:
    outcomes = [r.gate_outcome for r in report.read_host(runs / HOST).rollouts]
    assert outcomes == ["passed", "not run", f"refused: {REFUSAL}", "passed", "not run"]


# --- The page --------------------------------------------------------------------------------


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


def test_strings_from_the_files_are_escaped(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
    data = bench(100.0, problems=(hostile,))
    data["image"] = '"><script>alert(2)</script>'
    write_run(tmp_path / HOST, "20261201T090000-1", verdict(headline=hostile), data)
    markup = report.render_host_page(report.read_host(tmp_path / HOST))
    assert "<script" not in markup.lower() and "<img" not in markup.lower()
    assert "&lt;script&gt;" in markup
    page = parse_page(markup)
    row = page.one("tr", cls="rollout")
    assert row.one(cls="headline").text() == hostile  # escaped, so shown as written
    assert row.one("td", cls="gate").text() == f"refused: {hostile}"
    assert row.one("td", cls="image").text() == '"><script>alert(2)</script>'


def test_a_malformed_bench_json_is_noted_and_skipped(tmp_path: Path) -> None:
    host = tmp_path / HOST
    write_run(host, "20261201T090000-1", verdict(), bench(300.0))
    write_run(host, "20261201T100000-2", verdict(), '{"schema": 1, "figures": ')  # cut short
    write_run(host, "20261201T110000-3", verdict(), {**bench(1.0), "schema": 2})
    write_run(host, "20261201T120000-4", "not json at all")
    history = report.read_host(host)
    assert [r.run_id for r in history.rollouts] == ["20261201T090000-1", "20261201T100000-2", "20261201T110000-3"]
    assert len(history.notes) == 3
    assert history.notes[0].startswith("20261201T100000-2/bench.json skipped:")
    assert history.notes[1].startswith("20261201T110000-3/bench.json skipped: schema 2")
    assert history.notes[2].startswith("20261201T120000-4/verdict.json skipped:")
    page = parse_page(report.render_host_page(history))
    assert [li.text() for li in page.one(id="notes").all("li")] == list(history.notes)
    assert page.one("tr", id="run-20261201T100000-2").one("td", cls="gate").text() == "bench.json unreadable"
    tips = [p.tooltip() for p in page.one("svg", id="plot-throughput").all("circle")]
    assert tips == ["20261201T090000-1: output 300.0 tokens/s"]  # the unreadable ones plot nothing


@pytest.mark.parametrize("with_rollouts", [True, False])
def test_a_host_without_benchmarks_says_so_instead_of_empty_plots(tmp_path: Path, with_rollouts: bool) -> None:
    (tmp_path / HOST).mkdir()
    if with_rollouts:
        write_run(tmp_path / HOST, "20261201T090000-1", verdict())
        write_run(tmp_path / HOST, "20261201T100000-2", verdict("STALLED"))
    page = page_of(tmp_path)
    assert page.all("svg", cls="plot") == []
    for plot in ("plot-acceptance", "plot-throughput", "plot-latency"):
        assert page.one("p", id=plot).text() == report.NO_BENCHMARK
    assert len(page.all("tr", cls="rollout")) == (2 if with_rollouts else 0)


def test_nice_ticks_end_on_a_round_value_above_the_top() -> None:
    assert report.nice_ticks(447.9) == [0, 100, 200, 300, 400, 500]
    assert report.nice_ticks(142.6) == [0, 50, 100, 150]
    assert report.nice_ticks(0.0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


# --- The report on disk, and the CLI ---------------------------------------------------------


def test_write_report_writes_the_index_and_a_page_per_host(runs: Path, tmp_path: Path) -> None:
    write_run(runs / "gpu box#1", "20261201T090000-1", verdict())  # a name a file system or URL may mind
    out = tmp_path / "report"
    written = report.write_report(runs, out, last=2)
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
        report.write_report(tmp_path / "runs", tmp_path / "out")
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
