"""One connection to a host, for every action: the SSH settings Ansible uses (host keys verified),
the `docker` CLI over OpenSSH (CommandHost), one Docker SDK client and the API port forward.

docker-py's paramiko transport loads only ~/.ssh/known_hosts and rejects unknown keys; the adapter
here adds the given known_hosts files (e.g. the test bed's) and identity before it connects.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from docker.client import DockerClient
from docker.transport.sshconn import SSHHTTPAdapter

from specdeploy import names, proof
from specdeploy.errors import SpecdeployError
from specdeploy.targets import Forward, SshSettings, Target, from_hostvars, ssh_command

SSH_ROUND_S = 30.0  # connecting and starting python3 there, on a slow link


@dataclass(frozen=True)
class CommandHost:
    """Runs commands (the `docker` CLI, du, cat) on TARGET over SSH (host keys verified), or here when None."""

    target: Target | None = None
    ssh: SshSettings = field(default_factory=SshSettings)

    def command(self, *argv: str) -> list[str]:
        if self.target is None:
            return list(argv)
        return ssh_command(self.target, self.ssh, *(shlex.quote(a) for a in argv))

    def as_root(self, *argv: str) -> list[str]:
        """ARGV as root on the host: directly when the SSH user is root, else through `sudo -n`."""
        return self.command("sh", "-c", proof.as_root(*argv))

    def prove_serving(
        self,
        container: str = names.ENGINE_CONTAINER,
        state_dir: str = names.SERVING_STATE_DIR,
        timeout_s: float = proof.PROOF_TIMEOUT_S,
    ) -> proof.Proof:
        """specdeploy.proof run on the host (one SSH round): a bounded completion and the engine's
        process states. A host that does not answer within the proof's own bounds is named, not waited on."""
        cmd = self.as_root("python3", "-c", proof.on_host_script(), container, state_dir, str(timeout_s))
        bound = timeout_s + proof.STUCK_D_S + proof.DOCKER_TIMEOUT_S + SSH_ROUND_S  # its one docker call
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=bound, check=False)
        except subprocess.TimeoutExpired:
            return proof.Proof(
                False, f"{self}: the proof of serving got no answer in {bound:.0f} s (SSH or the host hangs)"
            )
        lines = done.stdout.strip().splitlines()
        try:
            return proof.Proof.from_json(lines[-1])
        except (IndexError, ValueError, KeyError):
            why = done.stderr.strip()[-300:] or f"exit {done.returncode}"
            return proof.Proof(False, f"{self}: the proof of serving could not run: {why}")

    def inspect(self, tag: str, fmt: str = "{{.Id}}") -> str:
        """A field of image TAG; empty when there is no such image."""
        cmd = self.command("docker", "image", "inspect", "--format", fmt, tag)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def __str__(self) -> str:
        return str(self.target) if self.target else "this machine"


class _VerifiedSSHAdapter(SSHHTTPAdapter):  # type: ignore[misc]
    known_hosts: tuple[Path, ...] = ()
    identity: Path | None = None

    def _connect(self) -> None:
        for path in self.known_hosts:
            if path.is_file():
                self.ssh_client.load_host_keys(str(path))
        if self.identity is not None:
            self.ssh_params["key_filename"] = str(self.identity)
            self.ssh_params["look_for_keys"] = False
        super()._connect()


def docker_client(
    docker_host: str | None, known_hosts: tuple[Path, ...] = (), identity: Path | None = None
) -> DockerClient:
    if not docker_host:
        return DockerClient.from_env()
    if not docker_host.startswith("ssh://"):
        return DockerClient(base_url=docker_host)
    adapter_cls: Any = type("Adapter", (_VerifiedSSHAdapter,), {"known_hosts": known_hosts, "identity": identity})
    import docker.api.client as api_client  # noqa: PLC0415

    original = api_client.SSHHTTPAdapter
    api_client.SSHHTTPAdapter = adapter_cls  # the SDK builds its adapter by this name
    try:
        return DockerClient(base_url=docker_host, use_ssh_client=False, timeout=120)
    except Exception as exc:
        raise SpecdeployError(f"cannot reach the Docker engine at {docker_host}: {exc}") from exc
    finally:
        api_client.SSHHTTPAdapter = original


def docker_client_for(target: Target, ssh: SshSettings) -> DockerClient:
    """The Docker engine on an SSH target, with the same host keys and identity as Ansible."""
    user = f"{target.user}@" if target.user else ""
    return docker_client(f"ssh://{user}{target.host}:{target.port}", ssh.known_hosts, ssh.identity_file)


class HostConnection:
    """Everything an action needs to reach one inventory host, built once from its hostvars."""

    def __init__(self, target: Target, ssh: SshSettings) -> None:
        self.target, self.ssh = target, ssh

    @classmethod
    def from_hostvars(cls, hostvars: Mapping[str, Any]) -> HostConnection:
        return cls(*from_hostvars(hostvars))

    @cached_property
    def commands(self) -> CommandHost:
        """The `docker` CLI (and du, cat) on the host over OpenSSH: bulk transfers, records."""
        return CommandHost(self.target, self.ssh)

    @cached_property
    def docker(self) -> DockerClient:
        """One Docker SDK client (paramiko) for container state, logs and exec."""
        return docker_client_for(self.target, self.ssh)

    def reconnect_docker(self) -> DockerClient:
        """A new SDK client in place of the cached one (after its SSH session died)."""
        self.__dict__["docker"] = docker_client_for(self.target, self.ssh)
        return self.docker

    def forward(self, remote_port: int, local_port: int = 0) -> Forward:
        """A restartable local forward to REMOTE_PORT on the host's loopback (LOCAL_PORT 0: any free)."""
        return Forward(self.target, self.ssh, remote_port, local_port)

    def __str__(self) -> str:
        return str(self.target)
