"""FlashInfer's ahead-of-time kernels in the engine image (`engine_image_flashinfer_kernels`).

vLLM 0.33 requires flashinfer-python but not its kernel packages, and they are not on PyPI for the
version it pins (flashinfer-cubin stops at 0.6.13 there, flashinfer-jit-cache is not published
there; docs/engine-facts.md): an image built from PyPI alone carries none, and a GPU host without
internet then fails at the first request that needs one. Three ways, said in the inventory:
- "" (default): none baked in; the build log says so (engine_side.flashinfer_kernels);
- "download": vLLM's own `vllm download-kernels` at build time (the build host must reach
  FlashInfer's artifact host);
- a folder on the controller holding the kernel wheels of the pinned FlashInfer version (from an
  operator's mirror): installed with --no-index, their version checked against flashinfer-python's.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from specdeploy.engine_image.profiles import Profile
from specdeploy.errors import SpecdeployError

CONTEXT_FOLDER = "flashinfer-kernels"  # in the build context; empty when nothing is baked in
DOWNLOAD = "download"
WHEEL_PREFIXES = ("flashinfer_cubin-", "flashinfer_jit_cache-")
HINT = ("put the flashinfer-cubin / flashinfer-jit-cache wheels of the engine's FlashInfer version in a folder "
        "and set engine_image_flashinfer_kernels to it, or 'download' where the build host reaches FlashInfer's "
        "artifact host")  # fmt: skip


def wheels(choice: str) -> list[Path]:
    """The kernel wheels in the folder CHOICE names; refused before any build when there are none."""
    folder = Path(choice)
    if not folder.is_dir():
        raise SpecdeployError(f"engine_image_flashinfer_kernels={choice!r} is neither 'download' nor a folder",
                              hint=HINT)  # fmt: skip
    found = sorted(p for p in folder.glob("*.whl") if p.name.startswith(WHEEL_PREFIXES))
    if not found:
        raise SpecdeployError(f"{folder} holds no flashinfer_cubin-*.whl or flashinfer_jit_cache-*.whl", hint=HINT)
    return found


def problems(prof: Profile, choice: str) -> list[str]:
    if not choice:
        return []
    if not prof.gpu:
        return [f"engine_image_flashinfer_kernels: {prof.name} is a CPU build; FlashInfer's kernels are CUDA's"]
    if choice == DOWNLOAD and prof.engine != "vllm":
        return [f"engine_image_flashinfer_kernels: download runs `vllm download-kernels`, which {prof.name} lacks; "
                "give a folder of the kernel wheels instead"]  # fmt: skip
    return []


def mode(choice: str) -> str:
    """How the Dockerfile bakes them in: "" (not at all), "download" or "folder"."""
    return choice if choice in ("", DOWNLOAD) else "folder"


def fill(dest: Path, choice: str) -> str:
    """Put the chosen wheels into the context's folder; their digest, for the inputs. A converged run
    copies nothing (a jit-cache wheel is GBs): the folder is refilled only when the digest changed."""
    folder = dest / CONTEXT_FOLDER
    found = [] if choice in ("", DOWNLOAD) else wheels(choice)
    digest = hashlib.sha256()
    for wheel in found:  # names and sizes, not GBs of bytes hashed on every converged run
        digest.update(f"{wheel.name} {wheel.stat().st_size}\n".encode())
    kept = "sha256:" + digest.hexdigest() if found else choice
    marker = dest.parent / f".{dest.name}.flashinfer"
    if folder.is_dir() and marker.is_file() and marker.read_text() == kept:
        return kept
    marker.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for wheel in found:
        shutil.copy2(wheel, folder / wheel.name)
    marker.write_text(kept)
    return kept
