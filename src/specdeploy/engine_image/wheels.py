"""Real engine wheels from PyPI, cached under .state/, and their Python sources extracted.

Patch sets are tested against these, never against copies kept in the repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
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
    pip_download([f"{distribution}=={version}"], dest, no_deps=True)
    found = sorted(dest.glob(pattern))
    if not found:
        raise SpecdeployError(f"pip download {distribution}=={version} gave no {pattern}")
    return found[0]


def pip_download(requirements: list[str], dest: Path, python_version: str | None = None, no_deps: bool = False) -> None:
    """`pip download` into DEST; for another PYTHON_VERSION, binary wheels of manylinux x86_64."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), *requirements]
    cmd += ["--no-deps"] if no_deps else []
    if python_version and python_version != f"{sys.version_info.major}.{sys.version_info.minor}":
        cmd += ["--only-binary=:all:", "--python-version", python_version,
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SpecdeployError(f"pip download {' '.join(requirements)} failed: {proc.stderr.strip()[-800:]}")


def deterministic_tar(folder: Path, out: Path) -> None:
    """One file, same bytes for the same wheels: copied (and checksummed) once, not 150 times."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.iterdir()):
            info = tar.gettarinfo(str(path), arcname=path.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as fh:
                tar.addfile(info, fh)


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """One process at a time past this point, across processes (an fcntl lock on LOCK)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wheelhouse_tar(name: str, requirements: list[str], python_version: str | None = None) -> Path:
    """A tar of the wheels REQUIREMENTS resolve to, made once under .state/wheelhouses: one file to
    copy to a host that installs with --no-index (no index reachable, or a TLS proxy it distrusts).
    Made under a lock: the fleet's hosts ask for it at once (three writers of one partial file made
    a torn tar on the test bed), and the others then find it made."""
    out = state_dir() / "wheelhouses" / f"{name}.tar"
    with exclusive(out.with_suffix(".lock")):
        if not out.is_file():
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
                wheels = Path(tmp) / "wheels"
                pip_download(requirements, wheels, python_version)
                partial = Path(tmp) / out.name
                deterministic_tar(wheels, partial)
                partial.rename(out)
    return out


def place(made: Path, dest: Path) -> None:
    """DEST holds MADE's bytes: a hard link on the same filesystem (a 0.9 GB wheelhouse is not copied
    again), else a copy. Never written to in place, so the link cannot change MADE."""
    dest.unlink(missing_ok=True)
    try:
        os.link(made, dest)
    except OSError:
        shutil.copyfile(made, dest)


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
