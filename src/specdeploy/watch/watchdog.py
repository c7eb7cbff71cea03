"""The watch loop: one poll every `interval` seconds until READY, FAILED, STALLED or the timeout.

Each poll: read new log lines (root-cause collector, noise counter, stage tracker), check
liveness from process/container state, sample GPU memory, ask /health. A dead engine is a
verdict in the same poll; no progress signal for `stall_timeout` seconds is a stall.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdeploy.watch.loglines import grammar, noise_catalogue, noise_match, parse_line
from specdeploy.watch.memory import memory_figures
from specdeploy.watch.readiness import NotReady, ReadinessProbe
from specdeploy.watch.rootcause import RootCause, TracebackCollector
from specdeploy.watch.sources import SIGKILL_EXIT, Liveness, Source
from specdeploy.watch.stacks import summarise_stacks
from specdeploy.watch.stages import Stage, advances, recognise, waits_for_peers
from specdeploy.watch.startup import startup_table

HEADLINE_MAX = 1000
CAUSE_MAX = 800  # of the first line; the rest says where, which process, the stage and the exit
SEEN_LINES_MAX = 20000  # distinct lines remembered to tell news from a heartbeat
GPU_SAMPLE_EVERY_S = 5.0  # nvidia-smi is slow (and remote for a container); logs are polled faster
NOT_READY_READS = 4  # polls of the log for the cause of a failed readiness proof


class Status(Enum):
    READY = 0
    FAILED = 1
    STALLED = 2
    TIMEOUT = 3
    LOST = 5  # our transport to the engine's host was down for longer than the grace (4 is bad input)


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
    progress: bool = True  # the interactive bar on stderr
    # Plain progress lines (stage, elapsed, ETA, GPU memory) for callers that print them, e.g. the
    # serving action in Ansible's output: at every stage change and at most every `progress_every_s`.
    on_progress: Callable[[str], None] | None = None
    progress_every_s: float = 30.0
    # Replicas behind the API (vLLM's data-parallel ranks over hosts): READY needs a completion from each.
    data_parallel_ranks: int = 1


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
    grammar_version: int = 0
    stages: list[dict[str, object]] = field(default_factory=list)  # [{"stage": label, "at_s": s}, ...]
    startup: list[dict[str, object]] = field(default_factory=list)  # each stage's duration (watch.stages)
    acceptance: dict[str, float | None] | None = None
    completion: dict[str, object] | None = None
    stack_summary: list[str] = field(default_factory=list)
    diagnostics: str = ""
    detected_after_exit_s: float | None = None
    notes: list[str] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)  # the engine's own accounting (watch.memory)

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
        self.stage_at: dict[Stage, float] = {Stage.LAUNCHED: 0.0}
        self._reported: tuple[Stage, float] | None = None  # (stage, when) of the last progress line
        self._shards_seen: tuple[float, int] | None = None  # (when, shards done) at the first count
        self._seen: set[str] = set()
        self._passed: list[Stage] = []  # stages entered since the last progress report
        self._unreachable_since: float | None = None
        self.notes: list[str] = []  # what the verdict should say besides its headline (kernel builds seen)
        self.prefix = ""  # a verdict's headline begins with it (the rank and host of a group's verdict)
        self.probe = (
            ReadinessProbe(
                options.url,
                options.model,
                options.tokens,
                options.api_key,
                options.request_timeout_s,
                data_parallel_ranks=options.data_parallel_ranks,
            )
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
            noise = noise_match(line.text)
            if noise:
                self.noise[noise.id] += 1
                if not noise.progress:
                    continue  # noise is never progress and never a cause
            else:
                self.collector.feed(line)
            if self._is_news(line.text):
                self._progress()
            event = recognise(line.text)
            if event and advances(self.stage, event.stage):
                self._enter(event.stage)
                if event.shards_total:
                    self.shards = (event.shards_done or 0, event.shards_total)
                    if self._shards_seen is None:
                        self._shards_seen = (time.monotonic() - self.start, self.shards[0])

    def _is_news(self, text: str) -> bool:
        """A line seen before is no progress: a heartbeat ("Waiting for 1 core engine proc(s) to
        start", every 10 s) must not hide a hang."""
        text = text.strip()
        if not text or text in self._seen:
            return False
        if len(self._seen) >= SEEN_LINES_MAX:
            self._seen.clear()
        self._seen.add(text)
        return True

    def _enter(self, stage: Stage) -> None:
        if stage not in self.stage_at:
            self.stage_at[stage] = round(time.monotonic() - self.start, 2)
            if stage != self.stage:
                self._passed.append(stage)  # each stage gets its line, even several within one poll
        self.stage = stage

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
        elapsed = round(time.monotonic() - self.start, 2)
        stages: list[dict[str, object]] = [{"stage": s.label, "at_s": at} for s, at in sorted(self.stage_at.items())]
        verdict = Verdict(
            status=status.name,
            elapsed_s=elapsed,
            stage=self.stage.label,
            headline=self.prefix + headline,
            noise=dict(self.noise),
            noise_catalogue_version=catalogue_version,
            grammar_version=grammar().version,
            stages=stages,
            startup=startup_table(stages, elapsed),
            notes=list(self.notes),
            memory=memory_figures(self.raw).to_dict(),
            diagnostics=str(self.diag_dir),
            **extra,  # type: ignore[arg-type]
        )
        self._write_diagnostics(verdict)
        return verdict

    def _failed(self, life: Liveness) -> Verdict:
        cause = self.collector.root_cause()
        exit_code = life.exit_code
        ended = f"exit {exit_code}" if exit_code is not None else (life.note or "exit status unknown")
        stage = f"last stage: {self.stage.label}"
        if cause is not None:
            text = cause.headline()
            text = text if len(text) <= CAUSE_MAX else text[: CAUSE_MAX - 1] + "…"
            headline = f"{text} at {cause.where()} [{cause.process}] ({stage}, {ended})"
            return self._verdict(Status.FAILED, headline, root_cause=_cause_dict(cause), exit_code=exit_code)
        if exit_code == SIGKILL_EXIT or life.oom_killed:
            why = "OOM-killed" if life.oom_killed else "killed by SIGKILL with no traceback (likely the OOM killer)"
            return self._verdict(Status.FAILED, f"{why} ({stage})", exit_code=exit_code)
        return self._verdict(Status.FAILED, f"ended with no traceback in its log ({stage}, {ended})",
                             exit_code=exit_code)  # fmt: skip

    def _stalled(self, quiet_s: float, state: str) -> Verdict:
        stacks = self.source.dump_stacks()
        (self.diag_dir).mkdir(parents=True, exist_ok=True)
        (self.diag_dir / "stacks.txt").write_text(stacks)
        summary = summarise_stacks(stacks)
        if self.stage < Stage.PEERS and waits_for_peers(stacks):
            self._enter(Stage.PEERS)  # the log went quiet where a rank waits in the rendezvous
        where = "; ".join(summary[:3]) or "no Python frames could be read"
        headline = f"no progress for {quiet_s:.0f}s at stage '{self.stage.label}' (process {state}); innermost: {where}"
        return self._verdict(Status.STALLED, headline, stack_summary=summary)

    def _building(self, quiet_s: float, builds: list[str]) -> None:
        """A quiet log while the engine's processes compile kernels is progress (each check runs at the
        stall bound, so a hung compiler still ends at the watch's timeout)."""
        self._progress()
        note = f"quiet for {quiet_s:.0f}s at stage '{self.stage.label}' while building kernels ({', '.join(builds)})"
        self.notes.append(note)
        if self.opt.on_progress is not None:
            self.opt.on_progress(note)

    def _ready(self) -> Verdict | None:
        assert self.probe is not None
        try:
            ready = self.probe.prove(self.opt.speculative)
        except NotReady as exc:
            return self._not_ready(f"readiness check failed: {exc}")
        except Exception as exc:  # a transport error mid-proof is a failure with its detail
            return self._not_ready(f"readiness check failed: {type(exc).__name__}: {exc}")
        # What the engine printed between this poll's read and its answer (its last memory lines among
        # them): read before the verdict is made of it (CI, 2026-12-08: a CUDA-graph line missed).
        self._ingest()
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
        completion = {"tokens": ready.completion_tokens, "text": ready.completion_text, "seconds": ready.completion_s}
        return self._verdict(Status.READY, summary, acceptance=acceptance, completion=completion)

    def _not_ready(self, why: str) -> Verdict:
        """A failed proof: the root cause first when the log holds one (an engine that answers 500 has
        usually printed why: the first completion ran the model for the first time)."""
        cause = None
        for _ in range(NOT_READY_READS):  # the traceback lands in the log as the error is answered
            self._ingest()
            if (cause := self._cause()) is not None:
                break
            time.sleep(self.opt.interval_s)
        if cause is None:
            return self._verdict(Status.FAILED, why)
        text = cause.headline()
        text = text if len(text) <= CAUSE_MAX else text[: CAUSE_MAX - 1] + "…"
        return self._verdict(Status.FAILED, f"{text} at {cause.where()} [{cause.process}] ({why[:300]})",
                             root_cause=_cause_dict(cause))  # fmt: skip

    def _cause(self) -> RootCause | None:
        """The root cause the log holds so far (a group's watch looks in every rank's log)."""
        return self.collector.root_cause()

    def progress_line(self) -> str:
        """`loading weights 37/64 shards, 312s elapsed, ETA 215s, GPU 41234 MiB`."""
        now = time.monotonic() - self.start
        text = self.stage.label
        if self.stage == Stage.WEIGHTS and self.shards:
            done, total = self.shards
            text += f" {done}/{total} shards"
        text += f", {now:.0f}s elapsed"
        eta = self._eta(now)
        if eta is not None:
            text += f", ETA {eta:.0f}s"
        if self.gpu_mib is not None:
            text += f", GPU {self.gpu_mib} MiB"
        return text

    def _eta(self, now: float) -> float | None:
        """From the shard rate since the first shard count was seen; none before a second one."""
        if self.stage != Stage.WEIGHTS or not self.shards or self._shards_seen is None:
            return None
        (t0, done0), (done, total) = self._shards_seen, self.shards
        if done <= done0 or now <= t0:
            return None
        return (now - t0) / (done - done0) * (total - done)

    def _report_progress(self) -> None:
        if self.opt.on_progress is None:
            return
        now = time.monotonic()
        passed, self._passed = [s for s in self._passed if s != self.stage], []
        lines = [f"{stage.label}, {self.stage_at[stage]:.0f}s elapsed" for stage in passed]
        last = self._reported
        if last is None or last[0] != self.stage or now - last[1] >= self.opt.progress_every_s:
            self._reported = (self.stage, now)
            lines.append(self.progress_line())
        if not lines:
            return
        self.diag_dir.mkdir(parents=True, exist_ok=True)
        with (self.diag_dir / "progress.log").open("a") as out:
            for line in lines:
                self.opt.on_progress(line)
                out.write(f"{line}\n")

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
                self._report_progress()
                time.sleep(self.opt.interval_s)

    def _unreachable(self, life: Liveness) -> Verdict | None:
        """Our transport, not the engine: no verdict on it, and the stall clock is paused."""
        self._unreachable_since = self._unreachable_since or time.monotonic()
        if not life.lost:
            return None
        headline = (f"lost contact with the engine's host: {life.note}; the engine's state is unknown "
                    f"(last stage seen: {self.stage.label})")  # fmt: skip
        return self._verdict(Status.LOST, headline)

    def _poll(self) -> Verdict | None:
        self._ingest()
        life = self.source.liveness()
        if life.unreachable:
            return self._unreachable(life)
        if self._unreachable_since is not None:
            self.last_progress += time.monotonic() - self._unreachable_since  # time without contact is no stall
            self._unreachable_since = None
        if not life.alive:
            died_at = time.monotonic()
            self._ingest()  # the last lines (the traceback) may land with the exit
            verdict = self._failed(life)
            verdict.detected_after_exit_s = round(time.monotonic() - died_at, 3)
            return verdict
        self._sample_gpu()
        if self.probe is not None:
            health = self.probe.health()
            if health != self.health:
                self.health = health
                self._progress()
            if health == 200:
                self._enter(Stage.API_SERVER)
                return self._ready()
        now = time.monotonic()
        if now - self.last_progress > self.opt.stall_timeout_s:
            builds = self.source.kernel_builds()
            if not builds:
                return self._stalled(now - self.last_progress, life.state)
            self._building(now - self.last_progress, builds)
        if now - self.start > self.opt.timeout_s:
            return self._verdict(Status.TIMEOUT, f"not ready after --timeout {self.opt.timeout_s:.0f}s "
                                                 f"(stage '{self.stage.label}', still making progress)")  # fmt: skip
        return None


def _cause_dict(cause: RootCause) -> dict[str, object]:
    return {"type": cause.type, "message": cause.message, "process": cause.process, "file": cause.file,
            "line": cause.line, "headline": cause.headline(), "origin": cause.origin}  # fmt: skip
