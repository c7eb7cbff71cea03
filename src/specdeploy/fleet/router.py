"""The fleet's router: PyPI `vllm-router` (pinned in pins.yaml), its command line, and the worker URLs.

The watchdog decides membership, not the router: a worker is added through the router's
`/add_worker` only after its rollout's READY verdict, and removed before its engine is stopped.
The router's own health check stays on as a backstop, at a long interval (it probes `/health`,
which can answer 200 while the engine core is dead).

Measured on vllm-router 0.1.17 (a real router in front of real vLLM engines here): it checks no
client's key (its `--api-key` is only for workers) and forwards the client's Authorization header
unchanged, and its add/remove_worker API needs no key. So the engines' own `--api-key` guards
inference, and the router stays on loopback: off loopback anyone could add a worker.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy import names, pins
from specdeploy.engine_image import wheels

CONSTRAINTS = Path(__file__).with_name("router-constraints.txt")

POLICIES = ("round_robin", "power_of_two", "cache_aware", "random", "consistent_hash")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


@dataclass(frozen=True)
class RouterConfig:
    bind_address: str = "127.0.0.1"
    port: int = names.ROUTER_PORT
    policy: str = "round_robin"
    metrics_port: int = names.ROUTER_METRICS_PORT
    health_check_interval_s: int = 60
    request_timeout_s: int = 1800
    # Workers are added by the rollout once READY; a cold start waits this long at most for /health.
    worker_startup_timeout_s: int = 60
    extra_args: list[str] = field(default_factory=list)

    @classmethod
    def from_vars(cls, values: dict[str, Any]) -> RouterConfig:
        return cls(
            bind_address=str(values.get("bind_address", "127.0.0.1")),
            port=int(values.get("port", names.ROUTER_PORT)),
            policy=str(values.get("policy", "round_robin")),
            metrics_port=int(values.get("metrics_port", names.ROUTER_METRICS_PORT)),
            health_check_interval_s=int(values.get("health_check_interval", 60)),
            request_timeout_s=int(values.get("request_timeout", 1800)),
            worker_startup_timeout_s=int(values.get("worker_startup_timeout", 60)),
            extra_args=[str(a) for a in values.get("extra_args") or []],
        )

    def problems(self) -> list[str]:
        out = []
        if self.policy not in POLICIES:
            out.append(f"router_policy: {self.policy!r} is not one of {', '.join(POLICIES)}")
        if not is_loopback(self.bind_address):
            out.append(
                f"router_bind_address: {self.bind_address} leaves loopback, but vllm-router "
                f"{pins.HOST['router_version']} checks no client key and its add/remove_worker API is open: "
                "keep 127.0.0.1 and reach it with make endpoint (an SSH forward), or an authenticating proxy"
            )
        for name, port in (("router_port", self.port), ("router_metrics_port", self.metrics_port)):
            if not 0 < port < 65536:
                out.append(f"{name}: {port} is not a TCP port")
        return out

    def command(self, binary: str) -> list[str]:
        """The router's argv (no secret: clients' keys pass through to the engines, which check them)."""
        return [
            binary, "--host", self.bind_address, "--port", str(self.port), "--policy", self.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
            "--health-check-interval-secs", str(self.health_check_interval_s),
            "--worker-startup-timeout-secs", str(self.worker_startup_timeout_s),
            "--request-timeout-secs", str(self.request_timeout_s),
            *self.extra_args,
        ]  # fmt: skip


def wheelhouse(python_version: str | None = None) -> Path:
    """vllm-router and its pinned dependencies as one tar, made on the controller: the router host
    installs with --no-index (no index needed there, and no trust in a TLS proxy's certificate)."""
    version = pins.HOST["router_version"]
    tag = python_version or "controller"
    return wheels.wheelhouse_tar(f"vllm-router-{version}-py{tag}", [f"vllm-router=={version}", "-c", str(CONSTRAINTS)],
                                 python_version)  # fmt: skip
