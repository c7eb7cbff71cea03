"""The benchmark gate's rules: how long a benchmark may run, and when a new version is refused.

A READY engine can still be worse than the one it replaces (a drafter trained for another target,
the wrong speculative method, a chat template lost): the gate compares its figures with the last
promoted version's on the same host and hardware, and refuses it on a fall larger than
`serving_bench_max_regression`, or below `serving_bench_min_acceptance_length`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdeploy.record_types import Figures

CLIENT_START_S = 20.0  # `vllm bench serve` imports vLLM and loads the tokenizer (~20 s on the H100, 16 cores)
# The longest a client's start-up may take before the run counts as hung (its kill bound is the budget plus
# this). The start-up is the client's own imports (torch and every vLLM CLI module): 20-28 s on the lent
# H100/H200, and past 60 s on the 2-core test bed beside two engines under load, where a bound of the
# expected start-up killed healthy runs before their first request (make test-fleet, 2026-12-06).
CLIENT_START_LIMIT_S = 120.0
# The fewest tokens per request a budget sizes: what is left when the client's start-up took the budget
# (on the H200, vLLM 0.26's client took ~25 s of a 60-s budget, twice: 8 tokens, a measure of TTFT only).
FEWEST_TOKENS = 8
CALIBRATION_TOKENS = 32  # per request of the short sizing run (one request per concurrency slot)
# Two throughputs compare only if the host was about as busy for both: a difference in the 1-minute
# load average of more than half a CPU per CPU is another machine, as far as tokens/s go (the test
# bed's fleet under a steady load: 44.7 tok/s idle against 20.4 beside two serving engines).
LOAD_TOLERANCE = 0.5
# A sweep level runs whole rounds (as many requests as in flight) for at least this long: on the H200
# two sweeps of the same configuration, levels of 1-3 s, gave 6103 and 3171 tok/s at 16 (run-to-run noise).
SWEEP_LEVEL_S = 8.0
SWEEP_ROUNDS = (2, 8)  # the fewest and the most rounds a level runs


def flag(value: Any) -> bool:
    """An inventory boolean, however it was templated (`false`, "False", "no", 0)."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "1", "on")


@dataclass(frozen=True)
class GateSettings:
    enabled: bool = True  # serving_bench_gate: false measures and records, and refuses nothing
    budget_s: float = 60.0
    concurrency: int = 4
    max_tokens: int = 256  # the ceiling; the budget sizes the real figure
    min_acceptance_length: float = 0.0  # 0: no floor
    max_regression: float = 0.10  # a fraction of the previous figure
    sweep: tuple[int, ...] = ()  # concurrencies the new engine is also measured at
    baseline: str = "never"  # once: the same sweep with speculation off, measured once per host and kept
    expected_concurrency: int = 0  # > 0: refuse speculation slower than the baseline there
    prompts: str = ""  # serving_bench_prompts: the operator's JSONL on the controller; "": the shipped set

    @classmethod
    def from_vars(cls, values: dict[str, Any]) -> GateSettings:
        return cls(
            enabled=flag(values.get("gate", True)),
            budget_s=float(values.get("budget", 60)),
            concurrency=int(values.get("concurrency", 4)),
            max_tokens=int(values.get("max_tokens", 256)),
            min_acceptance_length=float(values.get("min_acceptance_length", 0)),
            max_regression=float(values.get("max_regression", 0.10)),
            sweep=tuple(int(c) for c in values.get("sweep") or ()),
            baseline=str(values.get("baseline", "never")),
            expected_concurrency=int(values.get("expected_concurrency", 0)),
            prompts=str(values.get("prompts") or ""),
        )

    def problems(self) -> list[str]:
        out = []
        if self.budget_s <= CLIENT_START_S:
            out.append(f"serving_bench_budget_s: {self.budget_s:g} s leaves no time to measure (the client alone takes "
                       f"~{CLIENT_START_S:.0f} s to start); give at least {CLIENT_START_S * 2:.0f}")  # fmt: skip
        if self.concurrency < 1 or self.max_tokens < 8:
            out.append("serving_bench_concurrency must be ≥ 1 and serving_bench_max_tokens ≥ 8")
        if not 0 < self.max_regression < 1:
            out.append(f"serving_bench_max_regression: {self.max_regression:g} is a fraction (0.10 = a 10% fall)")
        if self.baseline == "once" and not self.sweep:
            out.append("serving_bench_baseline: once compares a sweep: set serving_bench_sweep, e.g. [1, 4, 16, 64]")
        if self.expected_concurrency and self.baseline != "once":
            out.append("serving_bench_expected_concurrency compares with the speculation-off baseline: set "
                       "serving_bench_baseline: once")  # fmt: skip
        return out

    def auto_schedule_problems(self, measuring: bool) -> list[str]:
        """serving_speculative_schedule: auto is chosen by this gate: from its sweep, against its baseline.
        MEASURING: serving_bench (the gate runs at all)."""
        if not measuring:
            return ["serving_speculative_schedule: auto is chosen by the benchmark gate: set serving_bench: true"]
        if not self.sweep or self.baseline != "once":
            return ["serving_speculative_schedule: auto measures each draft length at every serving_bench_sweep level "
                    "against the speculation-off baseline: set serving_bench_sweep (e.g. [1, 4, 16]) and "
                    "serving_bench_baseline: once"]  # fmt: skip
        return []


def measuring_starts(settings: GateSettings, measuring: bool, speculative: bool, auto: bool,
                     num_speculative_tokens: int) -> list[str]:  # fmt: skip
    """The engine starts a host makes beside its own on the first rollout of a configuration (engine
    version, hardware, sweep), each one a start to READY and a sweep with the host out of the router (one
    GPU set holds one engine: serve.rollout's `_aside`), kept in the host's record for later rollouts:
    the speculation-off baseline (serving_bench_baseline: once), then each draft length from 1 to
    serving_num_speculative_tokens under serving_speculative_schedule: auto."""
    if not (measuring and speculative and settings.baseline == "once" and settings.sweep):
        return []
    lengths = [f"draft length {n}" for n in range(1, num_speculative_tokens + 1)] if auto else []
    return ["the speculation-off baseline", *lengths]


def output_tokens(settings: GateSettings, prompts: int, tokens_per_s: float, measuring_s: float) -> int:
    """Tokens per request so that PROMPTS requests fit MEASURING_S at the output speed a short run at
    the same concurrency measured on this engine (tokens/s over all requests in flight)."""
    if tokens_per_s <= 0 or measuring_s <= 0:
        return FEWEST_TOKENS
    return max(FEWEST_TOKENS, min(settings.max_tokens, int(0.8 * measuring_s * tokens_per_s / prompts)))


def _fall(name: str, new: float, old: float, limit: float) -> str | None:
    if old <= 0 or new >= old * (1 - limit):
        return None
    return (f"{name} fell from {old:.2f} to {new:.2f} ({(new - old) / old:+.0%}; serving_bench_max_regression "
            f"{limit:.0%})")  # fmt: skip


def incomparable(new: Figures, previous: Figures, *, loads: bool = True) -> str | None:
    """Why the two throughputs do not compare (None: they do): another workload, or (LOADS) another
    load on the host. An A/B with the outgoing engine minutes before passes loads=False: the 1-minute
    load average right after READY still holds the start-up's own burst (on the test bed 2.10 per CPU
    beside 1.56 for the same fleet), which is not another machine."""
    if (new.concurrency, new.max_tokens) != (previous.concurrency, previous.max_tokens):
        return (f"another workload ({new.concurrency} at once x {new.max_tokens} tokens, then {previous.concurrency} x "
                f"{previous.max_tokens})")  # fmt: skip
    both = (new.host_load, previous.host_load)
    if loads and None not in both and abs(both[0] - both[1]) > LOAD_TOLERANCE:  # type: ignore[operator]
        return f"the host was not as busy (load {both[0]:.2f} per CPU now, {both[1]:.2f} then)"
    return None


def refusals(new: Figures, previous: Figures | None, settings: GateSettings, speculative: bool, *,
             same_minute: bool = False) -> list[str]:  # fmt: skip
    """Why NEW must not be promoted (empty: it may). PREVIOUS: the figures it is judged against (the
    outgoing version's, measured just before it stopped, or the last promoted version's on the same
    hardware), or None (a first benchmark is judged by the floor only). SAME_MINUTE: PREVIOUS is the
    outgoing engine's A/B figure. Acceptance compares always; tokens/s only when incomparable() finds nothing."""
    out = []
    if new.failed:
        out.append(f"{new.failed} of {new.completed + new.failed} benchmark requests failed")
    if speculative and new.acceptance_length is None:
        out.append("speculative decoding is on, but the benchmark read no acceptance figure from the engine")
    length, floor = new.acceptance_length, settings.min_acceptance_length
    if speculative and length is not None and floor and length < floor:
        out.append(f"mean acceptance length {length:.2f} is below serving_bench_min_acceptance_length "
                   f"{settings.min_acceptance_length:.2f}")  # fmt: skip
    if previous is None:
        return out
    if speculative and length is not None and previous.acceptance_length is not None:
        if len(new.per_position_acceptance) == len(previous.per_position_acceptance):
            fall = _fall("mean acceptance length", length, previous.acceptance_length, settings.max_regression)
            out += [fall] if fall else []
        else:  # another num_speculative_tokens: the mean length cannot compare, each shared position can
            pairs = zip(new.per_position_acceptance, previous.per_position_acceptance, strict=False)
            falls = (_fall(f"acceptance at draft position {i}", a, b, settings.max_regression)
                     for i, (a, b) in enumerate(pairs, 1))  # fmt: skip
            out += [f for f in falls if f]
    if incomparable(new, previous, loads=not same_minute) is None:
        fall = _fall("output tokens/s", new.output_tokens_per_s, previous.output_tokens_per_s, settings.max_regression)
        out += [fall] if fall else []
    return out


def sweep_rounds(level: int, round_s: float | None) -> int:
    """Rounds of LEVEL requests for one sweep level: enough to last SWEEP_LEVEL_S at ROUND_S, the
    seconds a round took at the level before (None: the first level, at least 4 requests). The lower
    level's round is the shorter, so a level runs at least as long as asked, up to the most rounds."""
    fewest, most = SWEEP_ROUNDS
    if not round_s or round_s <= 0:
        return max(fewest, -(-4 // level))
    return max(fewest, min(most, math.ceil(SWEEP_LEVEL_S / round_s)))


def measured(point: dict[str, Any]) -> bool:
    """A sweep level is a measurement only when every request it sent completed: a level where most
    failed (on the H200, random-weight tokens that decode to no text: 4 of 4 at 1, 503 of 512 at 64)
    divides the few that finished by the level's time, a speed nobody served."""
    return bool(point.get("output_tokens_per_s")) and not point.get("failed") and not point.get("error")


def failed_levels(sweep: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> list[int]:
    """The concurrencies either sweep ran but did not measure (requests failed, or the client did)."""
    return sorted({int(p["concurrency"]) for p in (*sweep, *baseline) if not measured(p)})


def sweep_speeds(sweep: list[dict[str, Any]]) -> dict[int, float]:
    """A sweep's output tokens/s at each level it measured (every request completed)."""
    return {int(p["concurrency"]): float(p["output_tokens_per_s"]) for p in sweep if measured(p)}


def speedups(sweep: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> dict[int, float]:
    """Speculation's speed-up at each concurrency both sweeps measured: output tokens/s over the baseline's."""
    base = {int(p["concurrency"]): float(p["output_tokens_per_s"]) for p in baseline if measured(p)}
    return {int(p["concurrency"]): round(float(p["output_tokens_per_s"]) / base[int(p["concurrency"])], 3)
            for p in sweep if measured(p) and base.get(int(p["concurrency"]))}  # fmt: skip


def crossover(speedup: dict[int, float], failed: list[int] | tuple[int, ...] = ()) -> str:
    """One line: up to which concurrency speculation pays on this host, with the figures; the levels
    that were run but not measured (FAILED) are named, never counted."""
    unmeasured = f"; not measured (requests failed) at {', '.join(map(str, failed))}" if failed else ""
    if not speedup:
        return f"EAGLE-3's speed-up: no concurrency was measured both with and without speculation{unmeasured}"
    figures = ", ".join(f"x{s:.2f} at {c}" for c, s in sorted(speedup.items()))
    paying = [c for c, _ in sorted(speedup.items())]
    last = None
    for c in paying:
        if speedup[c] < 1.0:
            break
        last = c
    if last is None:
        return f"EAGLE-3 does not pay on this host at any measured concurrency ({figures}){unmeasured}"
    if last == paying[-1]:
        return f"EAGLE-3 pays at every measured concurrency on this host, up to {last} ({figures}){unmeasured}"
    return f"EAGLE-3 pays up to {last} concurrent requests on this host ({figures}){unmeasured}"


def at_concurrency(speedup: dict[int, float], expected: int) -> tuple[int, float] | None:
    """The measured level nearest EXPECTED (the lower on a tie) and its speed-up."""
    if not speedup:
        return None
    level = min(speedup, key=lambda c: (abs(c - expected), c))
    return level, speedup[level]
