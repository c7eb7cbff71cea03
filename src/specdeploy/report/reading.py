"""The report's reading: a host's run folders, `.state/runs/<host>/<run id>/`, as records.

Each rollout the controller watched left the watchdog's `verdict.json` there, and the benchmark
gate's `bench.json` (schema 1) where the gate ran after READY; its figures are read back into the
gate's own `Figures`. A file that cannot be read is named in a note and skipped; it never stops
the report.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from specdeploy.gate.figures import Figures

DEFAULT_LAST = 20
BENCH_SCHEMA = 1
_RUN_TIME = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})")
_NOTE_CHARS = 300  # a decoder's message quotes the file; keep a note one line
PERCENTILES = ("p50", "p99")  # of the gate's ttft_ms and itl_ms


@dataclass(frozen=True)
class Stage:
    """A start-up stage the watchdog saw, and when (seconds after launch)."""

    label: str
    at_s: float


@dataclass(frozen=True)
class Gate:
    enabled: bool
    passed: bool
    problems: tuple[str, ...]
    seconds: float | None


@dataclass(frozen=True)
class Bench:
    """bench.json: the benchmark run after READY and the gate's judgement of it."""

    time: str
    image: str
    image_id: str
    config_digest: str
    hardware: str
    figures: Figures
    previous: Figures | None
    gate: Gate


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
    def refused(self) -> bool:
        """Benchmarked, and the gate (switched on) refused it."""
        return self.bench is not None and self.bench.gate.enabled and not self.bench.gate.passed

    @property
    def gate_outcome(self) -> str:
        if self.bench_unreadable:
            return "bench.json unreadable"
        if self.bench is None:
            return "not run"
        gate = self.bench.gate
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


def measured(value: float | None) -> float | None:
    """A figure as the report shows it: None where there is none, or it is NaN or infinite (plotted nowhere)."""
    return value if value is not None and math.isfinite(value) else None


# --- Reading ---------------------------------------------------------------------------------


class _Malformed(ValueError):
    """A file that parses but does not have the shape this report reads."""


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)  # bool is an int to Python, not a figure


def _number(value: object) -> float | None:
    return measured(float(value)) if _is_number(value) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _mapping(data: dict[str, object], key: str) -> dict[str, object]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _load_json(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _problem(path: Path, exc: Exception) -> str:
    reason = " ".join(str(exc).split())[:_NOTE_CHARS]
    return f"{path.parent.name}/{path.name} skipped: {reason or type(exc).__name__}"


def _whole(data: dict[str, object], key: str) -> int:
    value = data.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Malformed(f"figures {key!r} is not a whole number")


def _float(data: dict[str, object], key: str, where: str = "figures") -> float:
    """A measurement the gate always writes; NaN and infinity are kept (`measured` shows them as missing)."""
    value = data.get(key)
    if _is_number(value):
        return float(value)
    raise _Malformed(f"{where} {key!r} is not a number")


def _optional_float(data: dict[str, object], key: str) -> float | None:
    return None if data.get(key) is None else _float(data, key)


def _percentiles(data: dict[str, object], key: str) -> dict[str, float]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise _Malformed(f"figures {key!r} is not an object")
    return {p: _float(value, p, where=f"figures {key}") for p in PERCENTILES}


def parse_figures(data: object) -> Figures:
    """bench.json `figures`, or the `previous` they were compared with: what the gate's `Figures.to_dict`
    wrote, read back into its `Figures` with every field's type checked."""
    if not isinstance(data, dict):
        raise _Malformed(f"figures is {type(data).__name__}, not an object")
    positions = data.get("per_position_acceptance") or []
    if not isinstance(positions, list) or any(_number(p) is None for p in positions):
        raise _Malformed("per_position_acceptance is not a list of numbers")
    return Figures(
        completed=_whole(data, "completed"),
        failed=_whole(data, "failed"),
        duration_s=_float(data, "duration_s"),
        concurrency=_whole(data, "concurrency"),
        max_tokens=_whole(data, "max_tokens"),
        output_tokens_per_s=_float(data, "output_tokens_per_s"),
        ttft_ms=_percentiles(data, "ttft_ms"),
        itl_ms=_percentiles(data, "itl_ms"),
        acceptance_rate=_optional_float(data, "acceptance_rate"),
        acceptance_length=_optional_float(data, "acceptance_length"),
        per_position_acceptance=[float(p) for p in positions],
    )


def parse_bench(data: object) -> Bench:
    """bench.json, schema 1; anything else is refused rather than half-read."""
    if not isinstance(data, dict):
        raise _Malformed(f"the file holds a JSON {type(data).__name__}, not an object")
    if data.get("schema") != BENCH_SCHEMA:
        raise _Malformed(f"schema {data.get('schema')!r} is not {BENCH_SCHEMA}, the one this report reads")
    gate = data.get("gate")
    if not isinstance(gate, dict):
        raise _Malformed("no gate object")
    problems = gate.get("problems") or []
    previous = data.get("previous")
    return Bench(
        time=_text(data.get("time")),
        image=_text(data.get("image")),
        image_id=_text(data.get("image_id")),
        config_digest=_text(data.get("config_digest")),
        hardware=_text(data.get("hardware")),
        figures=parse_figures(data.get("figures")),
        previous=None if previous is None else parse_figures(previous),
        gate=Gate(
            enabled=gate.get("enabled") is True,
            passed=gate.get("passed") is True,
            problems=tuple(str(p) for p in problems) if isinstance(problems, list) else (str(problems),),
            seconds=_number(gate.get("seconds")),
        ),
    )


def _stages(value: object) -> tuple[Stage, ...]:
    if not isinstance(value, list):
        return ()
    stages = []
    for entry in value:
        if isinstance(entry, dict) and isinstance(entry.get("stage"), str):
            at_s = _number(entry.get("at_s"))
            if at_s is not None:
                stages.append(Stage(entry["stage"], at_s))
    return tuple(stages)


def _container_image(run: Path) -> str:
    """The image named in container.json (docker inspect, kept for failed start-ups), if any."""
    path = run / "container.json"
    if not path.is_file():
        return ""
    data = _load_json(path)
    config = _mapping(data, "Config") if isinstance(data, dict) else {}
    return _text(config.get("Image"))


def read_rollout(run: Path, notes: list[str]) -> WatchedRollout | None:
    """One run folder; None (and a note) where its verdict.json cannot be read."""
    verdict_path = run / "verdict.json"
    try:
        verdict = _load_json(verdict_path)
        if not isinstance(verdict, dict) or not isinstance(verdict.get("status"), str):
            raise _Malformed("no status: not a watchdog verdict")
    except (OSError, ValueError) as exc:
        notes.append(_problem(verdict_path, exc))
        return None
    bench: Bench | None = None
    unreadable = False
    bench_path = run / "bench.json"
    if bench_path.exists():
        try:
            bench = parse_bench(_load_json(bench_path))
        except (OSError, ValueError) as exc:
            notes.append(_problem(bench_path, exc))
            unreadable = True
    image = bench.image if bench else ""
    if not image:
        try:
            image = _container_image(run)
        except (OSError, ValueError) as exc:
            notes.append(_problem(run / "container.json", exc))
    acceptance = _mapping(verdict, "acceptance")
    return WatchedRollout(
        run_id=run.name,
        status=verdict["status"],
        elapsed_s=_number(verdict.get("elapsed_s")),
        stage=_text(verdict.get("stage")),
        headline=_text(verdict.get("headline")),
        stages=_stages(verdict.get("stages")),
        probe_acceptance_rate=_number(acceptance.get("rate")),
        probe_acceptance_length=_number(acceptance.get("mean_length")),
        image=image,
        bench=bench,
        bench_unreadable=unreadable,
    )


def read_host(host_dir: Path, last: int = DEFAULT_LAST) -> HostHistory:
    """A host's last `last` rollouts, oldest first. Folders without verdict.json (image builds) are not rollouts."""
    notes: list[str] = []
    try:
        # Run ids start with the launch time (YYYYMMDDTHHMMSS), so the names sort by time.
        runs = sorted(p for p in host_dir.iterdir() if p.is_dir() and (p / "verdict.json").exists())
    except OSError as exc:
        return HostHistory(host_dir.name, (), 0, (f"{host_dir} unreadable: {exc}",))
    rollouts = [r for r in (read_rollout(run, notes) for run in runs[-last:]) if r is not None]
    return HostHistory(host_dir.name, tuple(rollouts), len(runs), tuple(notes))


def read_runs(runs_root: Path, last: int = DEFAULT_LAST) -> list[HostHistory]:
    """Every host folder under `runs_root`, by name."""
    if not runs_root.is_dir():
        return []
    return [read_host(d, last) for d in sorted(runs_root.iterdir()) if d.is_dir()]
