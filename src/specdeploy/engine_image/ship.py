"""Moving images between engines without a registry (none is reachable): docker save | ssh docker load."""

from __future__ import annotations

import subprocess

from specdeploy.connection import CommandHost
from specdeploy.errors import SpecdeployError


def ship_image(tag: str, source: CommandHost, destination: CommandHost) -> bool:
    """Copy TAG unless the destination has it with the same id. Returns True when it copied.

    The CLI through OpenSSH, not the SDK: paramiko moves multi-GB images several times slower.
    """
    wanted = source.inspect(tag)
    if not wanted:
        raise SpecdeployError(f"image {tag} is not on {source}")
    if destination.inspect(tag) == wanted:
        return False
    with subprocess.Popen(source.command("docker", "save", tag), stdout=subprocess.PIPE) as save:
        load = subprocess.run(destination.command("docker", "load"), stdin=save.stdout, capture_output=True,
                              text=True, check=False)  # fmt: skip
        save.wait()
    if save.returncode != 0 or load.returncode != 0:
        raise SpecdeployError(f"shipping {tag} from {source} to {destination} failed: {load.stderr.strip()[-500:]}")
    if destination.inspect(tag) != wanted:
        raise SpecdeployError(f"loading {tag} on {destination} did not produce the same image id")
    return True
