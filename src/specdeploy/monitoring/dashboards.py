"""Grafana dashboards (JSON to import) for each engine, every query from engine_metrics.

Grafana itself is not installed by specdeploy nor run in its tests: each panel's query is proven
against a live Prometheus instead (tests/integration/test_monitoring.py asks it for each one and wants
series back). The gate's measured speed-ups are a record, not a series: a text panel shows them beside
the live acceptance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.monitoring.engine_metrics import EngineMetrics, of
from specdeploy.monitoring.targets import RecordedAcceptance

WINDOW = "1m"
SCHEMA_VERSION = 39  # Grafana 10/11's dashboard JSON


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)


def panels(m: EngineMetrics) -> list[Panel]:
    """The panels of an engine's dashboard: throughput, latency, queue, KV cache, acceptance."""
    out = [
        Panel("Generated tokens/s", "short", ((m.tokens_per_second(WINDOW), "{{host}}"),)),
        Panel("Time to first token", "s", ((m.quantile(m.ttft, 0.5, WINDOW), "p50 {{host}}"),
                                           (m.quantile(m.ttft, 0.99, WINDOW), "p99 {{host}}"))),
        Panel("Inter-token latency", "s", ((m.quantile(m.itl, 0.5, WINDOW), "p50 {{host}}"),
                                           (m.quantile(m.itl, 0.99, WINDOW), "p99 {{host}}"))),
        Panel("Requests running and waiting", "short", ((m.in_flight(), "running {{host}}"),
                                                        (m.queued(), "waiting {{host}}"))),
        Panel("KV cache used", "percentunit", ((m.kv_used(), "{{host}}"),)),
        Panel("Mean acceptance length (EAGLE-3)", "short", ((m.acceptance_length(WINDOW), "{{host}}"),)),
    ]  # fmt: skip
    per_position = m.acceptance_per_position(WINDOW)
    if per_position:
        out.append(Panel("Acceptance per draft position", "percentunit", ((per_position, "{{host}} #{{position}}"),)))
    return out


def gate_text(records: list[RecordedAcceptance], speedups: dict[str, dict[int, float]]) -> str:
    """The gate's record for each host, in Markdown: acceptance and speed-up per concurrency."""
    if not records:
        return "No gate record yet: the benchmark gate has not measured what serves."
    lines = [
        "| host | gate acceptance | speed-up by concurrency | image | hardware | measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        ups = ", ".join(f"x{v:.2f} at {c}" for c, v in sorted(speedups.get(r.host, {}).items())) or "-"
        lines.append(f"| {r.host} | {r.acceptance_length:.2f} | {ups} | {r.image} | {r.hardware} | {r.time} |")
    return "\n".join(lines)


def dashboard(engine: str, records: list[RecordedAcceptance], speedups: dict[str, dict[int, float]]) -> dict[str, Any]:
    """ENGINE's dashboard, Grafana JSON (a `datasource` variable picks the Prometheus)."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    built: list[dict[str, Any]] = []
    for i, panel in enumerate(panels(of(engine))):
        built.append({
            "id": i + 1, "type": "timeseries", "title": panel.title, "datasource": source,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "targets": [{"refId": chr(65 + j), "expr": expr, "legendFormat": legend, "datasource": source}
                        for j, (expr, legend) in enumerate(panel.queries)],
        })  # fmt: skip
    built.append({"id": len(built) + 1, "type": "text", "title": "What the benchmark gate measured",
                  "gridPos": {"h": 8, "w": 24, "x": 0, "y": 8 * ((len(built) + 1) // 2)},
                  "options": {"mode": "markdown", "content": gate_text(records, speedups)}})  # fmt: skip
    return {
        "uid": f"specdeploy-{engine}", "title": f"specdeploy: {engine}", "schemaVersion": SCHEMA_VERSION,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "tags": ["specdeploy", engine],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": built,
    }  # fmt: skip


def queries(engine: str) -> list[str]:
    """Every query of ENGINE's dashboard, for the test that proves each against a live Prometheus."""
    return [expr for panel in panels(of(engine)) for expr, _ in panel.queries]
