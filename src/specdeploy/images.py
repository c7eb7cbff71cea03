"""Where the `docker` CLI runs (this machine, or a target over SSH), and moving images between
engines without a registry (none is reachable): docker save | ssh docker load."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field

from specdeploy.errors import SpecdeployError
from specdeploy.targets import SshSettings, Target, ssh_command


@dataclass(frozen=True)
class CommandHost:
    """Runs commands (the `docker` CLI, du, cat) on TARGET over SSH (host keys verified), or here when None."""

    target: Target | None = None
    ssh: SshSettings = field(default_factory=SshSettings)

    def command(self, *argv: str) -> list[str]:
        if self.target is None:
            return list(argv)
        return ssh_command(self.target, self.ssh, *(shlex.quote(a) for a in argv))

    def inspect(self, tag: str, fmt: str = "{{.Id}}") -> str:
        """A field of image TAG; empty when there is no such image."""
        cmd = self.command("docker", "image", "inspect", "--format", fmt, tag)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def __str__(self) -> str:
        return str(self.target) if self.target else "this machine"


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
