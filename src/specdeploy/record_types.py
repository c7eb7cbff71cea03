"""The record types: what a host's run folder holds (records.py reads and writes them) and what the
phases that measure make (gate/ the benchmark's figures, serve/ the prewarm's report). They sit below
every package that makes, keeps or reads them, so none of those imports another to name a record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Figures:
    completed: int
    failed: int
    duration_s: float
    concurrency: int
    max_tokens: int
    output_tokens_per_s: float
    ttft_ms: dict[str, float]  # {"p50": …, "p99": …}
    itl_ms: dict[str, float]
    acceptance_rate: float | None = None  # accepted / drafted tokens, a fraction
    acceptance_length: float | None = None  # 1 + accepted tokens per draft
    per_position_acceptance: list[float] = field(default_factory=list)
    # Time per output token after the first, per request ({"p50", "p99"}; empty where the client's result
    # had none). Under speculation this is the per-token cost: the tokens one verify step accepts stream
    # as a burst, so SGLang's ITL median is the gap inside a burst (1.4 ms against a 7.8 ms TPOT, H100).
    tpot_ms: dict[str, float] = field(default_factory=dict)
    # The host's 1-minute load average per CPU around the run (None: not read): two throughputs
    # measured under different loads do not compare (gate.rules.incomparable).
    host_load: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Figures:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def summary(self) -> str:
        rate = f"acceptance {self.acceptance_rate:.0%}, " if self.acceptance_rate is not None else ""
        acceptance = f", {rate}mean length {self.acceptance_length:.2f}" if self.acceptance_length is not None else ""
        load = f", host load {self.host_load:.2f}/CPU" if self.host_load is not None else ""
        tpot = f", TPOT p50 {self.tpot_ms['p50']:.1f} ms" if "p50" in self.tpot_ms else ""
        return (f"{self.output_tokens_per_s:.1f} output tok/s, TTFT p50 {self.ttft_ms['p50']:.0f} ms, "
                f"ITL p50 {self.itl_ms['p50']:.1f} ms{tpot}{acceptance} ({self.completed} requests, "
                f"{self.concurrency} at once, {self.max_tokens} tokens each, "
                f"{self.duration_s:.1f} s{load})")  # fmt: skip


@dataclass(frozen=True)
class PrewarmReport:
    warmed: bool
    message: str
    model_bytes: int = 0
    planned_bytes: int = 0
    budget_bytes: int = 0
    readers: int = 0
    seconds: float = 0.0
    gb_per_s: float = 0.0
    resident_fraction: float | None = None
    partial: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Gate:
    enabled: bool
    passed: bool
    problems: tuple[str, ...]
    seconds: float | None
    note: str = ""  # what the figures were compared with, or why nothing was measured


@dataclass(frozen=True)
class Bench:
    """bench.json with figures: the benchmark run after READY and the gate's judgement of it."""

    time: str
    image: str
    image_id: str
    config_digest: str
    hardware: str
    figures: Figures
    previous: Figures | None
    gate: Gate
    # What `previous` is: "outgoing" (the version replaced, measured just before it stopped), "record"
    # (the last promoted version's figures), "none"; "" in files from before the A/B.
    comparison: str = ""
    # Speculation's speed-up over the speculation-off baseline, by concurrency, and the verdict's line.
    speedup: dict[int, float] = field(default_factory=dict)
    crossover: str = ""
    # serving_speculative_schedule: auto: the schedule chosen, in words, and the speed of each draft length
    # (0: speculation off) at each concurrency it was chosen from; empty otherwise.
    schedule: str = ""
    length_speeds: dict[int, dict[int, float]] = field(default_factory=dict)
