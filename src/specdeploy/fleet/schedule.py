"""A fleet rollout's schedule: batches of `rollout_max_unavailable` hosts, and what it costs on paper.

One rule for both the play and `specdeploy plan`: the play's `serial` is the batch sizes computed
here, so what the plan prints is what the rollout does.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from specdeploy.errors import SpecdeployError

_COUNT = re.compile(r"^\s*(\d+)\s*(%?)\s*$")


def batch_size(max_unavailable: int | str, hosts: int) -> int:
    """Hosts out of service at once: a count, or a percentage of the fleet rounded down, at least 1."""
    match = _COUNT.match(str(max_unavailable))
    if hosts < 1:
        raise SpecdeployError("the fleet has no engine hosts", hint="add hosts to the inventory's engine group")
    if not match or int(match[1]) == 0 or (match[2] and int(match[1]) > 100):
        raise SpecdeployError(
            f"rollout_max_unavailable: {max_unavailable!r} is not a host count >= 1 or a percentage 1-100%",
            hint="set rollout_max_unavailable: 1 (one host at a time) or e.g. '25%'",
        )
    value = int(match[1])
    size = max(1, hosts * value // 100) if match[2] else value
    return min(size, hosts)


def units(hosts: int, nnodes: int = 1) -> list[str]:
    """The fleet's units of capacity: one per engine, and an engine over NNODES hosts (serving_nnodes) is
    one unit: its ranks are rolled out, serve and fail together (specdeploy.serve.group)."""
    if nnodes < 1 or hosts % nnodes:
        raise SpecdeployError(f"{hosts} hosts do not split into engines of {nnodes} hosts (serving_nnodes)",
                              hint="pass --hosts as a multiple of --nnodes")  # fmt: skip
    if nnodes == 1:
        return [f"host-{i}" for i in range(1, hosts + 1)]
    return [f"host-{i}..host-{i + nnodes - 1}" for i in range(1, hosts + 1, nnodes)]


def batches(hosts: list[str], max_unavailable: int | str) -> list[list[str]]:
    size = batch_size(max_unavailable, len(hosts))
    return [hosts[i : i + size] for i in range(0, len(hosts), size)]


@dataclass(frozen=True)
class Load:
    """Offered load and what one engine serves, both in requests per second."""

    offered_rps: float
    per_host_rps: float


@dataclass(frozen=True)
class FleetPlan:
    batches: list[list[str]]
    drain_s: float
    load_s: float
    duration_s: float
    serving_hosts_min: int
    hosts: int
    # Under the given load: the router's longest queue wait during the rollout (a fluid model: the
    # backlog grows at offered - capacity while a batch is out, then drains at the spare capacity).
    queue_wait_max_s: float | None = None
    utilisation_max: float | None = None
    # The engine starts each host makes beside its own on the first rollout of a configuration (the
    # gate's baseline, auto's draft lengths: gate.rules.measuring_starts), each out of the router.
    measuring: tuple[str, ...] = ()

    @property
    def capacity_min(self) -> float:
        return self.serving_hosts_min / self.hosts

    @property
    def measuring_s(self) -> float:
        """The first rollout's extra seconds at the least: each measuring start's load, batch after batch."""
        return len(self.measuring) * self.load_s * len(self.batches)

    def lines(self) -> list[str]:
        out = [f"batch {i}: {', '.join(batch)}" for i, batch in enumerate(self.batches, 1)]
        out.append(f"per batch: drain ≤ {self.drain_s:.0f} s + load to READY {self.load_s:.0f} s")
        out.append(f"expected duration: {self.duration_s:.0f} s ({self.duration_s / 60:.1f} min)")
        if self.measuring:
            extra = self.measuring_s
            out.append(f"the first rollout of this configuration: each host also starts the engine "
                       f"{len(self.measuring)} more time(s) out of the router, to READY and a sweep each "
                       f"({', '.join(self.measuring)}): at least +{extra:.0f} s ({extra / 60:.1f} min) and the "
                       "sweeps; later rollouts reuse each host's record")  # fmt: skip
        out.append(f"lowest serving capacity: {self.serving_hosts_min}/{self.hosts} hosts ({self.capacity_min:.0%})")
        if self.utilisation_max is not None and self.queue_wait_max_s is not None:
            if self.serving_hosts_min == 0:
                out.append("queue: no host serves while the batch is out; requests wait or fail at the router")
            else:
                out.append(f"peak utilisation during a batch: {self.utilisation_max:.0%}")
                out.append(f"longest wait in the router's queue: {self.queue_wait_max_s:.1f} s")
        return out


def plan(
    hosts: list[str],
    max_unavailable: int | str,
    load_s: float,
    drain_s: float,
    load: Load | None = None,
    *,
    measuring: tuple[str, ...] = (),
) -> FleetPlan:
    if load_s <= 0 or drain_s < 0:
        raise SpecdeployError("the per-host load time must be > 0 s and the drain time >= 0 s",
                              hint="pass --load-seconds (a measured start-up) and --drain-seconds")  # fmt: skip
    groups = batches(hosts, max_unavailable)
    window = drain_s + load_s  # a batch is out of the router for this long
    serving_min = len(hosts) - max(len(b) for b in groups)
    wait = util = None
    if load is not None:
        if load.per_host_rps <= 0 or load.offered_rps < 0:
            raise SpecdeployError("--per-host-rps must be > 0 and --offered-rps >= 0")
        util = math.inf if serving_min == 0 else load.offered_rps / (serving_min * load.per_host_rps)
        wait = _fluid_wait(load, serving_min, len(hosts), window)
    return FleetPlan(groups, drain_s, load_s, window * len(groups), serving_min, len(hosts), wait, util, measuring)


def _fluid_wait(load: Load, serving: int, hosts: int, window: float) -> float:
    """Longest FIFO queueing delay while a batch is out for `window` seconds (a fluid model).

    With offered rate L above the reduced capacity r, a request arriving at t finds a backlog
    (L - r) t; it is served at r until the batch returns at `window`, then at the full capacity C > L.
    Its wait rises as (L - r) t / r up to t* = r window / L and falls after it, so the longest is
    window (1 - r / L). If the full fleet cannot keep up (C <= L) the queue never drains.
    """
    reduced, full = serving * load.per_host_rps, hosts * load.per_host_rps
    if load.offered_rps >= full and load.offered_rps > 0:
        return math.inf
    if load.offered_rps <= reduced:
        return 0.0
    return window * (1 - reduced / load.offered_rps)


def last_measured_load_s(runs: Path) -> tuple[float, str] | None:
    """The newest READY start-up this controller watched (its diagnostics folders), and where."""
    newest: tuple[str, float, str] | None = None
    for verdict in runs.glob("*/*/verdict.json"):
        try:
            data = json.loads(verdict.read_text())
        except (OSError, ValueError):
            continue
        if data.get("status") == "READY" and isinstance(data.get("elapsed_s"), (int, float)):
            key = verdict.parent.name
            if newest is None or key > newest[0]:
                newest = (key, float(data["elapsed_s"]), str(verdict.parent))
    return (newest[1], newest[2]) if newest else None
