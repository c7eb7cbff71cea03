"""The monitoring host's files, composed once here (roles/monitoring copies them; its action plugin
only passes the inventory in): prometheus.yml, the alert rules, and a dashboard per engine, each from
the inventory's engines and the gate's records on this controller (`.state/runs/<host>/`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specdeploy import records
from specdeploy.monitoring import alerts, dashboards, scrape
from specdeploy.monitoring.alerts import AlertSettings
from specdeploy.monitoring.targets import EngineTarget, RecordedAcceptance
from specdeploy.paths import state_dir
from specdeploy.record_types import Bench


def dump(doc: object) -> str:
    """YAML for the files. Ansible hands its values in as tagged subclasses of str, int and float
    (ansible-core 2.19's data tagging), which yaml.safe_dump refuses ("cannot represent an object"): a JSON
    round trip makes them the plain values they are."""
    text: str = yaml.safe_dump(json.loads(json.dumps(doc)), sort_keys=False, width=1000)
    return text


@dataclass(frozen=True)
class MonitoringFiles:
    prometheus_yml: str
    rules_yml: str
    dashboards: dict[str, str]  # file name -> Grafana JSON
    notes: list[str] = field(default_factory=list)


def last_gate(host: str, state: Path | None = None) -> Bench | None:
    """HOST's latest passed gate with an acceptance figure: what serves there now (a gate that failed was
    rolled back, and a start that never reached the gate wrote no bench.json)."""
    host_dir = records.host_runs(host, state)
    if not host_dir.is_dir():
        return None
    for run in reversed(records.rollout_runs(host_dir)):
        try:
            bench = records.read_bench(run)
        except (records.Malformed, ValueError, OSError):
            continue
        if isinstance(bench, Bench) and bench.gate.passed and bench.figures.acceptance_length is not None:
            return bench
    return None


def recorded(host: str, bench: Bench) -> RecordedAcceptance:
    return RecordedAcceptance(host=host, acceptance_length=float(bench.figures.acceptance_length or 0),
                              image=bench.image, hardware=bench.hardware or "unknown hardware",
                              config_digest=bench.config_digest, time=bench.time)  # fmt: skip


def compose(targets: list[EngineTarget], monitoring_host: str, ports: scrape.Ports, settings: AlertSettings,
            state: Path | None = None) -> MonitoringFiles:  # fmt: skip
    """Every file for the monitoring host. Refuses (ValueError) thresholds out of range."""
    problems = settings.problems()
    if problems:
        raise ValueError("; ".join(problems))
    gates = {t.host: b for t in targets if t.speculative and (b := last_gate(t.host, state)) is not None}
    accepted = {h: recorded(h, b) for h, b in gates.items()}
    rules, notes = alerts.rule_file(targets, accepted, settings, router=bool(ports.router_metrics))
    speedups = {h: dict(b.speedup) for h, b in gates.items()}
    boards = {}
    for engine in sorted({t.engine for t in targets}):
        shown = [accepted[t.host] for t in targets if t.engine == engine and t.host in accepted]
        boards[f"specdeploy-{engine}.json"] = json.dumps(dashboards.dashboard(engine, shown, speedups), indent=1)
    config = scrape.prometheus_config(targets, monitoring_host, ports)
    return MonitoringFiles(
        prometheus_yml=dump(config),
        rules_yml=dump(rules),
        dashboards=boards,
        notes=notes,
    )


def dashboards_dir(state: Path | None = None) -> Path:
    return (state or state_dir()) / "dashboards"


def write_dashboards(files: MonitoringFiles, state: Path | None = None) -> list[Path]:
    """The dashboards on this controller, for the operator to import into Grafana."""
    folder = dashboards_dir(state)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.dashboards.items():
        path = folder / name
        path.write_text(text + "\n")
        written.append(path)
    return written
