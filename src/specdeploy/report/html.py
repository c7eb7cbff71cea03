"""`specdeploy report`: one self-contained HTML page per host of its recorded rollouts.

Reads what the controller left in `.state/runs/<host>/<run id>/`: the watchdog's `verdict.json`
(every watched rollout) and the benchmark gate's `bench.json` (schema 1; only where the gate ran
after READY). Pages are plain HTML with inline CSS and SVG: no JavaScript and no external URL,
so they open from a file, a CI artefact or an e-mail. A file that cannot be read is named in the
page and skipped; it never stops the report.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from specdeploy.errors import SpecdeployError

DEFAULT_LAST = 20
BENCH_SCHEMA = 1
NO_BENCHMARK = "no benchmarked rollout yet"
_RUN_TIME = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_NOTE_CHARS = 300  # a decoder's message quotes the file; keep a note one line


# --- Records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """A start-up stage the watchdog saw, and when (seconds after launch)."""

    label: str
    at_s: float


@dataclass(frozen=True)
class Figures:
    """One benchmark's measurements: bench.json `figures`, or the `previous` it was compared with."""

    output_tokens_per_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position_acceptance: tuple[float, ...]
    completed: int | None
    failed: int | None


@dataclass(frozen=True)
class Gate:
    enabled: bool
    passed: bool
    problems: tuple[str, ...]
    seconds: float | None


@dataclass(frozen=True)
class Bench:
    """bench.json: the benchmark run after READY and the gate's judgement of it."""

    time: str
    image: str
    image_id: str
    config_digest: str
    hardware: str
    figures: Figures
    previous: Figures | None
    gate: Gate


@dataclass(frozen=True)
class Rollout:
    """One watched rollout: its folder's verdict.json and, when the gate ran, its bench.json."""

    run_id: str
    status: str
    elapsed_s: float | None
    stage: str
    headline: str
    stages: tuple[Stage, ...]
    # The watchdog's start-up completion (one request): shown only where no benchmark ran.
    probe_acceptance_rate: float | None
    probe_acceptance_length: float | None
    image: str
    bench: Bench | None
    bench_unreadable: bool = False

    @property
    def started(self) -> str:
        """The run id's time, readable: the id starts with the UTC launch time."""
        match = _RUN_TIME.match(self.run_id)
        if not match:
            return self.run_id
        year, month, day, hour, minute, second = match.groups()
        return f"{year}-{month}-{day} {hour}:{minute}:{second}"

    @property
    def short_time(self) -> str:
        match = _RUN_TIME.match(self.run_id)
        return f"{match[2]}-{match[3]} {match[4]}:{match[5]}" if match else self.run_id[:14]

    @property
    def gate_outcome(self) -> str:
        if self.bench_unreadable:
            return "bench.json unreadable"
        if self.bench is None:
            return "not run"
        gate = self.bench.gate
        if not gate.enabled:
            return "measured, gate off"
        if gate.passed:
            return "passed"
        return "refused: " + "; ".join(gate.problems) if gate.problems else "refused"


@dataclass(frozen=True)
class HostHistory:
    """A host's last rollouts (newest last) and the files that had to be skipped."""

    host: str
    rollouts: tuple[Rollout, ...]
    found: int  # rollout folders (with a verdict.json) before the cut to the last N
    notes: tuple[str, ...]

    @property
    def benchmarked(self) -> list[Rollout]:
        return [r for r in self.rollouts if r.bench is not None]


# --- Reading ---------------------------------------------------------------------------------


class _Malformed(ValueError):
    """A file that parses but does not have the shape this report reads."""


def _number(value: object) -> float | None:
    # bool is an int to Python, never a measurement; NaN/inf plot nowhere.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(data: dict[str, object], key: str) -> dict[str, object]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _load_json(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _problem(path: Path, exc: Exception) -> str:
    reason = " ".join(str(exc).split())[:_NOTE_CHARS]
    return f"{path.parent.name}/{path.name} skipped: {reason or type(exc).__name__}"


def parse_figures(data: object) -> Figures:
    if not isinstance(data, dict):
        raise _Malformed(f"figures is {type(data).__name__}, not an object")
    ttft, itl = _mapping(data, "ttft_ms"), _mapping(data, "itl_ms")
    positions = data.get("per_position_acceptance") or []
    if not isinstance(positions, list) or any(_number(p) is None for p in positions):
        raise _Malformed("per_position_acceptance is not a list of numbers")
    return Figures(
        output_tokens_per_s=_number(data.get("output_tokens_per_s")),
        ttft_p50_ms=_number(ttft.get("p50")),
        ttft_p99_ms=_number(ttft.get("p99")),
        itl_p50_ms=_number(itl.get("p50")),
        itl_p99_ms=_number(itl.get("p99")),
        acceptance_rate=_number(data.get("acceptance_rate")),
        acceptance_length=_number(data.get("acceptance_length")),
        per_position_acceptance=tuple(float(p) for p in positions),
        completed=_count(data.get("completed")),
        failed=_count(data.get("failed")),
    )


def parse_bench(data: object) -> Bench:
    """bench.json, schema 1; anything else is refused rather than half-read."""
    if not isinstance(data, dict):
        raise _Malformed(f"the file holds a JSON {type(data).__name__}, not an object")
    if data.get("schema") != BENCH_SCHEMA:
        raise _Malformed(f"schema {data.get('schema')!r} is not {BENCH_SCHEMA}, the one this report reads")
    gate = data.get("gate")
    if not isinstance(gate, dict):
        raise _Malformed("no gate object")
    problems = gate.get("problems") or []
    previous = data.get("previous")
    return Bench(
        time=_text(data.get("time")),
        image=_text(data.get("image")),
        image_id=_text(data.get("image_id")),
        config_digest=_text(data.get("config_digest")),
        hardware=_text(data.get("hardware")),
        figures=parse_figures(data.get("figures")),
        previous=None if previous is None else parse_figures(previous),
        gate=Gate(
            enabled=gate.get("enabled") is True,
            passed=gate.get("passed") is True,
            problems=tuple(str(p) for p in problems) if isinstance(problems, list) else (str(problems),),
            seconds=_number(gate.get("seconds")),
        ),
    )


def _stages(value: object) -> tuple[Stage, ...]:
    if not isinstance(value, list):
        return ()
    stages = []
    for entry in value:
        if isinstance(entry, dict) and isinstance(entry.get("stage"), str):
            at_s = _number(entry.get("at_s"))
            if at_s is not None:
                stages.append(Stage(entry["stage"], at_s))
    return tuple(stages)


def _container_image(run: Path) -> str:
    """The image named in container.json (docker inspect, kept for failed start-ups), if any."""
    path = run / "container.json"
    if not path.is_file():
        return ""
    data = _load_json(path)
    config = _mapping(data, "Config") if isinstance(data, dict) else {}
    return _text(config.get("Image"))


def read_rollout(run: Path, notes: list[str]) -> Rollout | None:
    """One run folder; None (and a note) where its verdict.json cannot be read."""
    verdict_path = run / "verdict.json"
    try:
        verdict = _load_json(verdict_path)
        if not isinstance(verdict, dict) or not isinstance(verdict.get("status"), str):
            raise _Malformed("no status: not a watchdog verdict")
    except (OSError, ValueError) as exc:
        notes.append(_problem(verdict_path, exc))
        return None
    bench: Bench | None = None
    unreadable = False
    bench_path = run / "bench.json"
    if bench_path.exists():
        try:
            bench = parse_bench(_load_json(bench_path))
        except (OSError, ValueError) as exc:
            notes.append(_problem(bench_path, exc))
            unreadable = True
    image = bench.image if bench else ""
    if not image:
        try:
            image = _container_image(run)
        except (OSError, ValueError) as exc:
            notes.append(_problem(run / "container.json", exc))
    acceptance = _mapping(verdict, "acceptance")
    return Rollout(
        run_id=run.name,
        status=verdict["status"],
        elapsed_s=_number(verdict.get("elapsed_s")),
        stage=_text(verdict.get("stage")),
        headline=_text(verdict.get("headline")),
        stages=_stages(verdict.get("stages")),
        probe_acceptance_rate=_number(acceptance.get("rate")),
        probe_acceptance_length=_number(acceptance.get("mean_length")),
        image=image,
        bench=bench,
        bench_unreadable=unreadable,
    )


def read_host(host_dir: Path, last: int = DEFAULT_LAST) -> HostHistory:
    """A host's last `last` rollouts, oldest first. Folders without verdict.json (image builds) are not rollouts."""
    notes: list[str] = []
    try:
        # Run ids start with the launch time (YYYYMMDDTHHMMSS), so the names sort by time.
        runs = sorted(p for p in host_dir.iterdir() if p.is_dir() and (p / "verdict.json").exists())
    except OSError as exc:
        return HostHistory(host_dir.name, (), 0, (f"{host_dir} unreadable: {exc}",))
    rollouts = [r for r in (read_rollout(run, notes) for run in runs[-last:]) if r is not None]
    return HostHistory(host_dir.name, tuple(rollouts), len(runs), tuple(notes))


def read_runs(runs_root: Path, last: int = DEFAULT_LAST) -> list[HostHistory]:
    """Every host folder under `runs_root`, by name."""
    if not runs_root.is_dir():
        return []
    return [read_host(d, last) for d in sorted(runs_root.iterdir()) if d.is_dir()]


# --- Formatting ------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Every string from the files goes through here: a headline may hold `<`, `&` or quotes."""
    return html.escape(str(value), quote=True)


def _fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}{unit}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def _pair(low: float | None, high: float | None) -> str:
    return f"{_fmt(low)} / {_fmt(high)}"


def _css_word(value: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", value.lower())


def page_name(host: str) -> str:
    """The host's page file: its name with anything a file system or URL may mind replaced."""
    safe = _SAFE_NAME.sub("_", host) or "_"
    return f"host-{safe}.html" if safe in {"index", "."} or safe.startswith("..") else f"{safe}.html"


# --- Plots -----------------------------------------------------------------------------------


def _el(name: str, content: str = "", /, **attrs: object) -> str:
    """An SVG element. `content` is markup (escape text first); attribute values are escaped here,
    floats to one decimal; `class_` is class and `text_anchor` is text-anchor."""
    rendered = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{f"{value:.1f}" if isinstance(value, float) else _e(value)}"'
        for key, value in attrs.items()
    )
    return f"<{name}{rendered}>{content}</{name}>" if content else f"<{name}{rendered}/>"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Ticks from 0 to a round value at or above `top`, in steps of 1, 2, 2.5 or 5 times a power of ten."""
    top = top if top > 0 else 1.0
    raw = top / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    steps = max(1, math.ceil(top / step - 1e-9))
    return [round(i * step, 10) for i in range(steps + 1)]


@dataclass(frozen=True)
class _Frame:
    """A plot's drawing area inside its SVG, and the value-to-pixel mapping."""

    slots: int
    y_top: float
    width: int = 600
    height: int = 300
    left: int = 64
    right: int = 16
    top: int = 34
    bottom: int = 72

    @property
    def plot_width(self) -> float:
        return float(self.width - self.left - self.right)

    @property
    def base(self) -> float:
        return float(self.height - self.bottom)

    @property
    def right_edge(self) -> float:
        return float(self.width - self.right)

    def x(self, slot: float) -> float:
        """Centre of slot `slot` (0-based), slots evenly spread."""
        return self.left + self.plot_width * (slot + 0.5) / self.slots

    def y(self, value: float) -> float:
        return self.base - (self.base - self.top) * value / self.y_top


def _svg(plot_id: str, title: str, frame: _Frame, content: str) -> str:
    return _el(
        "svg",
        _el("title", _e(title), id=f"{plot_id}-title") + content,
        id=plot_id,
        class_="plot",
        xmlns="http://www.w3.org/2000/svg",
        viewBox=f"0 0 {frame.width} {frame.height}",
        role="img",
        aria_labelledby=f"{plot_id}-title",
    )


def _axes(
    frame: _Frame,
    ticks: Sequence[float],
    *,
    tick_label: Callable[[float], str],
    x_labels: Sequence[str],
    y_label: str,
    x_label: str,
    rotate: bool,
) -> str:
    left = float(frame.left)
    parts = []
    for tick in ticks:
        y = frame.y(tick)
        parts.append(_el("line", class_="grid", x1=left, y1=y, x2=frame.right_edge, y2=y))
        parts.append(_el("text", _e(tick_label(tick)), class_="tick y-tick", x=left - 6, y=y + 4))
    label_y = frame.base + 16
    for slot, label in enumerate(x_labels):
        x = frame.x(slot)
        # Many rollouts' times side by side overlap: turned, they fit.
        turn = {"transform": f"rotate(-35 {x:.1f} {label_y:.1f})", "text_anchor": "end"} if rotate else {}
        parts.append(_el("text", _e(label), class_="tick x-tick", x=x, y=label_y, **({"text_anchor": "middle"} | turn)))
    parts.append(_el("line", class_="axis", x1=left, y1=frame.base, x2=frame.right_edge, y2=frame.base))
    parts.append(_el("line", class_="axis", x1=left, y1=float(frame.top), x2=left, y2=frame.base))
    middle = (frame.top + frame.base) / 2
    upright = f"rotate(-90 16 {middle:.1f})"
    parts.append(_el("text", _e(y_label), class_="axis-label", x=16.0, y=middle, transform=upright))
    parts.append(_el("text", _e(x_label), class_="axis-label", x=left + frame.plot_width / 2, y=frame.height - 6.0))
    return "".join(parts)


def _legend(frame: _Frame, entries: Sequence[tuple[str, str]]) -> str:
    """Swatches in a row above the plot area: (css class, label)."""
    parts, x = [], float(frame.left)
    for css, label in entries:
        swatch = _el("rect", x=x, y=10.0, width=12, height=12) + _el("text", _e(label), x=x + 16, y=20.0)
        parts.append(_el("g", swatch, class_=f"legend {css}"))
        x += 28 + 7 * len(label)
    return "".join(parts)


def _empty_plot(plot_id: str, text: str) -> str:
    return f'<p id="{_e(plot_id)}" class="empty">{_e(text)}</p>'


@dataclass(frozen=True)
class _Series:
    label: str
    css: str
    unit: str
    values: tuple[float | None, ...]  # one per benchmarked rollout


def _refused(rollout: Rollout) -> bool:
    return rollout.bench is not None and rollout.bench.gate.enabled and not rollout.bench.gate.passed


def _series_marks(frame: _Frame, runs: Sequence[Rollout], one: _Series) -> str:
    """A line through the series' values and a point per value, its tooltip the value."""
    points = [(i, v) for i, v in enumerate(one.values) if v is not None]
    parts = [_el("polyline", class_="line", points=" ".join(f"{frame.x(i):.1f},{frame.y(v):.1f}" for i, v in points))]
    for i, value in points:
        refused = _refused(runs[i])
        tip = f"{runs[i].run_id}: {one.label} {value:.1f} {one.unit}" + (" (gate refused)" if refused else "")
        css = "point refused" if refused else "point"
        parts.append(_el("circle", _el("title", _e(tip)), class_=css, cx=frame.x(i), cy=frame.y(value), r=4))
    return _el("g", "".join(parts), class_=f"series {one.css}")


def _line_plot(plot_id: str, title: str, y_label: str, runs: Sequence[Rollout], series: Sequence[_Series]) -> str:
    """Benchmarked rollouts left to right (oldest first), a line and points per series."""
    present = [v for s in series for v in s.values if v is not None]
    if not present:
        return _empty_plot(plot_id, NO_BENCHMARK)
    ticks = nice_ticks(max(present))
    frame = _Frame(slots=len(runs), y_top=ticks[-1])
    x_labels = [r.short_time for r in runs]
    parts = [_axes(frame, ticks, tick_label=lambda t: f"{t:g}", x_labels=x_labels, y_label=y_label,
                   x_label="rollout (UTC)", rotate=True)]  # fmt: skip
    if len(series) > 1:
        parts.append(_legend(frame, [(s.css, s.label) for s in series]))
    parts += [_series_marks(frame, runs, one) for one in series]
    return _svg(plot_id, title, frame, "".join(parts))


def throughput_plot(history: HostHistory) -> str:
    runs = history.benchmarked
    values = tuple(r.bench.figures.output_tokens_per_s if r.bench else None for r in runs)
    series = [_Series("output", "throughput", "tokens/s", values)]
    return _line_plot("plot-throughput", "Output tokens/s over rollouts", "output tokens/s", runs, series)


def latency_plot(history: HostHistory) -> str:
    runs = history.benchmarked
    figures = [r.bench.figures for r in runs if r.bench]
    series = [
        _Series("TTFT p50", "ttft-p50", "ms", tuple(f.ttft_p50_ms for f in figures)),
        _Series("TTFT p99", "ttft-p99", "ms", tuple(f.ttft_p99_ms for f in figures)),
        _Series("ITL p50", "itl-p50", "ms", tuple(f.itl_p50_ms for f in figures)),
        _Series("ITL p99", "itl-p99", "ms", tuple(f.itl_p99_ms for f in figures)),
    ]
    return _line_plot("plot-latency", "Latency over rollouts: TTFT and ITL, p50 and p99", "milliseconds", runs, series)


def acceptance_plot(history: HostHistory) -> str:
    """Bars per draft position: the newest benchmarked rollout, and the promoted version it was compared with."""
    plot_id = "plot-acceptance"
    if not history.benchmarked:
        return _empty_plot(plot_id, NO_BENCHMARK)
    newest = history.benchmarked[-1]
    assert newest.bench is not None  # benchmarked
    bars = [("newest", newest.run_id, newest.bench.figures.per_position_acceptance)]
    previous = newest.bench.previous
    if previous is not None and previous.per_position_acceptance:
        bars.append(("previous", "previous promoted version", previous.per_position_acceptance))
    positions = max(len(values) for _, _, values in bars)
    if positions == 0:
        why = (
            f"the newest benchmarked rollout ({newest.run_id}) has no per-position acceptance (no speculative decoding)"
        )
        return _empty_plot(plot_id, why)
    frame = _Frame(slots=positions, y_top=max([1.0, *(v for _, _, values in bars for v in values)]), bottom=48)
    ticks = [t for t in (0.0, 0.25, 0.5, 0.75, 1.0) if t <= frame.y_top]
    x_labels = [str(p + 1) for p in range(positions)]
    parts = [_axes(frame, ticks, tick_label=lambda t: f"{t * 100:.0f}%", x_labels=x_labels, y_label="accepted",
                   x_label="draft position", rotate=False)]  # fmt: skip
    parts.append(_legend(frame, [(css, who) for css, who, _ in bars]))
    group = frame.plot_width / positions * 0.8
    width = group / len(bars)
    for index, (css, who, values) in enumerate(bars):
        for position, value in enumerate(values):
            x, y = frame.x(position) - group / 2 + index * width, frame.y(value)
            tip = _el("title", _e(f"position {position + 1}: {value * 100:.1f}% ({who})"))
            parts.append(_el("rect", tip, class_=f"bar {css}", x=x, y=y, width=width - 2, height=frame.base - y))
    return _svg(plot_id, f"Acceptance per draft position, {newest.run_id}", frame, "".join(parts))


# --- Pages -----------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2937;margin:24px;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 8px}
.sub{color:#6b7280;margin:0 0 16px}a{color:#1d4ed8}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;word-break:break-all}
.summary dl{margin:0;display:grid;grid-template-columns:auto 1fr;gap:4px 12px}
.summary dt{color:#6b7280}.summary dd{margin:0}
.notes{background:#fffbeb;border:1px solid #fcd34d;padding:8px 12px;margin:0 0 16px}.notes ul{margin:4px 0 0}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px;margin:0 0 20px}
figure{margin:0;border:1px solid #e5e7eb;border-radius:6px;padding:12px}
svg.plot{width:100%;height:auto;display:block}
svg .grid{stroke:#e5e7eb}svg .axis{stroke:#6b7280}
svg .tick{font-size:11px;fill:#4b5563}svg .y-tick{text-anchor:end}
svg .axis-label{font-size:12px;fill:#374151;text-anchor:middle}svg .legend text{font-size:11px;fill:#374151}
svg .line{fill:none;stroke-width:2}svg .point{stroke:#fff;stroke-width:1}
svg .point.refused{fill:#fff;stroke:#dc2626;stroke-width:2}
svg .bar.newest,svg .legend.newest rect{fill:#2563eb}svg .bar.previous,svg .legend.previous rect{fill:#9ca3af}
.empty{color:#6b7280;font-style:italic;padding:40px 0;text-align:center;margin:0}
table{border-collapse:collapse;width:100%;font-size:13px}caption{text-align:left;color:#6b7280;padding:0 0 6px}
th,td{border-bottom:1px solid #e5e7eb;padding:6px;text-align:left;vertical-align:top}
th{background:#f9fafb;font-weight:600}td.num{text-align:right;white-space:nowrap}
.badge{display:inline-block;padding:1px 6px;border-radius:4px;font-weight:600;font-size:12px;background:#e5e7eb}
.status-ready{background:#dcfce7;color:#166534}.status-failed{background:#fee2e2;color:#991b1b}
.status-stalled{background:#ffedd5;color:#9a3412}
.gate-passed{color:#166534;font-weight:600}.gate-refused{color:#991b1b}.gate-none{color:#6b7280}
.headline,.stages,.when{color:#4b5563;font-size:12px}.when{white-space:nowrap}.probe{color:#6b7280}
td.run{min-width:230px;max-width:300px}td.run code{white-space:nowrap;word-break:normal}.status{margin:2px 0}
td.gate{max-width:200px}td.startup{min-width:154px}td.image{min-width:140px;max-width:170px}
td.image code{word-break:normal}
svg.timeline{display:block;margin:4px 0 2px;background:#f3f4f6}
.stages summary{cursor:pointer}.stages ol{margin:2px 0 0;padding-left:18px}
.table-wrap{overflow-x:auto}
"""


# css class: (colour, dash pattern); the lines, their points and their legend swatches.
_SERIES_STYLE = {"throughput": ("#2563eb", ""), "ttft-p50": ("#1d4ed8", ""), "ttft-p99": ("#60a5fa", "5 3"),
                 "itl-p50": ("#c2410c", ""), "itl-p99": ("#fb923c", "5 3")}  # fmt: skip
_CSS += "".join(
    f"svg .{css} .line{{stroke:{colour}{f';stroke-dasharray:{dash}' if dash else ''}}}"
    f"svg .{css} .point:not(.refused),svg .legend.{css} rect{{fill:{colour}}}\n"
    for css, (colour, dash) in _SERIES_STYLE.items()
)


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _generated(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")


def _status_badge(status: str) -> str:
    return f'<span class="badge status-{_css_word(status)}">{_e(status)}</span>'


def _gate_cell(rollout: Rollout) -> str:
    outcome = rollout.gate_outcome
    css = "gate-passed" if outcome == "passed" else "gate-refused" if outcome.startswith("refused") else "gate-none"
    return f'<td class="gate {css}">{_e(outcome)}</td>'


_STAGE_COLOURS = ("#bfdbfe", "#93c5fd", "#60a5fa", "#3b82f6", "#2563eb", "#1d4ed8")
_HEADLINE_CHARS = 160  # a traceback's headline can run to a paragraph; the rest is in its tooltip


def _timeline(rollout: Rollout, width: float = 150.0) -> str:
    """The start-up's stages as one bar, each segment as long as its stage took (a tooltip each)."""
    end = rollout.elapsed_s
    if not rollout.stages or end is None or end <= 0:
        return ""
    segments = []
    for index, stage in enumerate(rollout.stages):
        until = rollout.stages[index + 1].at_s if index + 1 < len(rollout.stages) else end
        last = index + 1 == len(rollout.stages)
        colour = "#f87171" if last and rollout.status != "READY" else _STAGE_COLOURS[index % len(_STAGE_COLOURS)]
        tip = _el("title", _e(f"{stage.label}: {stage.at_s:.1f} → {until:.1f} s ({until - stage.at_s:.1f} s)"))
        x = width * min(stage.at_s, end) / end
        span = max(width * min(until, end) / end - x, 0.0)
        segments.append(_el("rect", tip, x=x, y=0.0, width=span, height=10, fill=colour))
    return _el(
        "svg", "".join(segments), class_="timeline", viewBox=f"0 0 {width:.0f} 10", width=f"{width:.0f}", height=10
    )


def _startup_cell(rollout: Rollout) -> str:
    if rollout.status == "READY":
        head = f"READY in {_fmt(rollout.elapsed_s, unit=' s')}"
    else:
        head = f"not READY: {rollout.stage or 'no stage'}, {_fmt(rollout.elapsed_s, unit=' s')}"
    stages = "".join(f"<li>{s.at_s:.1f} s {_e(s.label)}</li>" for s in rollout.stages)
    details = f'<details class="stages"><summary>{len(rollout.stages)} stages</summary><ol>{stages}</ol></details>'
    return f'<td class="startup">{_e(head)}{_timeline(rollout)}{details if stages else ""}</td>'


def _short_image(image: str) -> str:
    """A bare image id (docker inspect names no tag for a container made from an id) to its usual 12 digits."""
    match = re.fullmatch(r"sha256:([0-9a-f]{12})[0-9a-f]{52}", image)
    return f"sha256:{match[1]}" if match else image


def _headline(text: str) -> str:
    if not text:
        return ""
    shown = text if len(text) <= _HEADLINE_CHARS else text[: _HEADLINE_CHARS - 1] + "…"
    return f'<div class="headline" title="{_e(text)}">{_e(shown)}</div>'


def _acceptance_cells(rollout: Rollout) -> str:
    if rollout.bench is not None:
        figures = rollout.bench.figures
        rate, length = _percent(figures.acceptance_rate), _fmt(figures.acceptance_length, 2)
        return f'<td class="num acc-rate">{rate}</td><td class="num acc-length">{length}</td>'
    if rollout.probe_acceptance_rate is None and rollout.probe_acceptance_length is None:
        return '<td class="num acc-rate">—</td><td class="num acc-length">—</td>'
    # No benchmark: the watchdog's start-up completion, marked as such (one request, not a measurement).
    tip = ' title="from the start-up check&#x27;s one completion, not a benchmark"'
    rate, length = _percent(rollout.probe_acceptance_rate), _fmt(rollout.probe_acceptance_length, 2)
    return (
        f'<td class="num acc-rate"><span class="probe"{tip}>{rate}†</span></td>'
        f'<td class="num acc-length"><span class="probe"{tip}>{length}†</span></td>'
    )


def _rollout_row(rollout: Rollout) -> str:
    figures = rollout.bench.figures if rollout.bench else None
    image_id = rollout.bench.image_id if rollout.bench else ""
    # <wbr>: a narrow column breaks a long image name after its / or :, not mid-word.
    shown = _e(_short_image(rollout.image)).replace("/", "/<wbr>").replace(":", ":<wbr>")
    image = f'<code title="{_e(image_id or rollout.image)}">{shown}</code>' if rollout.image else "—"
    tps = _fmt(figures.output_tokens_per_s) if figures else "—"
    ttft = _pair(figures.ttft_p50_ms, figures.ttft_p99_ms) if figures else "—"
    itl = _pair(figures.itl_p50_ms, figures.itl_p99_ms) if figures else "—"
    return (
        f'<tr class="rollout" id="run-{_e(rollout.run_id)}">'
        f'<td class="run"><code>{_e(rollout.run_id)}</code> <span class="when">{_e(rollout.started)}</span>'
        f'<div class="status">{_status_badge(rollout.status)}</div>{_headline(rollout.headline)}</td>'
        f'{_gate_cell(rollout)}{_startup_cell(rollout)}<td class="image">{image}</td>'
        f'<td class="num tps">{tps}</td><td class="num ttft">{ttft}</td><td class="num itl">{itl}</td>'
        f"{_acceptance_cells(rollout)}</tr>"
    )


def _rollout_table(history: HostHistory) -> str:
    if not history.rollouts:
        return '<p class="empty">no watched rollout recorded for this host yet</p>'
    header = "".join(
        f"<th>{h}</th>"
        for h in ("Rollout and verdict", "Benchmark gate", "Start-up", "Image", "Output tokens/s",
                  "TTFT p50 / p99 (ms)", "ITL p50 / p99 (ms)", "Acceptance rate", "Mean acceptance length")
    )  # fmt: skip
    rows = "\n".join(_rollout_row(r) for r in reversed(history.rollouts))
    probe = any(r.bench is None and r.probe_acceptance_rate is not None for r in history.rollouts)
    footnote = (
        '<p class="sub">† no benchmark: the watchdog&#x27;s start-up completion (one request), not a measurement</p>'
        if probe
        else ""
    )
    return (
        f'<div class="table-wrap"><table id="rollouts">'
        f"<caption>{len(history.rollouts)} rollouts, newest first</caption>"
        f"<thead><tr>{header}</tr></thead><tbody>\n{rows}\n</tbody></table></div>{footnote}"
    )


def _summary(history: HostHistory) -> str:
    """The newest rollout and the newest benchmark's provenance (what the gate compared)."""
    if not history.rollouts:
        return '<figure class="summary"><h2>Newest</h2><p class="empty">no watched rollout yet</p></figure>'
    newest = history.rollouts[-1]
    items = [("newest rollout", f"<code>{_e(newest.run_id)}</code> {_status_badge(newest.status)}"),
             ("benchmark gate", _e(newest.gate_outcome))]  # fmt: skip
    if history.benchmarked:
        bench = history.benchmarked[-1].bench
        assert bench is not None  # benchmarked
        items += [
            ("newest benchmark", f"{_e(bench.time)} (<code>{_e(history.benchmarked[-1].run_id)}</code>)"),
            ("image", f"<code>{_e(bench.image)}</code>"),
            ("image id", f"<code>{_e(bench.image_id)}</code>"),
            ("config digest", f"<code>{_e(bench.config_digest)}</code>"),
            ("hardware", _e(bench.hardware)),
            ("requests", f"{bench.figures.completed or 0} completed, {bench.figures.failed or 0} failed"),
            ("compared with", "the previous promoted version" if bench.previous else "nothing (the first benchmark)"),
        ]
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return f'<figure class="summary"><h2>Newest</h2><dl>{rows}</dl></figure>'


def _notes(notes: Iterable[str]) -> str:
    listed = "".join(f"<li>{_e(n)}</li>" for n in notes)
    return (
        f'<section class="notes" id="notes"><strong>Skipped files</strong><ul>{listed}</ul></section>' if listed else ""
    )


def render_host_page(history: HostHistory, now: datetime | None = None) -> str:
    figures = [
        ("Acceptance per draft position", acceptance_plot(history)),
        ("Output tokens/s", throughput_plot(history)),
        ("Latency", latency_plot(history)),
    ]
    plots = _summary(history) + "".join(f"<figure><h2>{title}</h2>{plot}</figure>" for title, plot in figures)
    shown = f"the last {len(history.rollouts)} of {history.found} rollouts" if history.found else "no rollouts"
    body = (
        f"<header><h1>Rollouts of <code>{_e(history.host)}</code></h1>"
        f'<p class="sub">{shown} · generated {_generated(now)} · <a href="index.html">all hosts</a></p></header>\n'
        f'{_notes(history.notes)}<section class="plots">{plots}</section>\n'
        f"<section><h2>Rollouts</h2>{_rollout_table(history)}</section>"
    )
    return _page(f"specdeploy rollouts: {history.host}", body)


def render_index(histories: Sequence[HostHistory], now: datetime | None = None) -> str:
    rows = []
    for history in histories:
        newest = history.rollouts[-1] if history.rollouts else None
        bench = history.benchmarked[-1].bench if history.benchmarked else None
        link = f'<a href="{_e(quote(page_name(history.host)))}">{_e(history.host)}</a>'
        status = _status_badge(newest.status) if newest else "—"
        gate = _e(newest.gate_outcome) if newest else "—"
        tps = _fmt(bench.figures.output_tokens_per_s) if bench else "—"
        run = f"<code>{_e(newest.run_id)}</code>" if newest else "—"
        rows.append(
            f'<tr class="host"><td>{link}</td><td class="num">{history.found}</td><td>{run}</td><td>{status}</td>'
            f'<td>{gate}</td><td class="num">{tps}</td></tr>'
        )
    header = "".join(f"<th>{h}</th>" for h in ("Host", "Rollouts", "Newest", "Verdict", "Gate", "Output tokens/s"))
    body = (
        f'<header><h1>specdeploy rollouts</h1><p class="sub">{len(histories)} hosts · generated {_generated(now)}</p>'
        f'</header>\n<table id="hosts"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
    return _page("specdeploy rollouts", body)


def write_report(runs_root: Path, out_dir: Path, last: int = DEFAULT_LAST) -> list[Path]:
    """index.html and one `<host>.html` per host folder under `runs_root`; the index first."""
    if last < 1:
        raise SpecdeployError(f"--last {last}: show at least one rollout")
    histories = read_runs(runs_root, last)
    if not any(h.found for h in histories):
        raise SpecdeployError(f"no rollouts recorded under {runs_root}", hint="deploy once first: make deploy")
    out_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    index = out_dir / "index.html"
    index.write_text(render_index(histories, now), encoding="utf-8")
    written = [index]
    for history in histories:
        page = out_dir / page_name(history.host)
        page.write_text(render_host_page(history, now), encoding="utf-8")
        written.append(page)
    return written
