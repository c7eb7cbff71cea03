"""The host's records and the controller's run folders: where each file lives, and one typed reader
and one writer per record, for the rollout, the gate, the action plugin and the report.

On the host, in `serving_state_dir` (root's; written through SSH as root or `sudo -n`, atomically):
- `rollout.json`: the rollout's state machine (`RolloutRecord`), saved before every step;
- `current.json`: what serves (`Serving`), once a version is promoted.

On the controller, `.state/runs/<inventory host>/<run id>/`, one folder per watched start-up (the
watchdog names it by its launch time, `YYYYMMDDTHHMMSS-n`, so the names sort by time):
- `verdict.json`: the watchdog's verdict (`engine.log`, `progress.log`, `stacks.txt` beside it);
- `container.json`: docker inspect of a start-up that failed, never with the API key;
- `prewarm.json`: the page cache prewarm before that start-up (`PrewarmReport`);
- `bench.json`: the benchmark gate after READY (schema 1).

Hosts and controllers keep the files older versions wrote: each reader accepts every shape written so
far (tests/unit/test_records.py holds them as written).
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from specdeploy import names
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.record_types import Bench, Figures, Gate, PrewarmReport

if TYPE_CHECKING:  # (the GPU machine's gate step reads records without Docker's client)
    from specdeploy.connection import CommandHost

STATE_DIR = names.SERVING_STATE_DIR  # serving_state_dir's default
ROLLOUT_FILE, CURRENT_FILE = "rollout.json", "current.json"
VERDICT_FILE, CONTAINER_FILE, PREWARM_FILE, BENCH_FILE = "verdict.json", "container.json", "prewarm.json", "bench.json"
BASELINE_FILE = "baseline.json"  # the speculation-off start-up's sweep: a measurement, not a rollout
BENCH_SCHEMA = 1
PERCENTILES = ("p50", "p99")  # of bench.json's ttft_ms and itl_ms
PHASES = ("warming", "stopping-old", "measuring-baseline", "measuring-draft-lengths", "starting-new", "watching",
          "benchmarking", "promoting", "rolling-back", "done")  # fmt: skip
HISTORY = 20  # rollout.json keeps the last steps, not all of them


def utc_now() -> str:
    """A record's time stamp: UTC, to the second, as every record has written it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Malformed(ValueError):
    """A file that parses but does not have the shape its reader knows."""


# --- The run folders -------------------------------------------------------------------------


def runs_root(state: Path | None = None) -> Path:
    return (state or state_dir()) / "runs"


def host_runs(inventory_hostname: str, state: Path | None = None) -> Path:
    """A host's folder of runs: its watched start-ups and its image builds' logs."""
    return runs_root(state) / inventory_hostname


def run_folder(host_dir: Path, suffix: str = "") -> Path:
    """A new run's folder: named by the time it began (the watchdog adds a suffix), so names sort by time."""
    return host_dir / f"{time.strftime('%Y%m%dT%H%M%S')}{suffix}"


def host_folders(root: Path) -> list[Path]:
    """Every host folder under `root`, by name."""
    return sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []


def rollout_runs(host_dir: Path) -> list[Path]:
    """A host's watched rollouts, oldest first; a folder without verdict.json (an image build's) is not one,
    nor the speculation-off baseline's start-up (its baseline.json)."""
    return sorted(p for p in host_dir.iterdir()
                  if p.is_dir() and (p / VERDICT_FILE).exists() and not (p / BASELINE_FILE).exists())  # fmt: skip


def _write(folder: Path, name: str, data: object, default: Callable[[Any], str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data, indent=2, default=default) + "\n")
    return path


def _load(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)  # bool is an int to Python, not a figure


def measured(value: float | None) -> float | None:
    """None where there is no figure, or it is NaN or infinite (shown and plotted nowhere)."""
    return value if value is not None and math.isfinite(value) else None


def _number(value: object) -> float | None:
    return measured(float(value)) if _is_number(value) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _optional_text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(data: object, key: str) -> dict[str, object]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


# verdict.json --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """A start-up stage the watchdog saw, and when (seconds after launch)."""

    label: str
    at_s: float


@dataclass(frozen=True)
class RunVerdict:
    """verdict.json as the controller reads it back (the watchdog writes every field of its Verdict)."""

    status: str
    elapsed_s: float | None
    stage: str
    headline: str
    stages: tuple[Stage, ...]
    # The start-up's one completion (the watchdog's probe), not a benchmark.
    acceptance_rate: float | None
    acceptance_length: float | None


def write_verdict(folder: Path, verdict: Mapping[str, Any]) -> Path:
    """The watchdog's Verdict, `dataclasses.asdict` of it."""
    return _write(folder, VERDICT_FILE, dict(verdict))


def read_verdict(run: Path) -> RunVerdict:
    data = _load(run / VERDICT_FILE)
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise Malformed("no status: not a watchdog verdict")
    stages = data.get("stages")
    acceptance = _mapping(data, "acceptance")
    return RunVerdict(
        status=data["status"],
        elapsed_s=_number(data.get("elapsed_s")),
        stage=_text(data.get("stage")),
        headline=_text(data.get("headline")),
        stages=tuple(
            Stage(s["stage"], at_s)
            for s in (stages if isinstance(stages, list) else [])
            if isinstance(s, dict) and isinstance(s.get("stage"), str) and (at_s := _number(s.get("at_s"))) is not None
        ),
        acceptance_rate=_number(acceptance.get("rate")),
        acceptance_length=_number(acceptance.get("mean_length")),
    )


# container.json ------------------------------------------------------------------------------


def write_container(folder: Path, attrs: Mapping[str, Any]) -> Path:
    """docker inspect of the failed container: Id, Name, Image, State, Config, HostConfig; the API key
    (in Config.Env) never lands on disk."""
    kept = {k: attrs.get(k) for k in ("Id", "Name", "Image", "State", "Config", "HostConfig")}
    config = kept["Config"]
    if isinstance(config, dict) and config.get("Env"):
        kept["Config"] = {**config, "Env": [e for e in config["Env"] if "API_KEY" not in e]}
    return _write(folder, CONTAINER_FILE, kept, default=str)  # as ever: a value JSON lacks is written as text


def container_image(run: Path) -> str:
    """The image container.json names, if the run has one."""
    path = run / CONTAINER_FILE
    return _text(_mapping(_load(path), "Config").get("Image")) if path.is_file() else ""


# prewarm.json --------------------------------------------------------------------------------


def write_prewarm(folder: Path, report: PrewarmReport) -> Path:
    return _write(folder, PREWARM_FILE, report.as_dict())


def read_prewarm(run: Path) -> PrewarmReport | None:
    """None where the run had no prewarm (switched off, or a rollback's start-up)."""
    path = run / PREWARM_FILE
    if not path.is_file():
        return None
    data = _load(path)
    if not isinstance(data, dict) or not isinstance(data.get("warmed"), bool):
        raise Malformed("no 'warmed': not a prewarm report")
    return PrewarmReport(**{f.name: data[f.name] for f in fields(PrewarmReport) if f.name in data})


# bench.json ----------------------------------------------------------------------------------


def write_baseline(folder: Path, measured: Mapping[str, Any]) -> Path:
    """The speculation-off sweep, in its start-up's run folder (what the watchdog left there is its log)."""
    return _write(folder, BASELINE_FILE, dict(measured))


def write_bench(folder: Path, report: Mapping[str, Any], host: str, image: str, *, image_id: str = "",
                config_digest: str = "") -> Path:  # fmt: skip
    """The gate's report (`GateResult.report`) with the host and the version it judged: the image's tag,
    and (since the report shows them; files before lack them) its id and configuration digest."""
    judged = {"image_id": image_id, "config_digest": config_digest} if image_id else {}
    return _write(folder, BENCH_FILE, {**report, "host": host, "image": image, **judged})


def _whole(data: dict[str, object], key: str) -> int:
    value = data.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Malformed(f"figures {key!r} is not a whole number")


def _float(data: dict[str, object], key: str, where: str = "figures") -> float:
    """A measurement the gate always writes; NaN and infinity are kept (`measured` hides them)."""
    value = data.get(key)
    if _is_number(value):
        return float(value)
    raise Malformed(f"{where} {key!r} is not a number")


def _optional_float(data: dict[str, object], key: str) -> float | None:
    return None if data.get(key) is None else _float(data, key)


def _percentiles(data: dict[str, object], key: str) -> dict[str, float]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise Malformed(f"figures {key!r} is not an object")
    return {p: _float(value, p, where=f"figures {key}") for p in PERCENTILES}


def parse_figures(data: object) -> Figures:
    """bench.json `figures`, or the `previous` they were compared with, as `Figures.to_dict` wrote them,
    every field's type checked."""
    if not isinstance(data, dict):
        raise Malformed(f"figures is {type(data).__name__}, not an object")
    positions = data.get("per_position_acceptance") or []
    if not isinstance(positions, list) or any(_number(p) is None for p in positions):
        raise Malformed("per_position_acceptance is not a list of numbers")
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
        host_load=_optional_float(data, "host_load"),
    )


def parse_bench(data: object) -> Bench | Gate:
    """bench.json, schema 1; anything else is refused rather than half-read. The gate alone where it
    measured nothing (`figures` null: an engine vLLM's client does not serve, or a client that failed)."""
    if not isinstance(data, dict):
        raise Malformed(f"the file holds a JSON {type(data).__name__}, not an object")
    if data.get("schema") != BENCH_SCHEMA:
        raise Malformed(f"schema {data.get('schema')!r} is not {BENCH_SCHEMA}, the one this reader knows")
    gate = data.get("gate")
    if not isinstance(gate, dict):
        raise Malformed("no gate object")
    problems = gate.get("problems") or []
    judged = Gate(
        enabled=gate.get("enabled") is True,
        passed=gate.get("passed") is True,
        problems=tuple(str(p) for p in problems) if isinstance(problems, list) else (str(problems),),
        seconds=_number(gate.get("seconds")),
        note=_text(gate.get("note")),
    )
    if data.get("figures") is None:
        return judged
    previous = data.get("previous")
    return Bench(
        time=_text(data.get("time")),
        image=_text(data.get("image")),
        image_id=_text(data.get("image_id")),
        config_digest=_text(data.get("config_digest")),
        hardware=_text(data.get("hardware")),
        figures=parse_figures(data.get("figures")),
        previous=None if previous is None else parse_figures(previous),
        gate=judged,
        comparison=_text(data.get("comparison")),
        speedup=_speedup(data.get("speedup")),
        crossover=_text(data.get("crossover")),
        **_schedule(data.get("schedule")),
    )


def _schedule(value: object) -> dict[str, Any]:
    """bench.json `schedule` (serving_speculative_schedule: auto): its words and the speeds behind it."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not isinstance(value.get("speeds", {}), dict):
        raise Malformed("schedule is not an object with speeds")
    speeds = {int(k): _speedup(row) for k, row in (value.get("speeds") or {}).items() if str(k).isdigit()}
    return {"schedule": _text(value.get("said") or value.get("note")), "length_speeds": speeds}


def _speedup(value: object) -> dict[int, float]:
    """bench.json `speedup`: {"<concurrency>": ratio}; absent before the sweep existed."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(str(k).isdigit() and _is_number(v) for k, v in value.items()):
        raise Malformed("speedup is not an object of concurrencies to numbers")
    return {int(k): float(v) for k, v in sorted(value.items(), key=lambda kv: int(kv[0]))}


def read_bench(run: Path) -> Bench | Gate | None:
    """None where the gate did not run."""
    path = run / BENCH_FILE
    return parse_bench(_load(path)) if path.exists() else None


# --- The host's records ----------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRef:
    """One engine container as rollout.json knows it (proven_at, bench, startup: absent in older files)."""

    container_id: str
    image_id: str
    config: str  # the configuration digest (specdeploy.serve.config.ServingConfig.digest)
    proven_at: str | None = None  # when it was proven READY (a real completion), UTC
    bench: dict[str, Any] | None = None  # its benchmark gate's figures and hardware (specdeploy.gate)
    startup: list[dict[str, Any]] | None = None  # where its start-up's time went (watch.stages)
    # A rank of a multi-node group: when its container started, as proven (one that restarted alone is not).
    started_at: str | None = None


@dataclass
class RolloutRecord:
    """rollout.json: the phase the rollout reached, the containers involved, the last version proven READY."""

    phase: str = "done"
    new: EngineRef | None = None  # the version being rolled out, once created
    old: EngineRef | None = None  # what served when the rollout began
    last_ready: EngineRef | None = None  # the last version proven READY: what a failure restores
    updated_at: str = ""
    history: list[str] = field(default_factory=list)  # "time phase", the last few steps
    # The speculation-off sweeps (specdeploy.gate), by what they were measured for (BenchmarkGate.baseline_key).
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)

    def proves(self, container_id: str) -> bool:
        return self.last_ready is not None and self.last_ready.container_id == container_id

    def stamp(self, phase: str) -> RolloutRecord:
        self.phase = phase
        self.updated_at = utc_now()
        self.history = [*self.history[-(HISTORY - 1) :], f"{self.updated_at} {phase}"]
        return self

    def to_json(self) -> str:
        data = asdict(self)
        if not data["baselines"]:  # (a host without one keeps the file it had)
            del data["baselines"]
        for ref in (data[k] for k in ("new", "old", "last_ready")):
            if ref is not None and ref["started_at"] is None:  # (only a multi-node group's ranks have one)
                del ref["started_at"]
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RolloutRecord:
        """An empty or absent file is a host nothing was rolled out on."""
        data: dict[str, Any] = json.loads(text) if text.strip() else {}
        refs = {k: EngineRef(**data[k]) if data.get(k) else None for k in ("new", "old", "last_ready")}
        if data.get("phase", "done") not in PHASES:
            raise SpecdeployError(f"the rollout record names an unknown phase {data.get('phase')!r}")
        return cls(phase=data.get("phase", "done"), updated_at=data.get("updated_at", ""),
                   history=list(data.get("history", [])), baselines=dict(data.get("baselines") or {}),
                   **refs)  # fmt: skip

    def describe(self) -> str:
        """What the record says is on the host, for a sentence to the operator."""
        ready = f"last READY: image {self.last_ready.image_id[7:19]}" if self.last_ready else "nothing proven READY"
        new = f", new: image {self.new.image_id[7:19]}" if self.new else ""
        return f"rollout phase '{self.phase}'{new}, {ready}"


@dataclass(frozen=True)
class Serving:
    """current.json: what serves, so that `specdeploy verify --host` needs no inventory variables."""

    image: str  # what was deployed: the tag, or after `make rollback` the image id
    image_id: str
    previous_image_id: str | None
    config: dict[str, Any]  # the role's serving variables (ServingConfig's, never the key) and api_key_set
    started_at: str
    # What the image was built from; None: not recorded (files written before `specdeploy verify`).
    engine_image_profile: str | None = None
    engine_image_drafter_path: str | None = None
    container: str = names.ENGINE_CONTAINER

    def to_json(self) -> str:
        # As the role's copy task wrote it (Ansible's to_nice_json): 4 spaces, sorted keys, ASCII.
        data = {k: v for k, v in asdict(self).items() if v is not None or not k.startswith("engine_image_")}
        return json.dumps(data, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Serving:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("image_id"), str):
            raise Malformed("no image_id: not a serving record")
        return cls(
            image=_text(data.get("image")),
            image_id=data["image_id"],
            previous_image_id=_optional_text(data.get("previous_image_id")) or None,  # null: a first deploy
            config=_mapping(data, "config"),
            started_at=_text(data.get("started_at")),
            engine_image_profile=_optional_text(data.get("engine_image_profile")),
            engine_image_drafter_path=_optional_text(data.get("engine_image_drafter_path")),
            container=_text(data.get("container")) or names.ENGINE_CONTAINER,
        )


class RecordStore(Protocol):
    """Where the rollout keeps rollout.json (HostRecords on a host; a fake in the unit tests)."""

    def load(self) -> RolloutRecord: ...
    def save(self, record: RolloutRecord) -> None: ...


class HostRecords:
    """The records in the serving state dir on the target, through SSH as root or `sudo -n` (the folder
    is root's). A write is a temp file, synced and renamed: an interruption leaves the old file or the new."""

    def __init__(self, host: CommandHost, state_dir: str = STATE_DIR) -> None:
        self.host, self.folder = host, state_dir.rstrip("/")

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def _run(self, script: str, what: str, stdin: str | None = None) -> str:
        wrapped = (
            f'if [ "$(id -u)" = 0 ]; then sh -c {shlex.quote(script)}; else sudo -n sh -c {shlex.quote(script)}; fi'
        )
        try:
            proc = subprocess.run(self.host.command("sh", "-c", wrapped), input=stdin, capture_output=True,
                                  text=True, timeout=60, check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SpecdeployError(f"{self.host} did not answer within 60 s while {what}",
                                  hint="check the host and the network, then rerun: make deploy") from exc  # fmt: skip
        if proc.returncode != 0:
            raise SpecdeployError(f"{what} on {self.host} failed: {proc.stderr.strip()[-300:]}",
                                  hint="check SSH and sudo on the host, then rerun")  # fmt: skip
        return proc.stdout

    def read(self, name: str) -> str:
        """The file's text; empty where there is none."""
        path = shlex.quote(self.path(name))
        return self._run(f"cat {path} 2>/dev/null || true", f"reading {self.path(name)}")

    def write(self, name: str, text: str) -> None:
        path, folder = shlex.quote(self.path(name)), shlex.quote(self.folder)
        script = f"umask 022 && mkdir -p {folder} && cat > {path}.tmp && sync {path}.tmp && mv -f {path}.tmp {path}"
        self._run(script, f"writing {self.path(name)}", text)

    def load(self) -> RolloutRecord:
        return RolloutRecord.from_json(self.read(ROLLOUT_FILE))

    def save(self, record: RolloutRecord) -> None:
        self.write(ROLLOUT_FILE, record.to_json())

    def serving(self) -> Serving | None:
        """current.json; None on a host nothing was promoted on."""
        text = self.read(CURRENT_FILE)
        return Serving.from_json(text) if text.strip() else None

    def record_serving(self, serving: Serving) -> None:
        self.write(CURRENT_FILE, serving.to_json())
