"""Whether the pinned SGLang's kernel package carries SM120 code, library by library, read from its
shared objects with cuobjdump; the build decision (keep the wheel or build it from source) and the
serving advice that follows (attention backends set explicitly when FA3/FlashMLA lack SM120).

Runs on the controller (tests, on the real wheel) and inside the image's sgl-kernel stage:
`python -m specdeploy.engine_image.sgl_kernel --package-dir DIR [--mode auto] [--cuobjdump PATH]`
exits 0 to keep the installed package, 10 to build it. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODES = ("auto", "always", "never")
BUILD_EXIT = 10
_ARCH = re.compile(r"\bsm_(\d+)([a-z]?)\b")
# The libraries whose kernels the attention backends use; without SM120 code they cannot run there.
ATTENTION_LIBRARIES = {"flash_ops": "fa3", "flashmla_ops": "flashmla"}
SM120_ATTENTION_BACKEND = "triton"  # JIT-compiled for the GPU at hand: needs no sgl-kernel attention code


def find_cuobjdump() -> Path:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel (nvidia/cu*/bin/, not on PATH), else PATH's."""
    for entry in map(Path, sys.path):
        for candidate in sorted(entry.glob("nvidia/cu*/bin/cuobjdump")):
            return candidate
    found = shutil.which("cuobjdump")
    if found is None:
        raise FileNotFoundError("no cuobjdump: pip install nvidia-cuda-cuobjdump, or put cuobjdump on PATH")
    return Path(found)


def elf_arches(cuobjdump: Path, library: Path) -> list[str]:
    """The sm_XX(a) targets of the ELF (cubin) images inside LIBRARY."""
    proc = subprocess.run([str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True, check=False)
    return sorted({f"sm_{m[1]}{m[2]}" for m in _ARCH.finditer(proc.stdout)})


def _has_sm120(arches: list[str]) -> bool:
    return any(a.startswith("sm_120") for a in arches)


@dataclass
class KernelReport:
    libraries: dict[str, list[str]]  # relative path -> arches
    mode: str = "auto"
    action: str = ""  # keep | build
    reasons: list[str] = field(default_factory=list)
    advice: dict[str, str] = field(default_factory=dict)  # serving flags for SM120

    def lines(self) -> list[str]:
        out = [f"{name}: {'sm_120 present' if _has_sm120(a) else 'NO sm_120'} ({', '.join(a) or 'no ELF'})"
               for name, a in sorted(self.libraries.items())]  # fmt: skip
        return [*out, f"decision ({self.mode}): {self.action}: {'; '.join(self.reasons)}"]


def decide(libraries: dict[str, list[str]], mode: str = "auto") -> KernelReport:
    """keep when a common_ops library has SM120 code (mode auto); the attention libraries that lack it
    turn into serving advice, not a rebuild (the source build gives them no SM120 code either)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
    report = KernelReport(libraries, mode)
    common = {n: a for n, a in libraries.items() if Path(n).name.startswith("common_ops")}
    common_ok = any(_has_sm120(a) for a in common.values())
    if mode == "always":
        report.action, report.reasons = "build", ["sgl_kernel_build: always"]
    elif mode == "never":
        report.action, report.reasons = "keep", ["sgl_kernel_build: never"]
    elif common_ok:
        report.action = "keep"
        report.reasons = [f"{', '.join(sorted(n for n, a in common.items() if _has_sm120(a)))} carries sm_120 code"]
    else:
        report.action = "build"
        report.reasons = [f"no common_ops library carries sm_120 code ({', '.join(sorted(common)) or 'none found'})"]
    lacking = sorted(n for n, a in libraries.items() if Path(n).name.split(".")[0] in ATTENTION_LIBRARIES
                     and not _has_sm120(a))  # fmt: skip
    if lacking:
        backends = ", ".join(ATTENTION_LIBRARIES[Path(n).name.split(".")[0]] for n in lacking)
        report.advice = {
            "attention_backend": SM120_ATTENTION_BACKEND,
            "speculative_draft_attention_backend": SM120_ATTENTION_BACKEND,
            "reason": f"{', '.join(lacking)} carry no sm_120 code, so the {backends} backends cannot run on SM120: "
                      f"set --attention-backend and --speculative-draft-attention-backend to {SM120_ATTENTION_BACKEND}",
        }  # fmt: skip
    return report


def libraries_in(root: Path, cuobjdump: Path) -> dict[str, list[str]]:
    return {str(so.relative_to(root)): elf_arches(cuobjdump, so) for so in sorted(root.rglob("*.so"))}


def wheel_report(wheel: Path, cuobjdump: Path, mode: str = "auto") -> KernelReport:
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp, [n for n in archive.namelist() if n.endswith(".so")])
        return decide(libraries_in(Path(tmp), cuobjdump), mode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.engine_image.sgl_kernel")
    parser.add_argument("--cuobjdump", type=Path, help="default: the nvidia-cuda-cuobjdump wheel's, else PATH's")
    parser.add_argument("--package-dir", type=Path, help="an installed sgl_kernel package folder")
    parser.add_argument("--wheel", type=Path, help="or a wheel")
    parser.add_argument("--mode", choices=MODES, default="auto")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.cuobjdump = args.cuobjdump or find_cuobjdump()
    if args.wheel:
        report = wheel_report(args.wheel, args.cuobjdump, args.mode)
    else:
        report = decide(libraries_in(args.package_dir, args.cuobjdump), args.mode)
    print(json.dumps(asdict(report)) if args.json else "\n".join(report.lines()))
    return BUILD_EXIT if report.action == "build" else 0


if __name__ == "__main__":
    sys.exit(main())
