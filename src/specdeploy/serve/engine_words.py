"""Each pinned engine's own words for the serving recipe: the values its parser and registries take,
and the environment variables that say them. Each knob's flags sit on its declaration
(specdeploy.serve.schema), which uses these words.

Read from the pinned releases' own source (vllm 0.33.0: `v1/attention/backends/registry.py`
AttentionBackendEnum, `config/cache.py` CacheDType, `config/speculative.py` SpeculativeConfig,
`envs.py`; sglang 0.5.23: `srt/arg_groups/choices.py`, `srt/arg_groups/fields/*.py`,
`srt/environ.py`). tests/integration/test_engine_words.py reads the same declarations from the
wheels and fails when a pin moves and a word here no longer matches.
"""

from __future__ import annotations

# vLLM parses --attention-backend and the speculative config's attention_backend as
# AttentionBackendEnum[value.upper()] (config/attention.py): the enum's member names.
VLLM_ATTENTION_BACKENDS: tuple[str, ...] = (
    "FLASH_ATTN", "FLASH_ATTN_DIFFKV", "TRITON_ATTN", "TRITON_ATTN_DIFFKV", "TRITON_FLASH_ATTN", "ROCM_ATTN",
    "ROCM_SEGMENTED_ATTN", "ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "ROCM_AITER_FA", "ROCM_AITER_MLA_SPARSE",
    "XPU_MLA_SPARSE", "TORCH_SDPA", "FLASHINFER", "TRITON_FLASHINFER", "FLASHINFER_MLA", "TOKENSPEED_MLA",
    "FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120", "FLASHINFER_MLA_SPARSE_SM90", "TRITON_MLA", "CUTLASS_MLA",
    "FLASHMLA", "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4", "ROCM_FLASHMLA_SPARSE_DSV4",
    "FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41", "ROCM_FLASHMLA_SPARSE_DSV41", "FLASHMLA_MEGA_ATTN_DSV41",
    "B12X", "FLASH_ATTN_MLA", "FLASH_ATTN_MLA_SPARSE", "FLASH_ATTN_MLA_SPARSE_FA4", "MINIMAX_M3_SPARSE", "CUTLASS_MSA",
    "TRITON_MSA", "STEP5_DSA", "NO_ATTENTION", "FLEX_ATTENTION", "HPC_ATTN", "ROCM_AITER_UNIFIED_ATTN", "CPU_ATTN",
    "CPU_MLA", "AMX_MLA", "TURBOQUANT", "ROCM_OCTAVE", "ULTRAQUANT", "CUSTOM",
)  # fmt: skip
# SGLang's --attention-backend choices (ATTENTION_BACKEND_CHOICES); its draft backend takes any
# string at parse time and is checked later against DRAFT_ATTENTION_BACKEND_CHOICES.
SGLANG_ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4", "flashinfer",
    "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha", "hpc_ops",
    "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)  # fmt: skip
SGLANG_DRAFT_ATTENTION_BACKENDS: tuple[str, ...] = (
    "flashinfer", "fa3", "fa4", "triton", "ascend", "trtllm_mha", "intel_xpu",
)  # fmt: skip

# KV-cache dtypes: vLLM's CacheDType; SGLang's --kv-cache-dtype and --speculative-draft-kv-cache-dtype choices.
VLLM_KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3",
    "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head",
    "nvfp4", "nvfp4_4over6",
)  # fmt: skip
SGLANG_KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
)  # fmt: skip
SGLANG_DRAFT_KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16")

# One value in the inventory, said in each engine's words: vLLM's `fp8` is e4m3 on CUDA, a word
# SGLang refuses (it wants fp8_e4m3). A value not listed here is taken as the engine's own word.
_KV_SYNONYMS: dict[str, dict[str, str]] = {
    "fp8": {"vllm": "fp8", "sglang": "fp8_e4m3"},
    "bf16": {"vllm": "bfloat16", "sglang": "bf16"},
}

# The architectures SGLang's --language-model-only admits (ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES,
# checked in arg_groups/model_hook.py at start-up): any other model, Kimi-K2.5 among them, makes the engine
# refuse to start with "--language-model-only does not support [...]". vLLM's flag takes any model.
SGLANG_LANGUAGE_MODEL_ONLY_ARCHITECTURES: tuple[str, ...] = (
    "DeepseekV4ForCausalLM", "MuseGlimmerForConditionalGeneration", "Cosmos3ForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration",
)  # fmt: skip

# vLLM's MultiModalConfig.mm_encoder_tp_mode; SGLang says `data` as --mm-enable-dp-encoder.
ENCODER_TP_MODES: tuple[str, ...] = ("weights", "data")

# The PCIe all-reduce opt-ins (FlashInfer's PCIe IPC all-reduce; TP 2/4/8, off by default in both).
PCIE_ALLREDUCE_ENV: dict[str, str] = {
    "vllm": "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
    "sglang": "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
}

# vLLM's one speculative config, and its short form: a knob with a key in it owns both.
VLLM_SPECULATIVE_FLAGS: tuple[str, ...] = ("--speculative-config", "-sc")
# The speculative-config keys vLLM's SpeculativeConfig takes that we render.
VLLM_SPECULATIVE_KEYS: tuple[str, ...] = (
    "method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "attention_backend", "kv_cache_dtype",
    "num_speculative_tokens_per_batch_size",
)  # fmt: skip


def attention_backends(engine: str, draft: bool = False) -> tuple[str, ...]:
    if engine == "vllm":
        return VLLM_ATTENTION_BACKENDS
    return SGLANG_DRAFT_ATTENTION_BACKENDS if draft else SGLANG_ATTENTION_BACKENDS


def attention_backend(engine: str, value: str, draft: bool = False) -> str | None:
    """VALUE in ENGINE's words (vLLM upper-cases it, as its parser does), or None: it has no such backend."""
    word = value.upper() if engine == "vllm" else value
    return word if word in attention_backends(engine, draft) else None


def kv_cache_dtypes(engine: str, draft: bool = False) -> tuple[str, ...]:
    if engine == "vllm":
        return VLLM_KV_CACHE_DTYPES
    return SGLANG_DRAFT_KV_CACHE_DTYPES if draft else SGLANG_KV_CACHE_DTYPES


def kv_cache_dtype(engine: str, value: str, draft: bool = False) -> str | None:
    """VALUE in ENGINE's words (fp8 -> fp8_e4m3 for SGLang), or None: the engine has no such dtype."""
    word = _KV_SYNONYMS.get(value, {}).get(engine, value)
    return word if word in kv_cache_dtypes(engine, draft) else None


def unknown(engine: str, kind: str, value: str, draft: bool = False) -> str | None:
    """Why VALUE is no KIND ("attention backend", "KV-cache dtype") of ENGINE's, with its own list; None if it is."""
    word, known = (
        (attention_backend(engine, value, draft), attention_backends(engine, draft))
        if kind == "attention backend"
        else (kv_cache_dtype(engine, value, draft), kv_cache_dtypes(engine, draft))
    )
    if word is not None:
        return None
    name = "vLLM" if engine == "vllm" else "SGLang"
    return f"{name} has no such {'draft ' if draft else ''}{kind} (its own: {', '.join(known)})"


# Environment variables the pinned engine no longer reads: refused in serving_env, naming what does
# it now (specdeploy.serve.schema.OWNED_ENV adds those a knob sets).
UNREAD_ENV: dict[str, str] = {
    # vLLM 0.33 reads no VLLM_ATTENTION_BACKEND: it warns "Unknown vLLM environment variable" and ignores it.
    "VLLM_ATTENTION_BACKEND": "serving_attention_backend (vLLM 0.33 reads no such variable: --attention-backend)",
}


# Why an engine has no words for a knob, in its own words (schema.unsaid_problems says it with the refusal).
UNSAID_WHY: dict[tuple[str, str], str] = {
    # sglang 0.5.23 arg_groups/fields/spec.py: --speculative-adaptive's help, and --speculative-adaptive-config
    # "Path to a JSON config file for adaptive speculative decoding tuning knobs" (adaptive_spec_params.py:
    # batch-size slots as lower bounds, rounded up to a captured CUDA-graph batch size, an acceptance EMA
    # choosing among each slot's candidate steps).
    ("sglang", "speculative_schedule"): (
        "SGLang 0.5.23 has no draft length per batch-size range in its flags: --speculative-adaptive "
        '"dynamically adjusts num_steps based on acceptance rate", from a JSON file of batch-size slots that it '
        "rounds up to its CUDA-graph batch sizes, which specdeploy does not render"
    ),
}
