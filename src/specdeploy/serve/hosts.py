"""The serving state of an inventory's hosts, for `specdeploy status|logs` (no playbook needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.playbook import ansible_env
from specdeploy.serve import rollout


def inventory_hostvars(inventory: Path) -> dict[str, dict[str, Any]]:
    """Every host's variables as Ansible resolves them (group_vars included)."""
    proc = subprocess.run(["ansible-inventory", "-i", str(inventory), "--list"], capture_output=True, text=True,
                          env=ansible_env(), check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SpecdeployError(f"ansible-inventory -i {inventory} failed: {proc.stderr.strip()[-500:]}")
    hostvars: dict[str, dict[str, Any]] = json.loads(proc.stdout).get("_meta", {}).get("hostvars", {})
    return {name: {"inventory_hostname": name, **values} for name, values in hostvars.items()}


def status(inventory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name, hostvars in inventory_hostvars(inventory).items():
        out[name] = rollout.status(HostConnection.from_hostvars(hostvars).docker)
    return out


def logs(inventory: Path, tail: int, container: str) -> dict[str, str]:
    out = {}
    for name, hostvars in inventory_hostvars(inventory).items():
        out[name] = rollout.logs(HostConnection.from_hostvars(hostvars).docker, container, tail)
    return out
