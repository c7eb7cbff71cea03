"""A converged `make deploy`, proven by what proves it: the record, the image, a real completion.

After a whole `site.yml` run that ended well (no --tags, no --check), the CLI keeps a ledger on the
controller: a digest of the deploy's inputs (the checkout's playbooks, roles and code, the inventory,
the extra variables, ANSIBLE_*/SPECDEPLOY_* settings) and, per host, what one SSH read found there: the
digests of the rollout record and the serving record, the engine container's id, image, state and
restart policy and the drafter manifest's digest. Then the host must prove it serves
(specdeploy.proof: a bounded real completion, no engine process stopped or stuck); /health is not
proof, since a frozen engine core's API process still answers it 200.

The next `make deploy` with the same inputs reads each host the same way. The same reading means the
host holds what that run left, serving: the ~60 tasks of the playbook would re-derive it (16 to 19 s on
the 2-core test bed, against about 3 s for this). Any difference (an input, a record that moved on, a
rollback, another container or image, a stopped engine, an engine that does not answer a completion,
an unreadable host) runs the whole playbook, which brings an engine that does not answer back, and a
failed run forgets the ledger. What the reading does not cover (a package removed
by hand, say) is what `specdeploy deploy --full` (make deploy FULL=1) is for.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specdeploy import names
from specdeploy.connection import CommandHost
from specdeploy.paths import state_dir
from specdeploy.proof import Proof
from specdeploy.targets import from_hostvars

# What the inputs digest reads under the checkout: everything a run of site.yml executes or templates.
INPUT_TREES = ("ansible", "roles", "inventories", "testbed", "src/specdeploy", "docker")
INPUT_FILES = ("ansible.cfg", "pyproject.toml", "constraints.txt")
SKIPPED_PARTS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache"})
# Set by make and the CLI for every run; they change nothing a run does.
VOLATILE_ENV = frozenset({"SPECDEPLOY_MAKE_START", "SPECDEPLOY_TIMING_FILE"})
PROBE_TIMEOUT_S = 30

# Run on the host (as root, or through sudo -n: the records are root's); prints one JSON object.
_PROBE = """
import hashlib, json, subprocess, sys
state, container = sys.argv[1], sys.argv[2]
def digest(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""
out = {"rollout": digest(state + "/rollout.json"), "current": digest(state + "/current.json")}
fmt = "{{.Id}} {{.Image}} {{.State.Status}} {{.State.StartedAt}} {{.HostConfig.RestartPolicy.Name}}"
done = subprocess.run(["docker", "inspect", "--format", fmt, container], capture_output=True, text=True)
out["container"] = done.stdout.split() if done.returncode == 0 else []
try:
    current = json.load(open(state + "/current.json"))
except (OSError, ValueError):
    current = {}
drafter = current.get("engine_image_drafter_path") or ""
out["drafter"] = digest(drafter + "/SHA256SUMS") if drafter else ""
print(json.dumps(out, sort_keys=True))
"""


def inputs_digest(root: Path, inventory: Path, extra_vars: Iterable[str]) -> str:
    """The deploy's inputs, as one digest (see the module's text)."""
    h = hashlib.sha256()
    files = [root / f for f in INPUT_FILES if (root / f).is_file()]
    for tree in INPUT_TREES:
        files += sorted(p for p in (root / tree).rglob("*") if p.is_file() and not SKIPPED_PARTS & set(p.parts)
                        and p.suffix != ".pyc" and ".egg-info" not in str(p))  # fmt: skip
    for path in [*files, inventory]:
        h.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    for value in extra_vars:  # an @file is read: its content is the input
        h.update(value.encode() + b"\0")
        if value.startswith("@") and Path(value[1:]).is_file():
            h.update(Path(value[1:]).read_bytes() + b"\0")
    settings = sorted((k, v) for k, v in os.environ.items()
                      if k.startswith(("ANSIBLE_", "SPECDEPLOY_")) and k not in VOLATILE_ENV)  # fmt: skip
    h.update(json.dumps(settings).encode())
    return "sha256:" + h.hexdigest()


def inventory_hosts(inventory: Path) -> dict[str, dict[str, Any]] | None:
    """The hosts of an inventory specdeploy generated (the test bed's, or --host's), with their connection
    variables; None for any other shape (a fleet with its router, a hand-written inventory): such a
    deploy always runs the playbook."""
    try:
        doc = yaml.safe_load(inventory.read_text())
        groups: dict[str, Any] = doc["all"]["children"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    if set(groups) - {"testbed", "targets"}:
        return None
    hosts: dict[str, dict[str, Any]] = {}
    for group in groups.values():
        for name, values in (group.get("hosts") or {}).items():
            hosts[name] = {"inventory_hostname": name, **(group.get("vars") or {}), **(values or {})}
    return hosts or None


def _commands(hostvars: Mapping[str, Any]) -> CommandHost:
    target, ssh = from_hostvars(hostvars)
    return CommandHost(target, ssh)


def read_host(hostvars: Mapping[str, Any]) -> dict[str, Any] | None:
    """One SSH round: what the host holds now (None when it cannot be read)."""
    cmd = _commands(hostvars).as_root("python3", "-c", _PROBE, names.SERVING_STATE_DIR, names.ENGINE_CONTAINER)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
        found = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None
    return found if isinstance(found, dict) else None


def prove_host(hostvars: Mapping[str, Any]) -> Proof:
    """The host's proof of serving (specdeploy.proof), one more SSH round."""
    return _commands(hostvars).prove_serving()


def serving(found: Mapping[str, Any]) -> bool:
    """A reading of a host whose engine runs as a deploy leaves it: recorded and running (whether it serves
    is the proof's to say)."""
    container = found.get("container") or []
    # id, image, status, start time (a restarted engine is not the one proven), restart policy
    return bool(found.get("rollout") and found.get("current") and len(container) == 5 and container[2] == "running")


@dataclass(frozen=True)
class Reading:
    """What the ledger check found: every host's reading and proof when the deploy is converged
    (`hosts`), else why not (`why_not`, empty when there is simply no ledger for these inputs)."""

    hosts: dict[str, dict[str, Any]] | None
    proofs: dict[str, Proof] = field(default_factory=dict)
    why_not: str = ""


def ledger_file(inventory: Path) -> Path:
    key = hashlib.sha256(str(inventory.resolve()).encode()).hexdigest()[:16]
    return state_dir() / "converged" / f"{key}.json"


def remember(inventory: Path, digest: str) -> bool:
    """After a whole run that ended well: read every host and keep the ledger (False: a host is not serving,
    so nothing is kept and the next run is whole)."""
    forget(inventory)
    hosts = inventory_hosts(inventory)
    if hosts is None:
        return False
    found = {name: read_host(hv) for name, hv in hosts.items()}
    if not all(f is not None and serving(f) for f in found.values()):
        return False
    if not all(prove_host(hv).serves for hv in hosts.values()):
        return False
    path = ledger_file(inventory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"inputs": digest, "hosts": found}, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return True


def forget(inventory: Path) -> None:
    ledger_file(inventory).unlink(missing_ok=True)


def proven(inventory: Path, digest: str) -> Reading:
    """Each host's reading and proof when the inputs and every host are as the ledger has them and every
    engine answers a completion; else why not."""
    try:
        ledger = json.loads(ledger_file(inventory).read_text())
    except (OSError, ValueError):
        return Reading(None)
    hosts = inventory_hosts(inventory)
    if not isinstance(ledger, dict) or ledger.get("inputs") != digest or hosts is None:
        return Reading(None)
    kept = ledger.get("hosts") or {}
    if set(kept) != set(hosts):
        return Reading(None, why_not="the inventory's hosts are not the ledger's")
    found, proofs = {}, {}
    for name, hv in hosts.items():
        now = read_host(hv)
        if now is None or now != kept[name] or not serving(now):
            return Reading(None, why_not=f"{name}: its records or engine container moved since the last whole deploy")
        proofs[name] = prove_host(hv)
        if not proofs[name].serves:
            return Reading(None, proofs, f"{name}: {proofs[name].said}")
        found[name] = now
    return Reading(found, proofs)
