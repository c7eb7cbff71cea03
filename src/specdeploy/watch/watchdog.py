"""The watch loop: one poll every `interval` seconds until READY, FAILED, STALLED or the timeout.

Each poll: read new log lines (root-cause collector, noise counter, stage tracker), check
liveness from process/container state, sample GPU memory, ask /health. A dead engine is a
verdict in the same poll; no progress signal for `stall_timeout` seconds is a stall.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdeploy.watch.loglines import noise_catalogue, noise_id, parse_line
from specdeploy.watch.readiness import NotReady, ReadinessProbe
from specdeploy.watch.rootcause import RootCause, TracebackCollector
from specdeploy.watch.sources import SIGKILL_EXIT, Source
from specdeploy.watch.stacks import summarise_stacks
from specdeploy.watch.stages import Stage, recognise

HEADLINE_MAX = 400
GPU_SAMPLE_EVERY_S = 5.0  # nvidia-smi is slow (and remote for a container); logs are polled faster


class Status(Enum):
    READY = 0
    FAILED = 1
    STALLED = 2
    TIMEOUT = 3


@dataclass
class WatchOptions:
    url: str | None
    model: str | None = None
    tokens: int = 8
    speculative: bool = False
    interval_s: float = 0.5
    stall_timeout_s: float = 300.0
    timeout_s: float = 3600.0
    api_key: str | None = None
    request_timeout_s: float = 120.0
    diagnostics: Path = Path(".state/watch")
    progress: bool = True


@dataclass
class Verdict:
    status: str
    elapsed_s: float
    stage: str
    headline: str
    root_cause: dict[str, object] | None = None
    exit_code: int | None = None
    noise: dict[str, int] = field(default_factory=dict)
    noise_catalogue_version: int = 0
    acceptance: dict[str, float | None] | None = None
    completion: dict[str, object] | None = None
    stack_summary: list[str] = field(default_factory=list)
    diagnostics: str = ""
    detected_after_exit_s: float | None = None

    def first_line(self) -> str:
        return f"{self.status} {self.elapsed_s:.1f}s {self.headline}"[:HEADLINE_MAX]


class Watch:
    def __init__(self, source: Source, options: WatchOptions) -> None:
        self.source, self.opt = source, options
        self.collector = TracebackCollector()
        self.noise: Counter[str] = Counter()
        self.stage = Stage.LAUNCHED
        self.shards: tuple[int, int] | None = None
        self.raw: list[str] = []
        self.start = time.monotonic()
        self.last_progress = self.start
        self.gpu_mib: int | None = None
        self._gpu_sampled_at = -GPU_SAMPLE_EVERY_S
        self.health: int | None = None
        self.probe = (
            ReadinessProbe(options.url, options.model, options.tokens, options.api_key, options.request_timeout_s)
            if options.url
            else None
        )
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.diag_dir = options.diagnostics / f"{stamp}-{int(self.start * 1000) % 100000}"

    # ------------------------------------------------------------------ signals

    def _progress(self) -> None:
        self.last_progress = time.monotonic()

    def _ingest(self) -> None:
        for raw in self.source.read_new():
            self.raw.append(raw)
            line = parse_line(raw)
            kind = noise_id(line.text)
            if kind:
                self.noise[kind] += 1
                continue  # noise is never progress and never a cause
            self.collector.feed(line)
            if line.text.strip():
                self._progress()
            event = recognise(line.text)
            if event and event.stage >= self.stage:
                self.stage = event.stage
                if event.shards_total:
                    self.shards = (event.shards_done or 0, event.shards_total)

    def _sample_gpu(self) -> None:
        now = time.monotonic()
        if now - self._gpu_sampled_at < GPU_SAMPLE_EVERY_S:
            return
        self._gpu_sampled_at = now
        mib = self.source.gpu_memory_mib()
        if mib is not None and mib != self.gpu_mib:
            self.gpu_mib = mib
            self._progress()

    # ------------------------------------------------------------------ verdicts

    def _verdict(self, status: Status, headline: str, **extra: object) -> Verdict:
        catalogue_version, _ = noise_catalogue()
        verdict = Verdict(
            status=status.name,
            elapsed_s=round(time.monotonic() - self.start, 2),
            stage=self.stage.label,
            headline=headline,
            noise=dict(self.noise),
            noise_catalogue_version=catalogue_version,
            diagnostics=str(self.diag_dir),
            **extra,  # type: ignore[arg-type]
        )
        self._write_diagnostics(verdict)
        return verdict

    def _failed(self, exit_code: int | None, oom_killed: bool) -> Verdict:
        cause = self.collector.root_cause()
        stage = f"last stage: {self.stage.label}"
        if cause is not None:
            headline = f"{cause.headline()} at {cause.where()} [{cause.process}] ({stage}, exit {exit_code})"
            return self._verdict(Status.FAILED, headline, root_cause=_cause_dict(cause), exit_code=exit_code)
        if exit_code == SIGKILL_EXIT or oom_killed:
            why = "OOM-killed" if oom_killed else "killed by SIGKILL with no traceback (likely the OOM killer)"
            return self._verdict(Status.FAILED, f"{why} ({stage})", exit_code=exit_code)
        return self._verdict(Status.FAILED, f"exited {exit_code} with no traceback in its log ({stage})",
                             exit_code=exit_code)  # fmt: skip

    def _stalled(self, quiet_s: float, state: str) -> Verdict:
        stacks = self.source.dump_stacks()
        (self.diag_dir).mkdir(parents=True, exist_ok=True)
        (self.diag_dir / "stacks.txt").write_text(stacks)
        summary = summarise_stacks(stacks)
        where = "; ".join(summary[:3]) or "no Python frames could be read"
        headline = f"no progress for {quiet_s:.0f}s at stage '{self.stage.label}' (process {state}); innermost: {where}"
        return self._verdict(Status.STALLED, headline, stack_summary=summary)

    def _ready(self) -> Verdict | None:
        assert self.probe is not None
        try:
            ready = self.probe.prove(self.opt.speculative)
        except NotReady as exc:
            return self._verdict(Status.FAILED, f"readiness check failed: {exc}")
        except Exception as exc:  # a transport error mid-proof is a failure with its detail
            return self._verdict(Status.FAILED, f"readiness check failed: {type(exc).__name__}: {exc}")
        acceptance = None
        summary = f"model={ready.model} completion={ready.completion_tokens} tokens"
        if ready.acceptance is not None:
            acc = ready.acceptance
            acceptance = {"rate": acc.rate, "mean_length": acc.mean_length, "drafts": acc.drafts,
                          "draft_tokens": acc.draft_tokens, "accepted_tokens": acc.accepted_tokens}  # fmt: skip
            rate = f"{acc.rate:.1%}" if acc.rate is not None else "n/a"
            length = f"{acc.mean_length:.2f}" if acc.mean_length is not None else "n/a"
            summary += f" acceptance={rate} mean_acceptance_length={length}"
        summary += f" noise={sum(self.noise.values())}"
        completion = {"tokens": ready.completion_tokens, "text": ready.completion_text}
        return self._verdict(Status.READY, summary, acceptance=acceptance, completion=completion)

    def _write_diagnostics(self, verdict: Verdict) -> None:
        self.diag_dir.mkdir(parents=True, exist_ok=True)
        (self.diag_dir / "engine.log").write_text("\n".join(self.raw) + "\n")
        (self.diag_dir / "verdict.json").write_text(json.dumps(asdict(verdict), indent=2) + "\n")

    # ------------------------------------------------------------------ loop

    def run(self) -> Verdict:
        console = Console(stderr=True)
        columns = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[extra]}"),
        ]
        with Progress(*columns, console=console, disable=not self.opt.progress, transient=False) as bar:
            task = bar.add_task(self.stage.label, total=len(Stage) - 1, extra="")
            while True:
                verdict = self._poll()
                done, total = self.shards if self.stage == Stage.WEIGHTS and self.shards else (None, None)
                extra = f"shards {done}/{total}" if done is not None else ""
                if self.gpu_mib is not None:
                    extra += f" gpu {self.gpu_mib} MiB"
                bar.update(task, description=self.stage.label, completed=int(self.stage), extra=extra)
                if verdict is not None:
                    return verdict
                time.sleep(self.opt.interval_s)

    def _poll(self) -> Verdict | None:
        self._ingest()
        life = self.source.liveness()
        if not life.alive:
            died_at = time.monotonic()
            self._ingest()  # the last lines (the traceback) may land with the exit
            verdict = self._failed(life.exit_code, life.oom_killed)
            verdict.detected_after_exit_s = round(time.monotonic() - died_at, 3)
            return verdict
        self._sample_gpu()
        if self.probe is not None:
            health = self.probe.health()
            if health != self.health:
                self.health = health
                self._progress()
            if health == 200:
                self.stage = Stage.API_SERVER
                return self._ready()
        now = time.monotonic()
        if now - self.last_progress > self.opt.stall_timeout_s:
            return self._stalled(now - self.last_progress, life.state)
        if now - self.start > self.opt.timeout_s:
            return self._verdict(Status.TIMEOUT, f"not ready after --timeout {self.opt.timeout_s:.0f}s "
                                                 f"(stage '{self.stage.label}', still making progress)")  # fmt: skip
        return None


def _cause_dict(cause: RootCause) -> dict[str, object]:
    return {"type": cause.type, "message": cause.message, "process": cause.process, "file": cause.file,
            "line": cause.line, "headline": cause.headline()}  # fmt: skip
