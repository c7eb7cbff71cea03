"""`specdeploy monitor`: the monitoring host's Prometheus and Alertmanager on this machine. Both bind the
host's loopback and authenticate no client (roles/monitoring), so the way in is an SSH forward with the
inventory's own key and known_hosts, as `specdeploy endpoint` does for the engine's API."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from specdeploy import names
from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.targets import Forward

DEFAULT_LOCAL_PORT = names.PROMETHEUS_PORT
# (part, the inventory variable that moves its port, its default): the role's own defaults.
PARTS = (("prometheus", "monitoring_prometheus_port", names.PROMETHEUS_PORT),
         ("alertmanager", "monitoring_alertmanager_port", names.ALERTMANAGER_PORT))  # fmt: skip


@dataclass(frozen=True)
class Console:
    host: str  # inventory hostname
    part: str  # prometheus | alertmanager
    url: str  # http://127.0.0.1:PORT on this machine
    state: str  # what it answered, in words

    @property
    def name(self) -> str:
        return f"{self.host} {self.part}"


def prometheus_state(targets: Mapping[str, Any]) -> str:
    """Prometheus's `/api/v1/targets` answer in words: how many scrape targets are up, and which are not."""
    active = targets.get("data", {}).get("activeTargets", [])
    down = [f"{t['labels'].get('job', '?')}@{t['labels'].get('host', t['labels'].get('instance', '?'))}: "
            f"{t.get('lastError') or t.get('health')}" for t in active if t.get("health") != "up"]  # fmt: skip
    said = f"{len(active) - len(down)} of {len(active)} scrape targets up"
    return said + (f"; not up: {'; '.join(down)}" if down else "")


def describe(host: str, part: str, forward: Forward) -> Console:
    base = f"http://127.0.0.1:{forward.local}"
    path = "/api/v1/targets" if part == "prometheus" else "/api/v2/status"
    try:
        resp = httpx.get(base + path, timeout=10)
        resp.raise_for_status()
        state = prometheus_state(resp.json()) if part == "prometheus" else "answering"
    except (httpx.HTTPError, ValueError) as exc:
        state = f"not answering ({exc.__class__.__name__}): is it deployed? ansible-playbook ... --tags monitoring"
    return Console(host, part, base, state)


def remote_port(host: str, variable: str, value: Any, default: int) -> int:
    """The port VARIABLE sets in the inventory (a plain number: `ansible-inventory` renders no template)."""
    if value in (None, ""):
        return default
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    raise SpecdeployError(f"{host}: {variable} is {value!r}, not a port number this command can read",
                          hint=f"set {variable} to a number in the inventory")  # fmt: skip


def open_consoles(hostvars: Mapping[str, Mapping[str, Any]], monitoring: Sequence[str],
                  local_port: int) -> list[tuple[Console, Forward]]:  # fmt: skip
    """Prometheus and Alertmanager of each MONITORING host, on LOCAL_PORT, LOCAL_PORT+1, ... (0: any free)."""
    if not monitoring:
        raise SpecdeployError("the inventory has no `monitoring` group, so nothing runs Prometheus",
                              hint="add one (docs/monitoring.md; make fleet puts testbed-1 in it), then: "
                                   "ansible-playbook -i INVENTORY ansible/site.yml --tags monitoring")  # fmt: skip
    opened: list[tuple[Console, Forward]] = []
    try:
        for host in monitoring:
            connection = HostConnection.from_hostvars(hostvars[host])
            for part, variable, default in PARTS:
                port = local_port + len(opened) if local_port else 0
                forward = connection.forward(remote_port(host, variable, hostvars[host].get(variable), default), port)
                forward.start()
                opened.append((describe(host, part, forward), forward))
    except BaseException:
        for _, forward in opened:
            forward.stop()
        raise
    return opened
