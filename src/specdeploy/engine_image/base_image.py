"""The plain Debian 12 base image of the vllm-cpu profile, made with debootstrap + docker import:
no container registry is reachable from the hosts this runs on (air-gapped sites, this CI)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from docker.client import DockerClient
from docker.errors import NotFound
from rich.console import Console

from specdeploy.controller_packages import ensure_command
from specdeploy.engine_image.profiles import BASE_IMAGE
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir

DEBIAN_MIRROR = os.environ.get("SPECDEPLOY_DEBIAN_MIRROR", "http://deb.debian.org/debian")

console = Console(stderr=True, highlight=False)


@contextmanager
def step(text: str) -> Iterator[None]:
    """A spinner with the elapsed time for each slow step, and its duration once done."""
    start = time.monotonic()
    with console.status(f"{text} ..."):
        yield
    console.print(f"[green]✓[/] {text} [dim]({time.monotonic() - start:.1f} s)[/]")


def ensure_base_image(client: DockerClient) -> str:
    """A minimal Debian 12 image made with debootstrap, since no registry can be reached."""
    try:
        return str(client.images.get(BASE_IMAGE).id)
    except NotFound:
        pass
    if os.geteuid() != 0:
        raise SpecdeployError("building the Debian base image needs root (debootstrap)", hint="run as root")
    ensure_command("debootstrap", "debootstrap")
    with (
        step(f"Building {BASE_IMAGE} with debootstrap (about 40 s, once)"),
        tempfile.TemporaryDirectory(dir=state_dir()) as tmp,
    ):
        rootfs = Path(tmp) / "rootfs"
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SpecdeployError(f"debootstrap failed: {result.stdout[-800:]}{result.stderr[-800:]}")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", BASE_IMAGE],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise SpecdeployError(f"docker import of the base image failed: {imported.stderr.strip()}")
    return str(client.images.get(BASE_IMAGE).id)
