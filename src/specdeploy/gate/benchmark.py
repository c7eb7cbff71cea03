"""The benchmark gate between READY and promotion: measure the new engine, compare, decide.

The rollout calls it with the READY engine's container; what it returns decides promotion (restart
policy, record, router join). Figures are kept with the promoted version in the host's rollout record
(with the hardware they were measured on: only the same hardware compares) and in the controller's
run folder (`bench.json`, specdeploy.records, what `make report` draws)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from specdeploy.gate import client
from specdeploy.gate.figures import Figures
from specdeploy.gate.rules import CALIBRATION_TOKENS, GateSettings, output_tokens, refusals
from specdeploy.records import BENCH_SCHEMA, utc_now

# Read on the host: the accelerators a figure belongs to (the CPU where there is none: the test bed).
HARDWARE_PROBE = ("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c "
                  "|| true; grep -m1 'model name' /proc/cpuinfo; nproc")  # fmt: skip


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


@dataclass
class GateResult:
    passed: bool
    message: str
    kept: dict[str, Any] | None = None  # kept with the version when promoted: figures + hardware
    report: dict[str, Any] = field(default_factory=dict)  # bench.json


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

    def _run(self, container: client.ExecContainer, texts: list[str], concurrency: int, tokens: int) -> Figures:
        bench = client.BenchRun(self.model_path, self.served_model_name, self.base_url, len(texts), concurrency,
                                tokens, client.time_limit(self.settings.budget_s), self.trust_remote_code)  # fmt: skip
        return client.run(container, bench, texts, self.api_key)

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

    def __call__(self, container: client.ExecContainer, verdict: dict[str, Any],
                 previous_kept: dict[str, Any] | None) -> GateResult:  # fmt: skip
        start = time.monotonic()
        base = {"schema": BENCH_SCHEMA, "time": utc_now(), "hardware": self.hardware}
        if self.engine != "vllm":
            message = f"benchmark gate: not built for {self.engine} yet (vLLM's client only); nothing measured"
            return GateResult(True, message, None, {**base, "figures": None, "previous": None,
                              "gate": {"enabled": self.settings.enabled, "passed": True, "problems": [],
                                       "seconds": 0.0, "note": message}})  # fmt: skip
        previous, note = None, "no earlier benchmark on this host: judged by the floor only"
        if previous_kept and previous_kept.get("figures"):
            if previous_kept.get("hardware") == self.hardware:
                previous, note = Figures.from_dict(previous_kept["figures"]), "compared with the last promoted version"
            else:
                note = f"the last promoted version was measured on other hardware ({previous_kept.get('hardware')})"
        texts = client.prompts()
        figures: Figures | None = None
        concurrency, tokens = self.settings.concurrency, CALIBRATION_TOKENS
        try:
            concurrency, tokens = self._sizing(container, texts, previous)
            figures = self._run(container, texts, concurrency, tokens)
            problems = refusals(figures, previous, self.settings, self.speculative)
        except client.BenchFailed as exc:
            problems = [f"the benchmark could not run: {exc}"]
        bench = client.BenchRun(self.model_path, self.served_model_name, self.base_url, len(texts), concurrency,
                                tokens, client.time_limit(self.settings.budget_s), self.trust_remote_code)  # fmt: skip
        seconds = round(time.monotonic() - start, 1)
        passed = not problems or not self.settings.enabled
        if problems:
            verb = "refused" if self.settings.enabled else "would refuse (serving_bench_gate: false)"
            message = f"benchmark gate {verb}: {'; '.join(problems)}"
        else:
            message = f"benchmark gate passed: {figures.summary() if figures else ''}; {note}"
        report = {**base, "figures": figures.to_dict() if figures else None,
                  "previous": previous.to_dict() if previous else None, "command": client.describe(bench),
                  "gate": {"enabled": self.settings.enabled, "passed": passed, "problems": problems,
                           "seconds": seconds, "note": note}}  # fmt: skip
        kept = {"figures": figures.to_dict(), "hardware": self.hardware} if figures else None
        return GateResult(passed, message, kept, report)
