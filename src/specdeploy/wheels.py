"""Real engine wheels from PyPI, cached under .state/, and their Python sources extracted.

Patch sets are tested against these, never against copies kept in the repository.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir


def wheel_cache() -> Path:
    return state_dir() / "wheels"


def download(distribution: str, version: str, dest: Path | None = None) -> Path:
    """`pip download --no-deps DIST==VERSION`, reusing a wheel already in the cache."""
    dest = dest or wheel_cache()
    dest.mkdir(parents=True, exist_ok=True)
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{distribution}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(dest.glob(pattern))
    if proc.returncode != 0 or not found:
        raise SpecdeployError(f"pip download {distribution}=={version} failed: {proc.stderr.strip()[-400:]}")
    return found[0]


def extract_sources(wheel: Path, dest: Path) -> Path:
    """Extract the wheel's .py files and dist-info (not its multi-GB binaries) into a site-packages."""
    marker = dest / ".specdeploy-extracted"
    if marker.is_file() and marker.read_text() == wheel.name:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.endswith(".py") or ".dist-info/" in n]
        archive.extractall(tmp, members)
    (tmp / ".specdeploy-extracted").write_text(wheel.name)
    tmp.rename(dest)
    return dest


def release_sources(distribution: str, version: str) -> Path:
    wheel = download(distribution, version)
    return extract_sources(wheel, state_dir() / "engines" / f"{distribution}-{version}" / "site-packages")
