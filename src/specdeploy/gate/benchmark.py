"""The benchmark gate between READY and promotion: measure the new engine, compare, decide.

The rollout calls it with the READY engine's container; what it returns decides promotion (restart
policy, record, router join). Figures are kept with the promoted version in the host's rollout record
(with the hardware they were measured on: only the same hardware compares) and in the controller's
run folder (`bench.json`, specdeploy.records, what `make report` draws)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from specdeploy.draft_schedule import AUTO, SCHEDULE_FLOOR, drafts_within, parse
from specdeploy.gate import client, prompt_file
from specdeploy.gate.rules import (
    CALIBRATION_TOKENS,
    FEWEST_TOKENS,
    GateSettings,
    at_concurrency,
    crossover,
    failed_levels,
    incomparable,
    output_tokens,
    refusals,
    speedups,
    sweep_rounds,
)
from specdeploy.record_types import Figures
from specdeploy.records import BENCH_SCHEMA, utc_now

# Read on the host: the accelerators a figure belongs to (the CPU where there is none: the test bed).
HARDWARE_PROBE = ("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c "
                  "|| true; grep -m1 'model name' /proc/cpuinfo; nproc")  # fmt: skip


# Read inside the engine's container: /proc/loadavg is the host kernel's, nproc the CPUs it may use.
LOAD_PROBE = ["sh", "-c", "cut -d' ' -f1 /proc/loadavg; nproc"]


def host_load(container: client.ExecContainer) -> float | None:
    """The host's 1-minute load average per CPU, as the engine's container sees it (None: unreadable)."""
    done = container.exec_run(LOAD_PROBE)
    try:
        load, cpus = (float(x) for x in bytes(done.output or b"").decode().split()[:2])
    except ValueError:
        return None
    return round(load / cpus, 3) if done.exit_code == 0 and cpus > 0 else None


def hardware(probe_output: str) -> str:
    """One line naming what the host runs on: `8 x NVIDIA RTX PRO 6000 …; CPU …, 128 threads`."""
    gpus, cpu, threads = [], "", ""
    for line in (raw.strip() for raw in probe_output.splitlines()):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
        elif line.isdigit():
            threads = line
        elif line and line.split(maxsplit=1)[0].isdigit() and len(line.split(maxsplit=1)) == 2:
            count, name = line.split(maxsplit=1)
            gpus.append(f"{count} x {name}")
    return "; ".join([*gpus, f"CPU {cpu or 'unknown'}, {threads or '?'} threads"])


def schedule_refusals(schedule: dict[str, Any] | None, speedup: dict[str, float] | None) -> list[str]:
    """`auto`'s schedule is kept only if it is no slower than speculation off at every measured level
    (within SCHEDULE_FLOOR: the sweep's noise), and only if every level was measured."""
    if not schedule or not schedule.get("schedule") or not schedule.get("drafts"):
        return []  # no drafts anywhere: the engine is the baseline's configuration, compared with itself
    if not speedup:
        return ["the draft schedule auto chose could not be proven: no level was measured against the baseline"]
    slow = {c: s for c, s in speedup.items() if s < SCHEDULE_FLOOR}
    if not slow:
        return []
    levels = ", ".join(f"x{s:.2f} at {c}" for c, s in sorted(slow.items(), key=lambda cs: int(cs[0])))
    return [f"the draft schedule auto chose ({schedule.get('said')}) is slower than speculation off ({levels}; "
            f"the floor is x{SCHEDULE_FLOOR:.2f} at every level)"]  # fmt: skip


def schedule_line(schedule: dict[str, Any], speedup: dict[str, float] | None) -> str:
    """The verdict's words for `auto`: the schedule, and its speed-up at each level."""
    if not schedule.get("schedule"):
        return f"Draft schedule: {schedule.get('note')}"
    figures = ", ".join(f"x{s:.2f} at {c}" for c, s in sorted((speedup or {}).items(), key=lambda cs: int(cs[0])))
    if not schedule.get("drafts"):
        return (
            f"Draft schedule (auto): {schedule.get('said')}: no length paid at any level, so no speculative "
            f"config at all (the baseline's configuration; its sweep again: {figures or 'not measured'})"
        )
    return f"Draft schedule (auto): {schedule.get('said')}; against speculation off: {figures or 'not measured'}"


@dataclass
class GateResult:
    passed: bool
    message: str
    kept: dict[str, Any] | None = None  # kept with the version when promoted: figures + hardware
    report: dict[str, Any] = field(default_factory=dict)  # bench.json


class GateTarget(Protocol):
    """What the gate needs of the engine it measures (serve.config.ServingConfig is one): the gate
    stands below serve/, so it names no serving type."""

    @property
    def engine(self) -> str: ...
    @property
    def speculative_method(self) -> str: ...
    @property
    def speculative_schedule(self) -> str: ...
    def drafts_within(self, most: int) -> bool: ...
    @property
    def served_model_name(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def trust_remote_code(self) -> bool: ...
    @property
    def model_mount(self) -> str: ...
    @property
    def url_inside(self) -> str: ...


@dataclass(frozen=True)
class BenchmarkGate:
    settings: GateSettings
    engine: str
    speculative: bool
    model_path: str  # inside the container
    served_model_name: str
    base_url: str  # the engine from inside its container
    api_key: str = field(repr=False)
    hardware: str
    trust_remote_code: bool = False
    # serving_bench_prompts' requests, read once on the controller; empty: the shipped set.
    own_prompts: tuple[str, ...] = ()

    @classmethod
    def for_engine(cls, settings: GateSettings, cfg: GateTarget, hardware_line: str) -> BenchmarkGate:
        """The gate of CFG's engine: its own client inside its container, on the engine's loopback URL."""
        own = tuple(prompt_file.read(settings.prompts)) if settings.prompts else ()
        # Drafts at the gate's concurrency (an explicit schedule may draft nothing there); auto's choice
        # is judged when it is known (__call__'s schedule).
        drafts = cfg.drafts_within(settings.concurrency) or (
            cfg.speculative_method == "eagle3" and cfg.speculative_schedule == AUTO)  # fmt: skip
        return cls(settings, cfg.engine, drafts, cfg.model_mount, cfg.served_model_name,
                   cfg.url_inside, cfg.api_key or "", hardware_line, cfg.trust_remote_code, own)  # fmt: skip

    def texts(self) -> list[str]:
        """The requests every measurement sends: the operator's (serving_bench_prompts), else the shipped set."""
        return list(self.own_prompts) or client.prompts()

    def _client(self, prompts: int, concurrency: int, tokens: int) -> client.BenchRun:
        limit = client.time_limit(self.settings.budget_s)
        return client.BenchRun(self.model_path, self.served_model_name, self.base_url, prompts, concurrency, tokens,
                               limit, self.trust_remote_code, self.engine)  # fmt: skip

    def _run(self, container: client.ExecContainer, texts: list[str], concurrency: int, tokens: int) -> Figures:
        bench = self._client(len(texts), concurrency, tokens)
        before = host_load(container)
        figures = client.run(container, bench, texts, self.api_key)
        after = host_load(container)
        loads = [x for x in (before, after) if x is not None]
        return replace(figures, host_load=round(sum(loads) / len(loads), 3) if loads else None)

    def outgoing(self, container: client.ExecContainer, previous_kept: dict[str, Any] | None) -> dict[str, Any]:
        """The outgoing version measured just before it stops (it has left the router): the workload
        of its own record when there is one on this hardware, else sized as a first benchmark is. The
        new version is then judged against these figures, an A/B under the same conditions; its
        record stays as history. {"figures": None, "note": why} when it cannot be measured."""
        kept = self._kept(previous_kept)[0]
        texts = self.texts()
        try:
            concurrency, tokens = self._sizing(container, texts, kept)
            figures = self._run(container, texts, concurrency, tokens)
        except client.BenchFailed as exc:
            return {"figures": None, "note": f"the outgoing version could not be measured: {exc}"}
        return {"figures": figures.to_dict(), "hardware": self.hardware, "time": utc_now()}

    def _kept(self, previous_kept: dict[str, Any] | None) -> tuple[Figures | None, str]:
        """The last promoted version's figures if they were measured on this hardware, and a note."""
        if not previous_kept or not previous_kept.get("figures"):
            return None, "no earlier benchmark on this host: judged by the floor only"
        if previous_kept.get("hardware") != self.hardware:
            return None, f"the last promoted version was measured on other hardware ({previous_kept.get('hardware')})"
        return Figures.from_dict(previous_kept["figures"]), "compared with the last promoted version's record"

    def _sizing(self, container: client.ExecContainer, texts: list[str], previous: Figures | None) -> tuple[int, int]:
        """(concurrency, tokens per request): the previous version's when there is one (the same
        workload, or the figures would not compare); else what fits the budget, from a short run
        (one request per slot) that measures this engine's speed and the client's own start-up."""
        if previous is not None:
            return previous.concurrency, previous.max_tokens
        concurrency, start = self.settings.concurrency, time.monotonic()
        probe = self._run(container, texts[:concurrency], concurrency, CALIBRATION_TOKENS)
        wall = time.monotonic() - start
        left = self.settings.budget_s - wall - max(0.0, wall - probe.duration_s)  # the main run starts up too
        return concurrency, output_tokens(self.settings, len(texts), probe.output_tokens_per_s, left)

    def wants_baseline(self) -> bool:
        return self.settings.baseline == "once" and bool(self.settings.sweep) and self.speculative

    def baseline_key(self, config_digest: str, engine_version: str) -> str:
        """The baseline a configuration is judged against: once per configuration (without its drafter),
        engine version, hardware and sweep."""
        prompts = [prompt_file.digest(list(self.own_prompts))] if self.own_prompts else []  # the shipped: as before
        what = json.dumps([config_digest, engine_version, self.hardware, list(self.settings.sweep), *prompts])
        return "sha256:" + hashlib.sha256(what.encode()).hexdigest()

    def sweep(self, container: client.ExecContainer, tokens: int) -> list[dict[str, Any]]:
        """The engine at each of the settings' concurrencies, TOKENS per request, in whole rounds (as
        many requests as in flight; the prompt set, cycled) that last about SWEEP_LEVEL_S, timed by the
        level before. A level the client cannot finish is kept with its error."""
        texts, out, round_s = self.texts(), [], None
        for level in self.settings.sweep:
            rounds = sweep_rounds(level, round_s)
            batch = [texts[i % len(texts)] for i in range(level * rounds)]
            try:
                figures = self._run(container, batch, level, tokens)
            except client.BenchFailed as exc:
                out.append({"concurrency": level, "rounds": rounds, "error": str(exc)[:300]})
                continue
            round_s = figures.duration_s / rounds
            out.append({"concurrency": level, "rounds": rounds, **figures.to_dict()})
        return out

    def baseline(self, container: client.ExecContainer, previous_kept: dict[str, Any] | None) -> dict[str, Any]:
        """The sweep of the same image and flags with speculation off (CONTAINER runs it), with the
        tokens per request of the host's record, else sized as a first benchmark is: what the new
        engine's sweep is divided by. Kept in the host's record, measured once."""
        kept = self._kept(previous_kept)[0]
        try:
            tokens = self._sizing(container, self.texts(), kept)[1]
        except client.BenchFailed as exc:
            return {"sweep": [], "note": f"the baseline could not be measured: {exc}"}
        return {"sweep": self.sweep(container, tokens), "max_tokens": tokens, "hardware": self.hardware,
                "time": utc_now()}  # fmt: skip

    def draft_length(self, container: client.ExecContainer, length: int, tokens: int) -> dict[str, Any]:
        """serving_speculative_schedule: auto: the sweep of the engine drafting LENGTH tokens at every batch
        size, with the baseline's TOKENS per request (so the two divide)."""
        return {"length": length, "sweep": self.sweep(container, tokens), "max_tokens": tokens,
                "hardware": self.hardware, "time": utc_now()}  # fmt: skip

    def _speedup(
        self, sweep: list[dict[str, Any]], baseline: dict[str, Any] | None
    ) -> tuple[dict[str, Any], list[str]]:
        """The report's speed-up entries and the refusal, if any, at the expected concurrency."""
        if not baseline:
            return {"baseline": None}, []
        if not baseline.get("sweep"):  # e.g. the speculation-off engine never came up: said, not refused
            return {"baseline": baseline, "crossover": f"no speed-up measured: {baseline.get('note')}"}, []
        speedup = speedups(sweep, baseline["sweep"])
        line, problems = crossover(speedup, failed_levels(sweep, baseline["sweep"])), []
        expected = self.settings.expected_concurrency
        found = at_concurrency(speedup, expected) if expected else None
        if found and found[1] < 1.0:
            problems.append(f"EAGLE-3 is slower than speculation off at {found[0]} concurrent requests "
                            f"(x{found[1]:.2f}; serving_bench_expected_concurrency {expected})")  # fmt: skip
        return {"baseline": baseline, "speedup": {str(c): s for c, s in sorted(speedup.items())},
                "crossover": line}, problems  # fmt: skip

    def __call__(self, container: client.ExecContainer, verdict: dict[str, Any], previous_kept: dict[str, Any] | None,
                 outgoing: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None, *,
                 schedule: dict[str, Any] | None = None) -> GateResult:  # fmt: skip
        """Measure the READY engine and judge it: against OUTGOING (the version it replaces, measured
        minutes ago under the same load) when that was measured, else against PREVIOUS_KEPT (the last
        promoted version's record), whose throughput counts only if the host was as busy then.
        SCHEDULE (serving_speculative_schedule: auto's choice): proven against BASELINE at every level."""
        start = time.monotonic()
        base = {"schema": BENCH_SCHEMA, "time": utc_now(), "hardware": self.hardware}
        record, note = self._kept(previous_kept)
        previous, comparison = record, "record" if record else "none"
        if outgoing and outgoing.get("figures"):
            previous, comparison = Figures.from_dict(outgoing["figures"]), "outgoing"
            note = "compared with the outgoing version, measured just before it stopped (same workload and hour)"
        elif outgoing and outgoing.get("note"):
            note = f"{outgoing['note']}; {note}"
        texts = self.texts()
        figures: Figures | None = None
        concurrency, tokens = self.settings.concurrency, CALIBRATION_TOKENS
        sweep: list[dict[str, Any]] = []
        speedup: dict[str, Any] = {}
        try:
            concurrency, tokens = self._sizing(container, texts, previous)
            if previous is None and tokens <= FEWEST_TOKENS:
                budget = self.settings.budget_s
                note += (f"; the budget sized only {tokens} tokens per request (the client's start-up took most of "
                         f"serving_bench_budget_s {budget:g} s): raise it to measure decode")  # fmt: skip
            figures = self._run(container, texts, concurrency, tokens)
            ab = comparison == "outgoing"
            chosen = parse(schedule.get("schedule") or "") if schedule else ()  # (): one length
            drafts = self.speculative and drafts_within(chosen, concurrency)
            problems = refusals(figures, previous, self.settings, drafts, same_minute=ab)
            why = incomparable(figures, previous, loads=not ab) if previous else None
            if why:  # said, not refused: the new version is not to blame for the machine's load
                note += f"; tokens/s not compared: {why}"
            if self.settings.sweep:  # the baseline's workload, so the two sweeps divide
                sweep = self.sweep(container, int(baseline.get("max_tokens") or tokens) if baseline else tokens)
                speedup, slower = self._speedup(sweep, baseline)
                problems += slower + schedule_refusals(schedule, speedup.get("speedup"))
        except client.BenchFailed as exc:
            problems = [f"the benchmark could not run: {exc}"]
        bench = self._client(len(texts), concurrency, tokens)
        seconds = round(time.monotonic() - start, 1)
        passed = not problems or not self.settings.enabled
        if problems:
            verb = "refused" if self.settings.enabled else "would refuse (serving_bench_gate: false)"
            message = f"benchmark gate {verb}: {'; '.join(problems)}"
        else:
            message = f"benchmark gate passed: {figures.summary() if figures else ''}; {note}"
        if speedup.get("crossover"):
            message += f". {speedup['crossover']}"
        if schedule is not None:
            message += f". {schedule_line(schedule, speedup.get('speedup'))}"
        report = {**base, "figures": figures.to_dict() if figures else None, "sweep": sweep, **speedup,
                  "previous": previous.to_dict() if previous else None, "comparison": comparison,
                  "record": record.to_dict() if record and comparison == "outgoing" else None,
                  "command": client.describe(bench), **({"schedule": schedule} if schedule is not None else {}),
                  "gate": {"enabled": self.settings.enabled, "passed": passed, "problems": problems,
                           "seconds": seconds, "note": note}}  # fmt: skip
        kept = {"figures": figures.to_dict(), "hardware": self.hardware} if figures else None
        return GateResult(passed, message, kept, report)
