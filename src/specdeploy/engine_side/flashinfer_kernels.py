"""Run with the engine's own interpreter inside the image build: which FlashInfer kernels the image
carries, and that they are the engine's FlashInfer version (FlashInfer refuses other versions at run
time). Standard library only: it runs beside the engine, not in specdeploy's venv.

vLLM 0.33 requires flashinfer-python but not its ahead-of-time kernels (flashinfer-cubin,
flashinfer-jit-cache); without them a kernel is compiled (nvcc) or fetched at its first use, which an
air-gapped host cannot do, long after READY. Printed in the build log, so the image says what it holds.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from pathlib import Path

FLASHINFER = "flashinfer-python"
KERNELS = ("flashinfer-cubin", "flashinfer-jit-cache")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _files(name: str) -> int:
    """How many kernel files (cubins, shared objects) the distribution holds."""
    files = importlib.metadata.files(name) or []
    return sum(1 for f in files if Path(str(f)).suffix in (".cubin", ".so"))


def report(version_of: Callable[[str], str | None] = _installed,
           files_of: Callable[[str], int] = _files) -> tuple[list[str], list[str]]:  # fmt: skip
    """(lines to print, problems): the FlashInfer version, each kernel package with its file count."""
    flashinfer = version_of(FLASHINFER)
    if flashinfer is None:
        return [f"FlashInfer: {FLASHINFER} is not installed (no FlashInfer kernels to carry)"], []
    base = flashinfer.split("+")[0]
    lines, problems = [f"FlashInfer: {FLASHINFER} {flashinfer}"], []
    for name in KERNELS:
        version = version_of(name)
        if version is None:
            lines.append(f"  {name}: not carried")
            continue
        lines.append(f"  {name} {version}: {files_of(name)} kernel files")
        if version.split("+")[0] != base:
            problems.append(f"{name} {version} is not FlashInfer {base}'s: FlashInfer refuses it at run time")
    if not any(version_of(name) for name in KERNELS):
        lines.append(
            "  no ahead-of-time kernels: each is compiled (nvcc) or downloaded at its first use, which a "
            "host without internet cannot do; set engine_image_flashinfer_kernels (docs/engine-image.md)"
        )
    return lines, problems


def main() -> int:
    lines, problems = report()
    print("\n".join(lines))
    for problem in problems:
        print(f"✗ {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
