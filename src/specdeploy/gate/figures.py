"""What the benchmark gate measures on a new engine, read from the engine's own client's result.

vLLM's `vllm bench serve --save-result` measures the served endpoint: output tokens/s, TTFT,
inter-token latency and time-per-output-token percentiles, and the spec-decode counters' deltas from the
engine's `/metrics` (acceptance rate in percent, mean acceptance length, per-position acceptance). Keys checked in the
vLLM 0.32 source (`vllm/benchmarks/serve.py`). SGLang's `sglang.benchmark.serving --output-file`
appends one JSON line: the same throughput, medians and p99s, and `accept_length` (SGLang's mean
acceptance length; no rate, no positions). Keys checked in SGLang 0.5.23 (`benchmark/serving.py`)."""

from __future__ import annotations

import json
from typing import Any

from specdeploy.record_types import Figures


class BadResult(ValueError):
    """The client's result file lacks what the gate reads."""


def _number(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, int | float):
        raise BadResult(f"the benchmark result has no number {key!r} (keys: {', '.join(sorted(doc)[:20])})")
    return float(value)


def _percentiles(doc: dict[str, Any], keys: dict[str, str]) -> dict[str, float]:
    """The percentiles KEYS names ({"p50": key, …}) where the result has them all, else none (an older
    client, or one told fewer metrics)."""
    if not all(isinstance(doc.get(key), int | float) for key in keys.values()):
        return {}
    return {p: round(float(doc[key]), 3) for p, key in keys.items()}


def from_vllm_bench(doc: dict[str, Any], *, num_prompts: int, concurrency: int, max_tokens: int) -> Figures:
    completed = int(_number(doc, "completed"))
    rate = doc.get("spec_decode_acceptance_rate")
    length = doc.get("spec_decode_acceptance_length")
    positions = doc.get("spec_decode_per_position_acceptance_rates") or []
    return Figures(
        completed=completed,
        failed=int(doc["failed"]) if isinstance(doc.get("failed"), int) else max(0, num_prompts - completed),
        duration_s=round(_number(doc, "duration"), 3),
        concurrency=concurrency,
        max_tokens=max_tokens,
        output_tokens_per_s=round(_number(doc, "output_throughput"), 3),
        ttft_ms={p: round(_number(doc, f"{p}_ttft_ms"), 3) for p in ("p50", "p99")},
        itl_ms={p: round(_number(doc, f"{p}_itl_ms"), 3) for p in ("p50", "p99")},
        acceptance_rate=round(float(rate) / 100, 4) if isinstance(rate, int | float) else None,
        acceptance_length=round(float(length), 4) if isinstance(length, int | float) else None,
        per_position_acceptance=[round(float(x), 4) for x in positions if isinstance(x, int | float)],
        tpot_ms=_percentiles(doc, {"p50": "p50_tpot_ms", "p99": "p99_tpot_ms"}),
    )


def from_sglang_bench(doc: dict[str, Any], *, num_prompts: int, concurrency: int, max_tokens: int) -> Figures:
    completed = int(_number(doc, "completed"))
    length = doc.get("accept_length")  # None when speculation is off (or SGLang had no figure yet)
    return Figures(
        completed=completed,
        failed=max(0, num_prompts - completed),
        duration_s=round(_number(doc, "duration"), 3),
        concurrency=concurrency,
        max_tokens=max_tokens,
        output_tokens_per_s=round(_number(doc, "output_throughput"), 3),
        ttft_ms={"p50": round(_number(doc, "median_ttft_ms"), 3), "p99": round(_number(doc, "p99_ttft_ms"), 3)},
        itl_ms={"p50": round(_number(doc, "median_itl_ms"), 3), "p99": round(_number(doc, "p99_itl_ms"), 3)},
        acceptance_length=round(float(length), 4) if isinstance(length, int | float) and length > 0 else None,
        tpot_ms=_percentiles(doc, {"p50": "median_tpot_ms", "p99": "p99_tpot_ms"}),
    )


def from_client(engine: str, text: str, *, num_prompts: int, concurrency: int, max_tokens: int) -> Figures:
    """The ENGINE's client's result file: vLLM's one JSON document, SGLang's last JSON line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise BadResult("the result file is empty")
    read = from_sglang_bench if engine == "sglang" else from_vllm_bench
    doc = json.loads(lines[-1] if engine == "sglang" else text)
    if not isinstance(doc, dict):
        raise BadResult("the result is not a JSON object")
    return read(doc, num_prompts=num_prompts, concurrency=concurrency, max_tokens=max_tokens)
