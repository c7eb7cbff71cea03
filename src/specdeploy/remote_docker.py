"""Docker SDK clients for a local engine or `ssh://user@host[:port]`, with host keys verified.

docker-py's paramiko transport loads only ~/.ssh/known_hosts and rejects unknown keys; this
adds the given known_hosts files (e.g. the test bed's) and identity before it connects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docker.client import DockerClient
from docker.transport.sshconn import SSHHTTPAdapter

from specdeploy.errors import SpecdeployError
from specdeploy.targets import SshSettings, Target


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
