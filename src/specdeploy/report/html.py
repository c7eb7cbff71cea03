"""`specdeploy report`: one self-contained HTML page per host of its recorded rollouts.

The names the CLI (and earlier callers) import from here, kept in one place: the report is read by
`specdeploy.report.reading`, drawn by `specdeploy.report.plots` and written by `specdeploy.report.pages`.
"""

from __future__ import annotations

from specdeploy.report.pages import page_name, render_host_page, render_index, write_report
from specdeploy.report.plots import NO_BENCHMARK, acceptance_plot, latency_plot, nice_ticks, throughput_plot
from specdeploy.report.reading import (
    BENCH_SCHEMA,
    DEFAULT_LAST,
    Bench,
    Gate,
    HostHistory,
    Stage,
    WatchedRollout,
    parse_bench,
    parse_figures,
    read_host,
    read_rollout,
    read_runs,
)

__all__ = [
    "BENCH_SCHEMA",
    "DEFAULT_LAST",
    "NO_BENCHMARK",
    "Bench",
    "Gate",
    "HostHistory",
    "Stage",
    "WatchedRollout",
    "acceptance_plot",
    "latency_plot",
    "nice_ticks",
    "page_name",
    "parse_bench",
    "parse_figures",
    "read_host",
    "read_rollout",
    "read_runs",
    "render_host_page",
    "render_index",
    "throughput_plot",
    "write_report",
]
