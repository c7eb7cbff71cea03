"""The engine's own memory accounting, read from its start-up log: what the weights took, what was
left for the KV cache and how many tokens it holds. A fit predicted before a load is held to these
figures (they are the engine's words, not ours).

vLLM (`gpu_model_runner.py`, `gpu_worker.py`, `kv_cache_utils.py`):
    Model loading took 0.06 GiB memory and 0.680289 seconds
    Available KV cache memory: 127.32 GiB
    GPU KV cache size: 16,953,008 tokens[, Maximum concurrency for 2,048 tokens per request: 8277.84x]
    Graph capturing finished in 10 secs, took 0.46 GiB
SGLang (`model_runner.py`, `memory_pool.py`):
    Load weight end. elapsed=0.28 s, type=DeepseekV3ForCausalLM, avail mem=139.06 GB, mem usage=0.03 GB.
    KV Cache is allocated. dtype: torch.bfloat16, #tokens: 16792380, KV size: 108.10 GB

A line appears once per model: the target first, then the drafter (both engines load the target
first). Each figure is therefore a list in the order the log gives it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_PATTERNS: dict[str, re.Pattern[str]] = {
    "weights_gib": re.compile(rf"Model loading took {_NUMBER} GiB memory and {_NUMBER} seconds"),
    "kv_available_gib": re.compile(rf"Available KV cache memory: {_NUMBER} GiB"),
    "kv_tokens": re.compile(rf"[A-Z]+(?: \+ host)? KV cache size: {_NUMBER} tokens"),
    "max_concurrency": re.compile(rf"Maximum concurrency for {_NUMBER} tokens per request: {_NUMBER}x"),
    "cuda_graph_gib": re.compile(rf"Graph capturing finished in {_NUMBER} secs, took {_NUMBER} GiB"),
    "sglang_weights": re.compile(rf"Load weight end\. elapsed={_NUMBER} s, type=(\w+).*mem usage={_NUMBER} GB"),
    "sglang_kv": re.compile(
        rf"KV Cache is allocated\..*#tokens: {_NUMBER}, "
        rf"(?:K size: {_NUMBER} GB, V size: {_NUMBER} GB|KV size: {_NUMBER} GB)"
    ),
}


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class MemoryFigures:
    """Each list holds one entry per model loaded, target first."""

    weights_gib: list[float] = field(default_factory=list)
    weights_load_s: list[float] = field(default_factory=list)
    weights_model: list[str] = field(default_factory=list)  # SGLang names the class it loaded
    kv_available_gib: list[float] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)
    kv_gib: list[float] = field(default_factory=list)  # SGLang: the pool it allocated
    max_concurrency: list[float] = field(default_factory=list)
    max_concurrency_at_tokens: list[int] = field(default_factory=list)
    cuda_graph_gib: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v}

    def summary(self) -> str:
        """One line for a record: weights, KV memory and KV tokens as the engine counted them."""
        parts = []
        if self.weights_gib:
            parts.append("weights " + " + ".join(f"{g:g} GiB" for g in self.weights_gib))
        if self.kv_available_gib:
            parts.append(f"KV memory {self.kv_available_gib[0]:g} GiB")
        if self.kv_gib:
            parts.append("KV pool " + " + ".join(f"{g:g} GB" for g in self.kv_gib))
        if self.kv_tokens:
            parts.append(f"KV {self.kv_tokens[0]:,} tokens")
        if self.max_concurrency:
            parts.append(f"x{self.max_concurrency[0]:g} at {self.max_concurrency_at_tokens[0]:,} tokens")
        return "; ".join(parts) or "no memory figures in the log"


def memory_figures(lines: Iterable[str]) -> MemoryFigures:
    """The figures the engine's log states, in its order."""
    out = MemoryFigures()
    for line in lines:
        if m := _PATTERNS["weights_gib"].search(line):
            out.weights_gib.append(_num(m[1]))
            out.weights_load_s.append(_num(m[2]))
        if m := _PATTERNS["kv_available_gib"].search(line):
            out.kv_available_gib.append(_num(m[1]))
        if m := _PATTERNS["kv_tokens"].search(line):
            out.kv_tokens.append(int(_num(m[1])))
        if m := _PATTERNS["max_concurrency"].search(line):
            out.max_concurrency_at_tokens.append(int(_num(m[1])))
            out.max_concurrency.append(_num(m[2]))
        if m := _PATTERNS["cuda_graph_gib"].search(line):
            out.cuda_graph_gib.append(_num(m[2]))
        if m := _PATTERNS["sglang_weights"].search(line):
            out.weights_load_s.append(_num(m[1]))
            out.weights_model.append(m[2])
            out.weights_gib.append(_num(m[3]))
        if m := _PATTERNS["sglang_kv"].search(line):
            out.kv_tokens.append(int(_num(m[1])))
            out.kv_gib.append(_num(m[4]) if m[4] else round(_num(m[2]) + _num(m[3]), 2))
    return out


def against_prediction(memory: Mapping[str, Any], predicted_tokens: int) -> dict[str, Any] | None:
    """The engine's own KV tokens (the target's figure, its first) beside what preflight predicted before
    the load (specdeploy.preflight.memory), and the prediction's error; None when either is missing."""
    said = (memory.get("kv_tokens") or [0])[0]
    if not predicted_tokens or not said:
        return None
    return {"engine_tokens": int(said), "predicted_tokens": int(predicted_tokens),
            "error_pct": round((predicted_tokens - said) / said * 100, 1)}  # fmt: skip
