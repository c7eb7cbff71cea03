"""What the engine leaves for the KV cache on one GPU, before any load (issue 36): the fit on paper.

    KV bytes = (GPU memory - unseen) x memory fraction - weights - reserve

- GPU memory: nvidia-smi's total (what preflight reads); `unseen` is what neither engine's fraction
  applies to: vLLM takes its fraction of torch's total (the driver keeps 0.47 GiB of an H100's
  79.65, 0.60 of an H200's 140.40 from CUDA), SGLang of the memory free at its start (CUDA's context
  gone too: 1.15 and 1.27 GiB);
- the fraction: serving_gpu_memory_fraction, or the engine's default (vLLM 0.33: 0.92,
  `config/cache.py`; SGLang 0.5.23 computes one from the GPU, `srt/arg_groups/memory_hook.py`);
- the weights: specdeploy.preflight.weights (target and drafter);
- the reserve: vLLM sizes its cache after profiling, so its reserve is its non-torch memory (CUDA
  context, cuBLAS/NCCL workspaces: 2.12 GiB, 2.22 with the drafter) and its peak activation (2.53 GiB;
  7.49-8.62 with EAGLE-3), read from "Actual usage is ..." in the recorded logs; SGLang leaves the
  activations and CUDA graphs outside its fraction (its default fraction is where they are counted),
  so its reserve is none.
Fitted on Kimi-K2.5 at full depth, TP 1, 8192 batched tokens (tests/data/gpu_truth); held by
tests/unit/preflight/test_memory.py. Other models, TP > 1 (NCCL's buffers) and other batch sizes
move the reserve: a prediction, not a measure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specdeploy.preflight import fit
from specdeploy.preflight.weights import Layout

MIB = 1024**2
ENGINES = ("vllm", "sglang")
UNSEEN_GIB = {"vllm": 0.55, "sglang": 1.2}  # the H100's and the H200's, between them
VLLM_DEFAULT_FRACTION = 0.92
# vLLM's non-torch memory + peak activation, without and with an EAGLE-3 drafter (GiB).
VLLM_RESERVE_GIB = {False: 2.12 + 2.53, True: 2.22 + 8.06}
_SGLANG_MEMORY_TIERS = ((20, 2048, 8, 8), (35, 4096, 48, 160), (60, 4096, 32, 160))  # GiB: chunk, max_bs, tp>=4


@dataclass(frozen=True)
class Serving:
    """The serving_* values the fit depends on."""

    engine: str = "vllm"
    layout: Layout = field(default_factory=Layout)
    gpu_memory_fraction: float = 0.0  # 0: the engine's default
    max_model_len: int = 0
    kv_cache_dtype: str = ""
    speculative: bool = False
    max_batched_tokens: int = 0
    max_running_requests: int = 0

    # The serving_* variables from_vars reads (serving_env: vLLM on CPU's cache size).
    VARIABLES = tuple(f"serving_{n}" for n in (
        "tensor_parallel_size", "pipeline_parallel_size", "expert_parallel", "gpu_memory_fraction", "max_model_len",
        "kv_cache_dtype", "speculative_method", "max_batched_tokens", "max_running_requests", "encoder_tp_mode",
        "env"))  # fmt: skip

    @classmethod
    def from_vars(cls, values: Mapping[str, Any], engine: str) -> Serving:
        """From the inventory's serving_* variables (absent ones take the role's defaults)."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: one of {', '.join(ENGINES)}")

        def number(name: str) -> float:
            value = values.get(f"serving_{name}")
            return float(value) if value not in (None, "") else 0.0

        layout = Layout(int(number("tensor_parallel_size")) or 1, int(number("pipeline_parallel_size")) or 1,
                        str(values.get("serving_expert_parallel", False)).lower() in ("true", "1", "yes"),
                        values.get("serving_encoder_tp_mode") == "data")  # fmt: skip
        return cls(engine, layout, number("gpu_memory_fraction"), int(number("max_model_len")),
                   str(values.get("serving_kv_cache_dtype") or ""),
                   str(values.get("serving_speculative_method") or "") not in ("", "none"),
                   int(number("max_batched_tokens")), int(number("max_running_requests")))  # fmt: skip


def sglang_default_fraction(gpu_mib: int, serving: Serving, mla: bool) -> float:
    """SGLang 0.5.23's own mem_fraction_static when none is given (srt/arg_groups/memory_hook.py): the
    GPU less its reserve for activations and CUDA graphs, 512 MiB + 1.5 MiB a prefill token + 128 MiB a
    rank + 2 MiB a decode graph's batch + 1.5 GiB for MLA's prefill graphs, rounded to 3 places.
    Its chunk and graph batch by GPU memory; the batch capped by the running requests (0.821 on the
    H100 and 0.899 on the H200 recorded at 64). Kimi-K2.5's vision tower did not lower it there."""
    tp, pp = serving.layout.tensor_parallel, serving.layout.pipeline_parallel
    chunk, max_bs = 8192, (256 if tp < 4 else 512)
    for below_gib, tier_chunk, small_bs, large_bs in _SGLANG_MEMORY_TIERS:
        if gpu_mib < below_gib * 1024:
            chunk, max_bs = tier_chunk, (small_bs if tp < 4 else large_bs)
            break
    chunk = serving.max_batched_tokens or chunk
    max_bs = min(max_bs, serving.max_running_requests or max_bs)
    reserved = 512 + 1.5 * max(chunk, 2048) + tp * pp / 8 * 1024 + 2 * max_bs + (1536 if mla else 0)
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


@dataclass(frozen=True)
class Fit:
    """One GPU's memory on paper, in bytes."""

    gpu_bytes: int
    fraction: float
    weights: int  # target and drafter
    reserve: int
    kv_bytes: int
    per_token: int
    max_model_len: int

    @property
    def kv_tokens(self) -> int:
        return fit.kv_tokens(max(self.kv_bytes, 0), self.per_token)

    @property
    def max_concurrency(self) -> float:
        return self.kv_tokens / self.max_model_len if self.max_model_len else 0.0

    def problems(self) -> list[str]:
        """A KV cache that cannot hold one serving_max_model_len sequence (fit.sequence_problems)."""
        if self.kv_bytes <= 0:
            return [f"the weights ({self.weights / fit.GIB:.2f} GiB a GPU) and the engine's reserve "
                    f"({self.reserve / fit.GIB:.2f} GiB) leave no KV cache in {self.fraction:g} of "
                    f"{self.gpu_bytes / fit.GIB:.2f} GiB; raise serving_gpu_memory_fraction or spread the "
                    "model wider (serving_tensor_parallel_size, serving_pipeline_parallel_size)"]  # fmt: skip
        return fit.sequence_problems(self.kv_bytes, self.per_token, self.max_model_len)

    def lines(self) -> list[str]:
        gib = fit.GIB
        return [
            f"GPU memory {self.gpu_bytes / gib:.2f} GiB, fraction {self.fraction:g}",
            f"weights {self.weights / gib:.2f} GiB a GPU (target and drafter)",
            f"engine reserve {self.reserve / gib:.2f} GiB",
            f"KV cache {self.kv_bytes / gib:.2f} GiB = {self.kv_tokens:,} tokens at {self.per_token:,} bytes a token",
            f"max concurrency {self.max_concurrency:.2f} at serving_max_model_len={self.max_model_len:,}",
        ]


def cpu_fit(kv_gib: float, config: Mapping[str, Any], max_model_len: int,
            drafter_config: Mapping[str, Any] | None = None) -> Fit:  # fmt: skip
    """vLLM on CPU sizes its cache from VLLM_CPU_KVCACHE_SPACE (GiB), whatever the weights: set, not predicted.
    The bytes a token are, the EAGLE-3 drafter's layer included (the test bed's tiny Kimi-K2.5: 6,912 without
    it, 8,064 with it: 133,152 tokens a GiB against the engine's 133,120)."""
    kv = int(kv_gib * fit.GIB)
    return Fit(kv, 1.0, 0, 0, kv, fit.kv_bytes_per_token(config, drafter=drafter_config), max_model_len)


def predict(serving: Serving, gpu_mib: int, weights: int, config: Mapping[str, Any],
            drafter_config: Mapping[str, Any] | None = None) -> Fit:  # fmt: skip
    """The fit of one GPU of GPU_MIB (nvidia-smi's total) holding WEIGHTS bytes (weights.weight_bytes)."""
    mla = bool(fit.text_config(config).get("kv_lora_rank"))
    fraction = serving.gpu_memory_fraction or (
        VLLM_DEFAULT_FRACTION if serving.engine == "vllm" else sglang_default_fraction(gpu_mib, serving, mla)
    )
    usable = gpu_mib * MIB - UNSEEN_GIB[serving.engine] * fit.GIB
    reserve = int(VLLM_RESERVE_GIB[serving.speculative] * fit.GIB) if serving.engine == "vllm" else 0
    # vLLM counts the drafter's layers in each token of one cache; SGLang gives the drafter a pool of its
    # own, of the same tokens, outside the fraction.
    drafter = drafter_config if serving.speculative and serving.engine == "vllm" else None
    per_token = fit.kv_bytes_per_token(config, serving.kv_cache_dtype, tensor_parallel=serving.layout.tensor_parallel,
                                       pipeline_parallel=serving.layout.pipeline_parallel, drafter=drafter)  # fmt: skip
    kv = int(usable * fraction) - weights - reserve
    return Fit(gpu_mib * MIB, fraction, weights, reserve, kv, per_token, serving.max_model_len)
