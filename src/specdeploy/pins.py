"""The versions specdeploy installs, read from pins.yaml beside this module (the one pins file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

PINS: dict[str, Any] = yaml.safe_load((Path(__file__).parent / "pins.yaml").read_text())

VLLM_CUDA: str = PINS["engines"]["vllm_cuda"]
VLLM_CPU: str = PINS["engines"]["vllm_cpu"]
SGLANG_CUDA: str = PINS["engines"]["sglang_cuda"]
VLLM_CPU_PATCHED_RUNTIME: str = PINS["patched_runtime"]["vllm_cpu"]
TORCH_PATCHED_RUNTIME: str = PINS["patched_runtime"]["torch"]
PY_SPY: str = PINS["tools"]["py_spy"]
CUOBJDUMP: str = PINS["tools"]["cuobjdump"]
UV: str = PINS["tools"]["uv"]
LOADERS: dict[str, str] = PINS["loaders"]
HOST: dict[str, Any] = PINS["host"]


def host_pin(variable: str) -> Any:
    """A provision role variable's pinned default, by the variable's name."""
    if variable not in HOST:
        raise KeyError(f"{variable} is not pinned in specdeploy/pins.yaml (pinned: {', '.join(HOST)})")
    return HOST[variable]
