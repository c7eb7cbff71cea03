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


def _listing(inventory: Path) -> dict[str, Any]:
    """`ansible-inventory --list`: its JSON (Ansible's documented interface, not a human-facing text)."""
    proc = subprocess.run(["ansible-inventory", "-i", str(inventory), "--list"], capture_output=True, text=True,
                          env=ansible_env(), check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SpecdeployError(f"ansible-inventory -i {inventory} failed: {proc.stderr.strip()[-500:]}")
    listing: dict[str, Any] = json.loads(proc.stdout)
    return listing


def inventory_hostvars(inventory: Path) -> dict[str, dict[str, Any]]:
    """Every host's variables as Ansible resolves them (group_vars included)."""
    hostvars: dict[str, dict[str, Any]] = _listing(inventory).get("_meta", {}).get("hostvars", {})
    return {name: {"inventory_hostname": name, **values} for name, values in hostvars.items()}


def group_hosts(inventory: Path, group: str) -> list[str]:
    """The hosts of GROUP and of its child groups, in the inventory's order, each once."""
    listing = _listing(inventory)

    def members(name: str) -> list[str]:
        entry = listing.get(name) or {}
        return [*entry.get("hosts", []), *(h for child in entry.get("children", []) for h in members(child))]

    return list(dict.fromkeys(members(group)))


def status(inventory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for name, hostvars in inventory_hostvars(inventory).items():
        out[name] = rollout.status(HostConnection.from_hostvars(hostvars).docker)
    return out


def status_lines(rows: dict[str, dict[str, Any]]) -> list[str]:
    """`specdeploy status` in words: each host's engine containers, or how to deploy one."""
    lines = []
    for host, containers in rows.items():
        lines.append(f"{host}:")
        if not containers:
            lines.append("  no engine container (deploy with: make deploy)")
        for name, row in containers.items():
            tag = ",".join(row["tags"]) or row["image"][7:19]
            lines.append(f"  {name:28} {row['state']:8} exit={row['exit_code']} restarts={row['restarts']} "
                         f"image={tag} started={row['started_at']}")  # fmt: skip
    return lines


def logs(inventory: Path, tail: int, container: str) -> dict[str, str]:
    out = {}
    for name, hostvars in inventory_hostvars(inventory).items():
        out[name] = rollout.logs(HostConnection.from_hostvars(hostvars).docker, container, tail)
    return out
