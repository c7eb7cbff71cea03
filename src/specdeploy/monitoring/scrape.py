"""Prometheus's configuration: what it scrapes, from the inventory, and where it sends alerts.

- Every engine's API (`/metrics`; rank 0 of a multi-node engine: the other ranks serve no HTTP. vLLM 0.33's
  `--headless` starts "no API servers" (`entrypoints/cli/serve.py`); SGLang 0.5.23 returns before its HTTP
  server on `node_rank >= 1` (`srt/entrypoints/http_server.py`)),
  at the address the router and the sentinel use (serving_fleet_address, else ansible_host). Neither pinned
  engine asks for its API key on `/metrics` (vLLM 0.33 guards only `/v1`, `/v2`, `/inference`, `/cohere`:
  `entrypoints/serve/middleware/authenticate.py`; SGLang 0.5.23 lets `/health`, `/ready` and `/metrics`
  through: `srt/utils/auth.py`), so no key is in this file.
- The router (vllm-router's Prometheus port) and the sentinel (its control port's `/metrics`): both on
  the router host's loopback, so Prometheus runs on that host.
- Prometheus and Alertmanager themselves, on loopback.
Each target carries `host`, its inventory host name: the label every rule and panel sums by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy import names
from specdeploy.monitoring.targets import EngineTarget

ENGINE_JOB, ROUTER_JOB, SENTINEL_JOB = "engine", "router", "sentinel"
RULES_PATH = "/etc/prometheus/specdeploy-rules.yml"


@dataclass(frozen=True)
class Ports:
    """Where the monitoring host's own parts listen (all on loopback)."""

    prometheus: int = names.PROMETHEUS_PORT
    alertmanager: int = names.ALERTMANAGER_PORT
    router_metrics: int = 0  # 0: no router on this host
    sentinel: int = 0


def engine_targets(hosts: list[str], hostvars: Any, monitoring_host: str = "") -> list[EngineTarget]:
    """One target per engine API in the inventory, from each host's composed `serving_config` (the
    serving role's check sets it) and its address. A host without one is not an engine host. The
    engine on MONITORING_HOST itself is reached on 127.0.0.1: its API binds loopback by default
    (serving_bind_address), which its own host name does not reach."""
    out = []
    for host in hosts:
        facts = hostvars[host]
        config = facts.get("serving_config") or {}
        if not config or int(config.get("node_rank") or 0) != 0:
            continue
        address = "127.0.0.1" if host == monitoring_host else (
            facts.get("serving_fleet_address") or facts.get("ansible_host") or host)  # fmt: skip
        out.append(EngineTarget(host=host, engine=str(config["engine"]), address=f"{address}:{int(config['port'])}",
                                speculative=str(config.get("speculative_method") or "none") != "none"))  # fmt: skip
    return out


def prometheus_config(targets: list[EngineTarget], monitoring_host: str, ports: Ports,
                      interval_s: int = 5) -> dict[str, Any]:  # fmt: skip
    """prometheus.yml: one job per kind of part, each target labelled with its inventory host."""

    def job(name: str, entries: list[tuple[str, dict[str, str]]]) -> dict[str, Any]:
        return {"job_name": name, "static_configs": [{"targets": [t], "labels": labels} for t, labels in entries]}

    local = {"host": monitoring_host}
    jobs = [
        job(ENGINE_JOB, [(t.address, {"host": t.host, "engine": t.engine}) for t in targets]),
        job("prometheus", [(f"127.0.0.1:{ports.prometheus}", local)]),
        job("alertmanager", [(f"127.0.0.1:{ports.alertmanager}", local)]),
    ]
    if ports.router_metrics:
        jobs.append(job(ROUTER_JOB, [(f"127.0.0.1:{ports.router_metrics}", local)]))
    if ports.sentinel:
        # Its series name the worker's host themselves: that `host` wins over the target's.
        jobs.append({**job(SENTINEL_JOB, [(f"127.0.0.1:{ports.sentinel}", local)]), "honor_labels": True})
    return {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [RULES_PATH],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}]},
        "scrape_configs": jobs,
    }
