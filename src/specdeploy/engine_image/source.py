"""The specdeploy package that goes into every engine image: its digest from the source files
(no wheel built just to hash it), and its wheel, built once per digest and cached."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import specdeploy
from specdeploy.errors import SpecdeployError
from specdeploy.paths import project_root, state_dir

PACKAGE_DIR = Path(specdeploy.__file__).resolve().parent
# A fixed SOURCE_DATE_EPOCH gives the same wheel bytes for the same source.
_REPRODUCIBLE = {"SOURCE_DATE_EPOCH": "315532800"}


def _shipped_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")  # fmt: skip


def package_digest() -> str:
    """sha256 over the package's files and the project metadata: what the wheel is made from."""
    digest = hashlib.sha256()
    pyproject = project_root() / "pyproject.toml"
    if pyproject.is_file():
        digest.update(pyproject.read_bytes())
    for path in _shipped_files():
        digest.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes())
    return "sha256:" + digest.hexdigest()


def specdeploy_wheel() -> Path:
    """This checkout as a wheel, built only when package_digest() is new."""
    root = project_root()
    if not (root / "pyproject.toml").is_file() or not (root / "src" / "specdeploy").is_dir():
        raise SpecdeployError(
            "building an engine image needs the specdeploy source tree, which this install lacks",
            hint="set engine_image_specdeploy_wheel to a specdeploy wheel, or run from a checkout",
        )
    cache = state_dir() / "specdeploy-wheels" / package_digest()[7:23]
    found = sorted(cache.glob("specdeploy-*.whl"))
    if found:
        return found[0]
    state_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        # From a clean copy of what the wheel is made of: setuptools' build/ folder in a checkout
        # keeps files that were moved away, and would ship them.
        tree = Path(tmp) / "tree"
        shutil.copytree(root / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(root / name, tree / name)
        cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp, str(tree)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **_REPRODUCIBLE}, check=False)
        built = sorted(Path(tmp).glob("specdeploy-*.whl"))
        if proc.returncode != 0 or not built:
            raise SpecdeployError(f"building the specdeploy wheel failed: {proc.stderr.strip()[-800:]}")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.move(built[0], cache / built[0].name)
    return cache / built[0].name
