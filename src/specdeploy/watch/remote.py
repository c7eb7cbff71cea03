"""Watch an engine container on a remote host: Docker SDK over SSH for state and logs, an SSH
port forward for readiness (the API binds the host's loopback by default)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from docker.errors import NotFound

from specdeploy.errors import SpecdeployError
from specdeploy.remote_docker import docker_client_for
from specdeploy.targets import forward_port, from_hostvars
from specdeploy.watch.sources import ContainerSource
from specdeploy.watch.watchdog import Verdict, Watch, WatchOptions


def watch_container_on_host(
    hostvars: Mapping[str, Any], container: str, api_port: int | None, options: WatchOptions
) -> Verdict:
    target, ssh = from_hostvars(hostvars)
    client = docker_client_for(target, ssh)
    try:
        source = ContainerSource(client.containers.get(container))
    except NotFound as exc:
        raise SpecdeployError(f"no container {container!r} on {target}") from exc
    with ExitStack() as stack:
        if api_port is not None:
            local = stack.enter_context(forward_port(target, ssh, api_port))
            options.url = f"http://127.0.0.1:{local}"
        return Watch(source, options).run()


def diagnostics_root(state: Path, inventory_hostname: str) -> Path:
    return state / "runs" / inventory_hostname
