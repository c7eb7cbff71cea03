"""Where the test bed is: its state folder (SSH key, known_hosts, inventory), its hosts' names and
ports, and the user the deploy logs in as. Both the test bed (`testbed`, whose callers still find
these names there) and the fleet on it (`fleet`) read them here, so the fleet need not import the
test bed that imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.paths import project_root, state_dir
from specdeploy.targets import SshSettings

SSH_USER = "deploy"
DEFAULT_PORT_BASE = 2221


@dataclass(frozen=True)
class TestbedPaths:
    root: Path

    @property
    def key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def inventory(self) -> Path:
        return project_root() / "inventories" / "local" / "hosts.yml"

    def ssh(self) -> SshSettings:
        return SshSettings(known_hosts=(self.known_hosts,), identity_file=self.key)


def paths() -> TestbedPaths:
    return TestbedPaths(state_dir() / "testbed")


def host_name(index: int) -> str:
    return f"testbed-{index}"


def container_name(name: str) -> str:
    return f"specdeploy-{name}"


def port_base() -> int:
    raw = os.environ.get("SPECDEPLOY_TESTBED_PORT_BASE", str(DEFAULT_PORT_BASE))
    if not raw.isdigit() or not 1024 <= int(raw) <= 65000:
        raise SpecdeployError(f"SPECDEPLOY_TESTBED_PORT_BASE={raw!r} must be a port in 1024-65000")
    return int(raw)
