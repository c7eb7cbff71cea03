"""The report's reading: a host's run folders, `.state/runs/<host>/<run id>/`, as records.

Each rollout the controller watched left the watchdog's `verdict.json` there, and the benchmark
gate's `bench.json` where the gate ran after READY; both are read by their owner,
`specdeploy.records`, whose figures are the gate's own `Figures`. A file that cannot be read is
named in a note and skipped; it never stops the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdeploy.record_types import Bench, Gate
from specdeploy.records import (
    BENCH_FILE,
    CONTAINER_FILE,
    PERCENTILES,
    VERDICT_FILE,
    Stage,
    container_image,
    host_folders,
    measured,
    read_bench,
    read_verdict,
    rollout_runs,
)

# The report's view of the records; the records themselves are specdeploy.records'.
__all__ = ["DEFAULT_LAST", "PERCENTILES", "Bench", "Gate", "HostHistory", "Stage", "WatchedRollout", "measured",
           "read_host", "read_rollout", "read_runs"]  # fmt: skip

DEFAULT_LAST = 20
_RUN_TIME = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})")
_NOTE_CHARS = 300  # a decoder's message quotes the file; keep a note one line


@dataclass(frozen=True)
class WatchedRollout:
    """One watched rollout: its folder's verdict.json and, when the gate ran, its bench.json."""

    run_id: str
    status: str
    elapsed_s: float | None
    stage: str
    headline: str
    stages: tuple[Stage, ...]
    # The watchdog's start-up completion (one request): shown only where no benchmark ran.
    probe_acceptance_rate: float | None
    probe_acceptance_length: float | None
    image: str
    bench: Bench | None
    bench_unreadable: bool = False
    # The gate's judgement where bench.json holds no figures (an SGLang engine, or a client that failed).
    unmeasured: Gate | None = None

    @property
    def started(self) -> str:
        """The run id's time, readable: the id starts with the UTC launch time."""
        match = _RUN_TIME.match(self.run_id)
        if not match:
            return self.run_id
        year, month, day, hour, minute, second = match.groups()
        return f"{year}-{month}-{day} {hour}:{minute}:{second}"

    @property
    def short_time(self) -> str:
        match = _RUN_TIME.match(self.run_id)
        return f"{match[2]}-{match[3]} {match[4]}:{match[5]}" if match else self.run_id[:14]

    @property
    def gate(self) -> Gate | None:
        return self.bench.gate if self.bench is not None else self.unmeasured

    @property
    def refused(self) -> bool:
        """The gate ran, switched on, and refused it."""
        return self.gate is not None and self.gate.enabled and not self.gate.passed

    @property
    def gate_outcome(self) -> str:
        gate = self.gate
        if self.bench_unreadable:
            return "bench.json unreadable"
        if gate is None:
            return "not run"
        if self.bench is None and gate.passed:
            return "nothing measured"
        if not gate.enabled:
            return "measured, gate off"
        if gate.passed:
            return "passed"
        return "refused: " + "; ".join(gate.problems) if gate.problems else "refused"


@dataclass(frozen=True)
class HostHistory:
    """A host's last rollouts (newest last) and the files that had to be skipped."""

    host: str
    rollouts: tuple[WatchedRollout, ...]
    found: int  # rollout folders (with a verdict.json) before the cut to the last N
    notes: tuple[str, ...]

    @property
    def benchmarked(self) -> list[WatchedRollout]:
        return [r for r in self.rollouts if r.bench is not None]


# --- Reading ---------------------------------------------------------------------------------


def _problem(path: Path, exc: Exception) -> str:
    reason = " ".join(str(exc).split())[:_NOTE_CHARS]
    return f"{path.parent.name}/{path.name} skipped: {reason or type(exc).__name__}"


def read_rollout(run: Path, notes: list[str]) -> WatchedRollout | None:
    """One run folder; None (and a note) where its verdict.json cannot be read."""
    try:
        verdict = read_verdict(run)
    except (OSError, ValueError) as exc:
        notes.append(_problem(run / VERDICT_FILE, exc))
        return None
    bench: Bench | Gate | None = None
    unreadable = False
    try:
        bench = read_bench(run)
    except (OSError, ValueError) as exc:
        notes.append(_problem(run / BENCH_FILE, exc))
        unreadable = True
    measured_bench = bench if isinstance(bench, Bench) else None
    image = measured_bench.image if measured_bench else ""
    if not image:
        try:
            image = container_image(run)
        except (OSError, ValueError) as exc:
            notes.append(_problem(run / CONTAINER_FILE, exc))
    return WatchedRollout(
        run_id=run.name,
        status=verdict.status,
        elapsed_s=verdict.elapsed_s,
        stage=verdict.stage,
        headline=verdict.headline,
        stages=verdict.stages,
        probe_acceptance_rate=verdict.acceptance_rate,
        probe_acceptance_length=verdict.acceptance_length,
        image=image,
        bench=measured_bench,
        bench_unreadable=unreadable,
        unmeasured=bench if isinstance(bench, Gate) else None,
    )


def read_host(host_dir: Path, last: int = DEFAULT_LAST) -> HostHistory:
    """A host's last `last` rollouts, oldest first. Folders without verdict.json (image builds) are not rollouts."""
    notes: list[str] = []
    try:
        runs = rollout_runs(host_dir)
    except OSError as exc:
        return HostHistory(host_dir.name, (), 0, (f"{host_dir} unreadable: {exc}",))
    rollouts = [r for r in (read_rollout(run, notes) for run in runs[-last:]) if r is not None]
    return HostHistory(host_dir.name, tuple(rollouts), len(runs), tuple(notes))


def read_runs(runs_root: Path, last: int = DEFAULT_LAST) -> list[HostHistory]:
    """Every host folder under `runs_root`, by name."""
    return [read_host(d, last) for d in host_folders(runs_root)]
