"""The serving state of an inventory's hosts, for `specdeploy status|logs` (no playbook needed)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Inventory:
    """One reading of an inventory (`ansible-inventory --list` once): its hosts' variables and its groups."""

    listing: dict[str, Any]

    @property
    def hostvars(self) -> dict[str, dict[str, Any]]:
        """Every host's variables as Ansible resolves them (group_vars included). A host with none is
        missing from `_meta.hostvars`, yet is a host: it is taken from the groups."""
        found: dict[str, dict[str, Any]] = self.listing.get("_meta", {}).get("hostvars", {})
        names = dict.fromkeys([*found, *self.group("all")])  # the listing's order first, as before
        return {name: {"inventory_hostname": name, **found.get(name, {})} for name in names}

    def group(self, group: str) -> list[str]:
        """The hosts of GROUP and of its child groups, in the inventory's order, each once."""

        def members(name: str) -> list[str]:
            entry = self.listing.get(name) or {}
            return [*entry.get("hosts", []), *(h for child in entry.get("children", []) for h in members(child))]

        return list(dict.fromkeys(members(group)))


def read(inventory: Path) -> Inventory:
    return Inventory(_listing(inventory))


def inventory_hostvars(inventory: Path) -> dict[str, dict[str, Any]]:
    return read(inventory).hostvars


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
