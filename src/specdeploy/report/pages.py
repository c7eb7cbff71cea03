"""The report's pages: one self-contained HTML page per host of its recorded rollouts, and an index.

Pages are plain HTML with inline CSS and SVG: no JavaScript and no external URL, so they open from
a file, a CI artefact or an e-mail. What they show is read by `specdeploy.report.reading`; the plots
are drawn by `specdeploy.report.plots`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

from specdeploy.errors import SpecdeployError
from specdeploy.report.plots import (
    acceptance_plot,
    escape,
    latency_plot,
    schedule_plot,
    speedup_plot,
    startup_timeline,
    throughput_plot,
)
from specdeploy.report.reading import DEFAULT_LAST, PERCENTILES, HostHistory, WatchedRollout, measured, read_runs

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


# --- Formatting ------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    shown = measured(value)
    return "—" if shown is None else f"{shown:.{digits}f}{unit}"


def _percent(value: float | None) -> str:
    shown = measured(value)
    return "—" if shown is None else f"{shown * 100:.1f}%"


def _percentiles(ms: dict[str, float]) -> str:
    """The gate's p50 and p99 (ttft_ms or itl_ms): `p50 / p99`."""
    return " / ".join(_fmt(ms[p]) for p in PERCENTILES)


def _css_word(value: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", value.lower())


def page_name(host: str) -> str:
    """The host's page file: its name with anything a file system or URL may mind replaced."""
    safe = _SAFE_NAME.sub("_", host) or "_"
    return f"host-{safe}.html" if safe in {"index", "."} or safe.startswith("..") else f"{safe}.html"


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
                 "itl-p50": ("#c2410c", ""), "itl-p99": ("#fb923c", "5 3"),
                 # The speed-up plot's rollouts, oldest to newest.
                 "run-0": ("#d1d5db", ""), "run-1": ("#9ca3af", ""), "run-2": ("#60a5fa", ""),
                 "run-3": ("#1d4ed8", ""),
                 # The draft schedule's plot: each fixed length dashed, the chosen schedule solid.
                 **{f"length-{k}": (c, "5 3") for k, c in enumerate(("#9ca3af", "#60a5fa", "#a78bfa", "#f472b6",
                                                                      "#fb923c", "#facc15", "#34d399", "#94a3b8"), 1)},
                 "schedule": ("#16a34a", "")}  # fmt: skip
_CSS += "svg .break-even{stroke:#16a34a;stroke-dasharray:4 3}\n"
_CSS += "".join(
    f"svg .{css} .line{{stroke:{colour}{f';stroke-dasharray:{dash}' if dash else ''}}}"
    f"svg .{css} .point:not(.refused),svg .legend.{css} rect{{fill:{colour}}}\n"
    for css, (colour, dash) in _SERIES_STYLE.items()
)


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def _generated(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")


def _status_badge(status: str) -> str:
    return f'<span class="badge status-{_css_word(status)}">{escape(status)}</span>'


def _gate_cell(rollout: WatchedRollout) -> str:
    outcome = rollout.gate_outcome
    css = "gate-passed" if outcome == "passed" else "gate-refused" if outcome.startswith("refused") else "gate-none"
    return f'<td class="gate {css}">{escape(outcome)}</td>'


_HEADLINE_CHARS = 160  # a traceback's headline can run to a paragraph; the rest is in its tooltip


def _startup_cell(rollout: WatchedRollout) -> str:
    if rollout.status == "READY":
        head = f"READY in {_fmt(rollout.elapsed_s, unit=' s')}"
    else:
        head = f"not READY: {rollout.stage or 'no stage'}, {_fmt(rollout.elapsed_s, unit=' s')}"
    stages = "".join(f"<li>{s.at_s:.1f} s {escape(s.label)}</li>" for s in rollout.stages)
    details = f'<details class="stages"><summary>{len(rollout.stages)} stages</summary><ol>{stages}</ol></details>'
    return f'<td class="startup">{escape(head)}{startup_timeline(rollout)}{details if stages else ""}</td>'


def _short_image(image: str) -> str:
    """A bare image id (docker inspect names no tag for a container made from an id) to its usual 12 digits."""
    match = re.fullmatch(r"sha256:([0-9a-f]{12})[0-9a-f]{52}", image)
    return f"sha256:{match[1]}" if match else image


def _headline(text: str) -> str:
    if not text:
        return ""
    shown = text if len(text) <= _HEADLINE_CHARS else text[: _HEADLINE_CHARS - 1] + "…"
    return f'<div class="headline" title="{escape(text)}">{escape(shown)}</div>'


def _acceptance_cells(rollout: WatchedRollout) -> str:
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


def _rollout_row(rollout: WatchedRollout) -> str:
    figures = rollout.bench.figures if rollout.bench else None
    image_id = rollout.bench.image_id if rollout.bench else ""
    # <wbr>: a narrow column breaks a long image name after its / or :, not mid-word.
    shown = escape(_short_image(rollout.image)).replace("/", "/<wbr>").replace(":", ":<wbr>")
    image = f'<code title="{escape(image_id or rollout.image)}">{shown}</code>' if rollout.image else "—"
    tps = _fmt(figures.output_tokens_per_s) if figures else "—"
    ttft = _percentiles(figures.ttft_ms) if figures else "—"
    itl = _percentiles(figures.itl_ms) if figures else "—"
    return (
        f'<tr class="rollout" id="run-{escape(rollout.run_id)}">'
        f'<td class="run"><code>{escape(rollout.run_id)}</code> <span class="when">{escape(rollout.started)}</span>'
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
    items = [("newest rollout", f"<code>{escape(newest.run_id)}</code> {_status_badge(newest.status)}"),
             ("benchmark gate", escape(newest.gate_outcome))]  # fmt: skip
    if history.benchmarked:
        bench = history.benchmarked[-1].bench
        assert bench is not None  # benchmarked
        items += [
            ("newest benchmark", f"{escape(bench.time)} (<code>{escape(history.benchmarked[-1].run_id)}</code>)"),
            ("image", f"<code>{escape(bench.image)}</code>"),
            ("image id", f"<code>{escape(bench.image_id)}</code>"),
            ("config digest", f"<code>{escape(bench.config_digest)}</code>"),
            ("hardware", escape(bench.hardware)),
            ("requests", f"{bench.figures.completed} completed, {bench.figures.failed} failed"),
            ("compared with", "the previous promoted version" if bench.previous else "nothing (the first benchmark)"),
        ]
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return f'<figure class="summary"><h2>Newest</h2><dl>{rows}</dl></figure>'


def _notes(notes: Iterable[str]) -> str:
    listed = "".join(f"<li>{escape(n)}</li>" for n in notes)
    return (
        f'<section class="notes" id="notes"><strong>Skipped files</strong><ul>{listed}</ul></section>' if listed else ""
    )


def render_host_page(history: HostHistory, now: datetime | None = None) -> str:
    figures = [
        ("Acceptance per draft position", acceptance_plot(history)),
        ("Output tokens/s", throughput_plot(history)),
        ("Latency", latency_plot(history)),
        ("Does EAGLE-3 pay?", speedup_plot(history)),
        ("Draft length by concurrency", schedule_plot(history)),
    ]
    plots = _summary(history) + "".join(f"<figure><h2>{title}</h2>{plot}</figure>" for title, plot in figures)
    shown = f"the last {len(history.rollouts)} of {history.found} rollouts" if history.found else "no rollouts"
    body = (
        f"<header><h1>Rollouts of <code>{escape(history.host)}</code></h1>"
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
        link = f'<a href="{escape(quote(page_name(history.host)))}">{escape(history.host)}</a>'
        status = _status_badge(newest.status) if newest else "—"
        gate = escape(newest.gate_outcome) if newest else "—"
        tps = _fmt(bench.figures.output_tokens_per_s) if bench else "—"
        run = f"<code>{escape(newest.run_id)}</code>" if newest else "—"
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
