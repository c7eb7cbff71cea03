"""The parts of a deploy (specdeploy.serve.deploy) that say and keep what happened: the prewarm step,
the benchmark gate as the rollout calls it, the image's id on a host, the task's result and the
host's current.json. Each says its lines through SAY (Ansible's display, in the serve action)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from docker.models.containers import Container

from specdeploy.errors import SpecdeployError
from specdeploy.gate import client
from specdeploy.gate.benchmark import BenchmarkGate, GateResult
from specdeploy.record_types import Figures, PrewarmReport
from specdeploy.records import Serving, write_bench, write_prewarm
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.prewarm import Prewarmer
from specdeploy.serve.rollout import Outcome, Rollout
from specdeploy.transport import is_transport_error
from specdeploy.watch import memory, startup

Say = Callable[[str], None]


def result(outcome: Outcome, joined: bool, predicted_kv_capacity: int = 0) -> dict[str, Any]:
    """The task's result: the outcome, its one-line message, the start-up table to print, and the engine's
    own KV tokens beside what preflight predicted before the load (PREDICTED_KV_CAPACITY, in tokens; 0: none)."""
    failed = outcome.status not in ("deployed", "unchanged", "restarted")
    verdict = outcome.verdict or {}
    kv = memory.against_prediction(verdict.get("memory") or {}, predicted_kv_capacity)
    notes = [*outcome.notes, *([f"KV cache: the engine's {kv['engine_tokens']:,} tokens, predicted "
                                f"{kv['predicted_tokens']:,} ({kv['error_pct']:+.1f} %)"] if kv else [])]  # fmt: skip
    message = outcome.message if not notes else f"{outcome.message} | {' | '.join(notes)}"
    table = startup.render(verdict["startup"], verdict["status"]) if verdict.get("startup") else []
    return {**asdict(outcome), "changed": outcome.changed or joined, "failed": failed, "msg": message,
            "joined_router": joined, "startup_table": table, "kv_cache": kv}  # fmt: skip


def serving(outcome: Outcome, args: Mapping[str, Any], api_key_set: bool) -> Serving:
    """current.json after a promotion; a rollback names the image by its id (it has no tag of its own)."""
    return Serving(args["image"] if args["action"] == "deploy" else outcome.image_id, outcome.image_id,
                   outcome.previous_image_id, {**args["config"], "api_key_set": api_key_set}, outcome.started_at,
                   args["engine_image_profile"], args["engine_image_drafter_path"])  # fmt: skip


def image_id(rollout: Rollout, tag: str, where: str) -> str:
    """The id of image TAG on the rollout's host."""
    try:
        return str(rollout.client.images.get(tag).id)
    except Exception as exc:
        if is_transport_error(exc):
            raise
        raise SpecdeployError(f"image {tag} is not on {where}: run the build phase first") from exc


class Prewarm:
    """The rollout's `warm` step (run while the old engine serves); its report is kept beside the
    verdict of the start-up it was for."""

    def __init__(self, say: Say, prewarmer: Prewarmer, enabled: bool) -> None:
        self.say, self.prewarmer, self.enabled = say, prewarmer, enabled
        self.report: PrewarmReport | None = None

    def __call__(self) -> str:
        if not self.enabled:
            return "page cache not warmed (serving_warm_page_cache: false)"
        self.report = self.prewarmer.warm()
        self.say(self.report.message)
        return self.report.message

    def keep(self, verdict: dict[str, Any] | None) -> None:
        folder = (verdict or {}).get("diagnostics")
        if self.report is not None and folder:
            write_prewarm(Path(folder), self.report)


def _sweep_line(sweep: list[dict[str, Any]]) -> str:
    """`1: 12.3 tok/s, 4: 40.1 tok/s` (a level the client could not finish: its error)."""
    return ", ".join(f"{p['concurrency']}: {p['output_tokens_per_s']:.1f} tok/s" if "output_tokens_per_s" in p
                     else f"{p['concurrency']}: {p.get('error', '?')[:80]}" for p in sweep)  # fmt: skip


class SaidGate:
    """The benchmark gate as the rollout calls it (serve.rollout.Gate): each measurement said, each
    report kept (bench.json) for HOST's IMAGE."""

    def __init__(self, gate: BenchmarkGate, say: Say, cfg: ServingConfig, diagnostics: Path, *, host: str,
                 image: str) -> None:  # fmt: skip
        self.gate, self.say, self.host, self.image = gate, say, host, image
        self.cfg, self.diagnostics = cfg, diagnostics

    def outgoing(self, container: Container, kept: dict[str, Any] | None) -> dict[str, Any]:
        self.say(f"benchmark gate: measuring the outgoing {container.name} before it stops (an A/B)")
        measured = self.gate.outgoing(container, kept)
        figures = measured.get("figures")
        self.say(f"benchmark gate: outgoing {Figures.from_dict(figures).summary()}" if figures
                 else f"benchmark gate: {measured.get('note')}")  # fmt: skip
        return measured

    def wants_baseline(self) -> bool:
        return self.gate.wants_baseline()

    def baseline_key(self, config_digest: str, engine_version: str) -> str:
        return self.gate.baseline_key(config_digest, engine_version)

    def baseline(self, container: Container, kept: dict[str, Any] | None) -> dict[str, Any]:
        levels = ", ".join(str(c) for c in self.gate.settings.sweep)
        self.say(f"benchmark gate: the speculation-off baseline in {container.name} at {levels} concurrent "
                 "requests (once for this configuration, engine version and hardware)")  # fmt: skip
        measured = self.gate.baseline(container, kept)
        self.say(f"benchmark gate: baseline {_sweep_line(measured.get('sweep') or [])}"
                 if measured.get("sweep") else f"benchmark gate: {measured.get('note')}")  # fmt: skip
        return measured

    def draft_length(self, container: Container, length: int, tokens: int) -> dict[str, Any]:
        levels = ", ".join(str(c) for c in self.gate.settings.sweep)
        self.say(
            f"benchmark gate: draft length {length} in {container.name} at {levels} concurrent requests "
            "(serving_speculative_schedule: auto; once for this configuration, engine version and hardware)"
        )
        measured = self.gate.draft_length(container, length, tokens)
        self.say(f"benchmark gate: draft length {length}: {_sweep_line(measured.get('sweep') or [])}")
        return measured

    def __call__(self, container: Container, verdict: dict[str, Any], kept: dict[str, Any] | None,
                 outgoing: dict[str, Any] | None, baseline: dict[str, Any] | None, *,
                 schedule: dict[str, Any] | None = None) -> GateResult:  # fmt: skip
        gate = self.gate
        self.say(f"benchmark gate: {client.name(gate.engine)} in {container.name} (budget "
                 f"{gate.settings.budget_s:.0f} s, on {gate.hardware})")  # fmt: skip
        if schedule and schedule.get("schedule"):
            self.say(f"benchmark gate: the draft schedule auto chose: {schedule['said']}")
        result = gate(container, verdict, kept, outgoing, baseline, schedule=schedule)
        if result.report.get("sweep"):
            self.say(f"benchmark gate: sweep {_sweep_line(result.report['sweep'])}")
        self.say(result.message)
        folder = Path(str(verdict.get("diagnostics") or self.diagnostics))
        write_bench(folder, result.report, self.host, self.image,
                    image_id=str(container.attrs.get("Image", "")), config_digest=self.cfg.digest())  # fmt: skip
        return result
