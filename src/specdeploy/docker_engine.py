"""Make sure a Docker engine answers on this machine: install it, start it, or explain why not."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from docker.client import DockerClient
from docker.errors import DockerException

from specdeploy.controller_packages import ensure_command
from specdeploy.errors import SpecdeployError

SOCKET = Path("/var/run/docker.sock")
START_TIMEOUT_S = 60


def _is_root() -> bool:
    return os.geteuid() == 0


def connect() -> DockerClient | None:
    """A client for a running engine, None when none runs; a clear error on a permission problem."""
    try:
        client = DockerClient.from_env(timeout=120)
        client.ping()
        return client
    except DockerException as exc:
        if "Permission denied" in str(exc) or "PermissionError" in str(exc):
            raise SpecdeployError(
                f"no permission to use the Docker engine at {SOCKET} as user {os.getuid()}",
                hint="add your user to the 'docker' group (sudo usermod -aG docker $USER, then log in "
                "again) or run this as root",
            ) from exc
        return None


def _start_dockerd(log_path: Path) -> None:
    if not _is_root():
        raise SpecdeployError(
            "the Docker engine is installed but not running",
            hint="start it as root: systemctl start docker (or: dockerd &)",
        )
    if Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "start", "docker"], check=False, capture_output=True)
        return
    # No init system here (CI containers, sandboxes): run dockerd detached, logging to state.
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def ensure_engine(state: Path) -> DockerClient:
    """Return a client to a running engine, installing docker.io and starting dockerd as needed."""
    client = connect()
    if client is not None:
        return client
    if os.environ.get("DOCKER_HOST"):
        raise SpecdeployError(f"the Docker engine at DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer")
    if shutil.which("dockerd") is None:
        ensure_command("dockerd", "docker.io")
    log_path = state / "dockerd.log"
    _start_dockerd(log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        client = connect()
        if client is not None:
            return client
        time.sleep(0.5)
    raise SpecdeployError(f"dockerd did not answer within {START_TIMEOUT_S} s", hint=f"read its log: {log_path}")
