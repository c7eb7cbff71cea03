"""The sentinel's own Prometheus metrics, served on its control port's `GET /metrics` (loopback, beside
the hold API): what it probed, how long a probe took, whom it took out of the router and why, and who
is a member now. Standard library only (the sentinel's venv has no prometheus_client).

Labels stay few: `host` is the worker's registration name (its inventory host), and a removal's
`reason` is the probe's kind (frozen, down, dead, failed, ...), never its free text."""

from __future__ import annotations

import threading
from collections import defaultdict

PREFIX = "specdeploy_sentinel"
HELP = {
    "probes_total": ("counter", "Probes of each worker, by what they found (alive, frozen, down, ...)."),
    "probe_seconds_sum": ("counter", "Seconds spent probing each worker (with _count: the mean probe time)."),
    "probe_seconds_count": ("counter", "Probes timed."),
    "removals_total": ("counter", "Workers taken out of the router by the sentinel, by the probe's kind."),
    "returns_total": ("counter", "Workers the sentinel put back into the router."),
    "member": ("gauge", "1 while the worker is a member of the router, else 0."),
    "held": ("gauge", "1 while a rollout holds the worker (out of the router by design), else 0."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Tally:
    """Thread-safe counters and gauges (each worker's thread writes; the control server reads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)

    def _add(self, name: str, amount: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self.lock:
            self.values[name][key] = self.values[name].get(key, 0.0) + amount

    def _set(self, name: str, value: float, **labels: str) -> None:
        with self.lock:
            self.values[name][tuple(sorted(labels.items()))] = value

    def probed(self, host: str, kind: str, seconds: float) -> None:
        self._add("probes_total", 1, host=host, kind=kind)
        self._add("probe_seconds_sum", seconds, host=host)
        self._add("probe_seconds_count", 1, host=host)

    def moved(self, host: str, action: str, kind: str) -> None:
        """The sentinel took HOST out (`remove`, for a probe of KIND) or put it back (`add`)."""
        if action == "remove":
            self._add("removals_total", 1, host=host, reason=kind)
        else:
            self._add("returns_total", 1, host=host)

    def state(self, host: str, member: bool, held: bool) -> None:
        self._set("member", float(member), host=host)
        self._set("held", float(held), host=host)

    def forget(self, host: str) -> None:
        """HOST is no longer registered: its gauges go (its counters stay, as Prometheus expects)."""
        with self.lock:
            for name in ("member", "held"):
                self.values[name].pop((("host", host),), None)

    def exposition(self) -> str:
        """The Prometheus text format (0.0.4)."""
        lines: list[str] = []
        with self.lock:
            for name, (kind, text) in HELP.items():
                series = self.values.get(name, {})
                base = name.removesuffix("_sum").removesuffix("_count")
                if not name.endswith("_count"):
                    lines += [f"# HELP {PREFIX}_{base} {text}",
                              f"# TYPE {PREFIX}_{base} {'summary' if base != name else kind}"]  # fmt: skip
                for labels, value in sorted(series.items()):
                    said = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                    lines.append(f"{PREFIX}_{name}{{{said}}} {value:g}")
        return "\n".join(lines) + "\n"
