"""Debian packages the controller itself needs (docker.io, debootstrap, openssh-client),
installed on first use so `make deploy` / `make test` work on a fresh machine."""

from __future__ import annotations

import os
import shutil
import subprocess

from specdeploy.errors import SpecdeployError


def ensure_command(command: str, package: str) -> None:
    """Install `package` with apt when `command` is missing; explain what to do when we cannot."""
    if shutil.which(command):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SpecdeployError(f"`{command}` is not installed", hint=f"install it as root: apt-get install -y {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SpecdeployError(f"{' '.join(cmd)} failed: {result.stderr.strip()[-500:]}")
