"""The monitoring package's record types, at its bottom (scrape, alerts, dashboards and plan read them):
what Prometheus scrapes, and what the gate recorded for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineTarget:
    """One engine's API (rank 0 of a multi-node engine: the headless ranks serve no HTTP)."""

    host: str
    engine: str  # vllm | sglang
    address: str  # host:port, as the monitoring host reaches it
    speculative: bool


@dataclass(frozen=True)
class RecordedAcceptance:
    """The gate's mean acceptance length for what serves on HOST, and what it was measured on."""

    host: str
    acceptance_length: float
    image: str
    hardware: str
    config_digest: str
    time: str
