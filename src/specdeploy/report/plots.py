"""The report's plots: a small SVG kit (an element, a frame that maps values to pixels, axes, a legend),
the three plots of a host's page and each rollout's start-up timeline, drawn from its records. Plain
SVG inline in the page, styled by the page's CSS classes; every string from the files is escaped here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdeploy.report.reading import PERCENTILES, HostHistory, WatchedRollout, measured

NO_BENCHMARK = "no benchmarked rollout yet"


def escape(value: object) -> str:
    """Every string from the files goes through here: a headline may hold `<`, `&` or quotes."""
    return html.escape(str(value), quote=True)


def el(name: str, content: str = "", /, **attrs: object) -> str:
    """An SVG element. `content` is markup (escape text first); attribute values are escaped here,
    floats to one decimal; `class_` is class and `text_anchor` is text-anchor."""
    rendered = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{f"{value:.1f}" if isinstance(value, float) else escape(value)}"'
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
    return el(
        "svg",
        el("title", escape(title), id=f"{plot_id}-title") + content,
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
        parts.append(el("line", class_="grid", x1=left, y1=y, x2=frame.right_edge, y2=y))
        parts.append(el("text", escape(tick_label(tick)), class_="tick y-tick", x=left - 6, y=y + 4))
    label_y = frame.base + 16
    for slot, label in enumerate(x_labels):
        x = frame.x(slot)
        # Many rollouts' times side by side overlap: turned, they fit.
        turn = {"transform": f"rotate(-35 {x:.1f} {label_y:.1f})", "text_anchor": "end"} if rotate else {}
        parts.append(
            el("text", escape(label), class_="tick x-tick", x=x, y=label_y, **({"text_anchor": "middle"} | turn))
        )
    parts.append(el("line", class_="axis", x1=left, y1=frame.base, x2=frame.right_edge, y2=frame.base))
    parts.append(el("line", class_="axis", x1=left, y1=float(frame.top), x2=left, y2=frame.base))
    middle = (frame.top + frame.base) / 2
    upright = f"rotate(-90 16 {middle:.1f})"
    parts.append(el("text", escape(y_label), class_="axis-label", x=16.0, y=middle, transform=upright))
    parts.append(el("text", escape(x_label), class_="axis-label", x=left + frame.plot_width / 2, y=frame.height - 6.0))
    return "".join(parts)


def _legend(frame: _Frame, entries: Sequence[tuple[str, str]]) -> str:
    """Swatches in a row above the plot area: (css class, label)."""
    parts, x = [], float(frame.left)
    for css, label in entries:
        swatch = el("rect", x=x, y=10.0, width=12, height=12) + el("text", escape(label), x=x + 16, y=20.0)
        parts.append(el("g", swatch, class_=f"legend {css}"))
        x += 28 + 7 * len(label)
    return "".join(parts)


_STAGE_COLOURS = ("#bfdbfe", "#93c5fd", "#60a5fa", "#3b82f6", "#2563eb", "#1d4ed8")


def startup_timeline(rollout: WatchedRollout, width: float = 150.0) -> str:
    """The start-up's stages as one bar, each segment as long as its stage took (a tooltip each)."""
    end = rollout.elapsed_s
    if not rollout.stages or end is None or end <= 0:
        return ""
    segments = []
    for index, stage in enumerate(rollout.stages):
        until = rollout.stages[index + 1].at_s if index + 1 < len(rollout.stages) else end
        last = index + 1 == len(rollout.stages)
        colour = "#f87171" if last and rollout.status != "READY" else _STAGE_COLOURS[index % len(_STAGE_COLOURS)]
        tip = el("title", escape(f"{stage.label}: {stage.at_s:.1f} → {until:.1f} s ({until - stage.at_s:.1f} s)"))
        x = width * min(stage.at_s, end) / end
        span = max(width * min(until, end) / end - x, 0.0)
        segments.append(el("rect", tip, x=x, y=0.0, width=span, height=10, fill=colour))
    return el(
        "svg", "".join(segments), class_="timeline", viewBox=f"0 0 {width:.0f} 10", width=f"{width:.0f}", height=10
    )


def _empty_plot(plot_id: str, text: str) -> str:
    return f'<p id="{escape(plot_id)}" class="empty">{escape(text)}</p>'


@dataclass(frozen=True)
class _Series:
    label: str
    css: str
    unit: str
    values: tuple[float | None, ...]  # one per benchmarked rollout


def _series_marks(frame: _Frame, runs: Sequence[WatchedRollout], one: _Series) -> str:
    """A line through the series' values and a point per value, its tooltip the value."""
    points = [(i, v) for i, v in enumerate(one.values) if v is not None]
    parts = [el("polyline", class_="line", points=" ".join(f"{frame.x(i):.1f},{frame.y(v):.1f}" for i, v in points))]
    for i, value in points:
        refused = runs[i].refused
        tip = f"{runs[i].run_id}: {one.label} {value:.1f} {one.unit}" + (" (gate refused)" if refused else "")
        css = "point refused" if refused else "point"
        parts.append(el("circle", el("title", escape(tip)), class_=css, cx=frame.x(i), cy=frame.y(value), r=4))
    return el("g", "".join(parts), class_=f"series {one.css}")


def _line_plot(
    plot_id: str, title: str, y_label: str, runs: Sequence[WatchedRollout], series: Sequence[_Series]
) -> str:
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
    values = tuple(measured(r.bench.figures.output_tokens_per_s) if r.bench else None for r in runs)
    series = [_Series("output", "throughput", "tokens/s", values)]
    return _line_plot("plot-throughput", "Output tokens/s over rollouts", "output tokens/s", runs, series)


def latency_plot(history: HostHistory) -> str:
    runs = history.benchmarked
    figures = [r.bench.figures for r in runs if r.bench]
    latencies = (("TTFT", "ttft", [f.ttft_ms for f in figures]), ("ITL", "itl", [f.itl_ms for f in figures]))
    series = [
        _Series(f"{name} {p}", f"{css}-{p}", "ms", tuple(measured(ms[p]) for ms in per_run))
        for name, css, per_run in latencies
        for p in PERCENTILES
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
            tip = el("title", escape(f"position {position + 1}: {value * 100:.1f}% ({who})"))
            parts.append(el("rect", tip, class_=f"bar {css}", x=x, y=y, width=width - 2, height=frame.base - y))
    return _svg(plot_id, f"Acceptance per draft position, {newest.run_id}", frame, "".join(parts))


def _speedup_svg(plot_id: str, title: str, levels: list[int],
                 lines: Sequence[tuple[str, str, str, dict[int, float]]]) -> str:  # fmt: skip
    """Speed-ups over speculation off against concurrency, with the break-even line at x1: a line per
    (tooltip prefix, css class, legend label, {concurrency: speed-up})."""
    ticks = nice_ticks(max([1.25, *(s for *_, row in lines for s in row.values())]))
    frame = _Frame(slots=max(len(levels), 1), y_top=ticks[-1])
    parts = [_axes(frame, ticks, tick_label=lambda t: f"x{t:g}", x_labels=[str(c) for c in levels],
                   y_label="speed-up over speculation off", x_label="concurrent requests", rotate=False)]  # fmt: skip
    parts.append(el("line", class_="break-even", x1=float(frame.left), y1=frame.y(1.0), x2=frame.right_edge,
                    y2=frame.y(1.0)))  # fmt: skip
    parts.append(_legend(frame, [(css, legend) for _, css, legend, _ in lines]))
    for who, css, _, row in lines:
        points = [(levels.index(c), s) for c, s in row.items()]
        marks = [
            el("polyline", class_="line", points=" ".join(f"{frame.x(x):.1f},{frame.y(s):.1f}" for x, s in points))
        ]
        marks += [el("circle", el("title", escape(f"{who}: x{s:.2f} at {levels[x]}")), class_="point",
                     cx=frame.x(x), cy=frame.y(s), r=4) for x, s in points]  # fmt: skip
        parts.append(el("g", "".join(marks), class_=f"series {css}"))
    return _svg(plot_id, title, frame, "".join(parts))


def speedup_plot(history: HostHistory) -> str:
    """EAGLE-3's speed-up over speculation off against concurrency: a line per benchmarked rollout
    that has a baseline (the last few), and the break-even line at x1."""
    plot_id = "plot-speedup"
    if not history.benchmarked:
        return _empty_plot(plot_id, NO_BENCHMARK)
    runs = [r for r in history.benchmarked if r.bench and r.bench.speedup][-4:]
    if not runs:
        return _empty_plot(plot_id, "no rollout measured a speculation-off baseline (serving_bench_baseline: once)")
    levels = sorted({c for r in runs if r.bench for c in r.bench.speedup})
    lines = [(r.run_id, f"run-{i}", r.short_time, dict(r.bench.speedup)) for i, r in enumerate(runs) if r.bench]
    return _speedup_svg(plot_id, f"EAGLE-3 speed-up by concurrency: {runs[-1].bench.crossover}", levels, lines)  # type: ignore[union-attr]


def schedule_plot(history: HostHistory) -> str:
    """serving_speculative_schedule: auto, the newest choice: each draft length's speed-up over speculation
    off at each concurrency (what it was chosen from), and the chosen schedule's own, proven after."""
    plot_id = "plot-schedule"
    if not history.benchmarked:
        return _empty_plot(plot_id, NO_BENCHMARK)
    runs = [r for r in history.benchmarked if r.bench and r.bench.length_speeds]
    if not runs:
        return _empty_plot(plot_id, "no rollout chose a draft schedule (serving_speculative_schedule: auto)")
    bench = runs[-1].bench
    assert bench is not None
    off = bench.length_speeds.get(0, {})
    levels = sorted(off)
    lines = [(f"length {k}", f"length-{k}", f"length {k}", {c: row[c] / off[c] for c in levels if c in row and off[c]})
             for k, row in sorted(bench.length_speeds.items()) if k]  # fmt: skip
    proven = {c: bench.speedup[c] for c in levels if c in bench.speedup}
    lines.append(("the schedule", "schedule", "the schedule", proven))
    return _speedup_svg(plot_id, f"Draft schedule (auto), {runs[-1].run_id}: {bench.schedule}", levels, lines)
