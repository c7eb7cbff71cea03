"""The test bed as a fleet: its hosts behind the router on the first one (`testbed up --fleet`).

Engines bind off loopback (the router on testbed-1 reaches the others over the test bed's Docker
bridge), so each gets an API key, from ansible-vault as on a real fleet: a random key encrypted
with a vault password kept in .state/testbed (mode 0600), which `specdeploy deploy` passes to
ansible-playbook. The plain key beside it is for the tests' clients.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ansible.parsing.vault import VaultLib, VaultSecret

from specdeploy import names
from specdeploy.fleet.sentinel import Settings
from specdeploy.targets import Target, forward_port
from specdeploy_testbed import layout

ROUTER_HOST_INDEX = 0  # testbed-1 runs the router (and an engine)
DRAIN_TIMEOUT_S = 30
HOSTS = 3
MODEL = "tiny-kimi-k2.5"
ROUTER_PORT, ROUTER_METRICS_PORT = names.ROUTER_PORT, names.ROUTER_METRICS_PORT  # the router role's defaults
# The sentinel runs at its defaults (roles/sentinel/defaults, held to specdeploy.fleet.sentinel.Settings by
# tests/unit/fleet/test_sentinel.py): what the fleet tests measure is what a user gets.
DEFAULTS = Settings()
SENTINEL_INTERVAL, SENTINEL_FAILURES, SENTINEL_TIMEOUT = (
    DEFAULTS.interval_s,
    DEFAULTS.failures,
    DEFAULTS.completion_timeout_s,
)
SENTINEL_STALL = DEFAULTS.progress_stall_s


# `specdeploy deploy` arguments of the fleet that the fleet tests and `make bench` roll. Under load
# the 2 cores are shared with two serving engines: a start-up takes minutes, not seconds. The
# benchmark gate judges each host by an A/B with its outgoing engine, measured under the same load
# minutes before (until issue 26 it compared with an idle record, and had to be off here).
def deploy_args(hosts: int, nnodes: int = 1) -> tuple[str, ...]:
    """`specdeploy deploy` arguments of a test-bed fleet of HOSTS (engines over NNODES hosts each)."""
    group = ("--nnodes", str(nnodes)) if nnodes > 1 else ()
    return ("--testbed-hosts", str(hosts), "--fleet", *group, "-e", "serving_stall_timeout=600")


DEPLOY_ARGS = deploy_args(HOSTS)


def _private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def vault_password_file(root: Path) -> Path:
    return root / "vault-password"


def api_key_file(root: Path) -> Path:
    return root / "fleet-api-key"


def ensure_secrets(root: Path) -> tuple[str, str]:
    """The vault password and the engines' API key, made once."""
    password, key = vault_password_file(root), api_key_file(root)
    if not password.is_file():
        _private(password, secrets.token_urlsafe(24) + "\n")
    if not key.is_file():
        _private(key, secrets.token_urlsafe(24) + "\n")
    return password.read_text().strip(), key.read_text().strip()


# One engine over several test hosts (`testbed up --fleet --nnodes 2`): vLLM's multi-node launch with
# the tensor-parallel split over the hosts, the one the CPU build serves across hosts (its data-parallel
# replicas of this MoE model die at the first completion, on the CPU communicator's missing
# all_gatherv: tests/multinode; its pipeline-parallel split too: tests/fleet); rank 0's rendezvous port.
MULTI_NODE_MODE, MULTI_NODE_PORT = "model_parallel", 29550


def multi_node_lines(index: int, hosts: list[tuple[str, str]], nnodes: int) -> list[str]:
    """Host INDEX's rank in its engine of NNODES consecutive hosts, rank 0 the first of them."""
    if nnodes == 1:
        return []
    rank = index % nnodes
    values = {"nnodes": nnodes, "node_rank": rank, "master_addr": hosts[index - rank][1],
              "master_port": MULTI_NODE_PORT, "multi_node": MULTI_NODE_MODE,
              "tensor_parallel_size": nnodes}  # fmt: skip
    return [f"      serving_{name}: {value}\n" for name, value in values.items()]


def fleet_lines(hosts: list[tuple[str, str]], root: Path, nnodes: int = 1) -> str:
    """YAML to append under `all:` of the test bed's inventory: the router group and, per host, its
    fleet address and the settings an engine behind a router on another host needs; with NNODES > 1,
    each NNODES consecutive hosts serve one engine (serving_nnodes)."""
    password, key = ensure_secrets(root)
    vault = VaultLib([("default", VaultSecret(password.encode()))]).encrypt(key).decode()
    block = "".join(f"            {line}\n" for line in vault.splitlines())
    router = hosts[ROUTER_HOST_INDEX][0]
    # Monitoring on the router's host (roles/monitoring: its router and sentinel metrics are on loopback).
    lines = [
        "    router:\n",
        "      hosts:\n",
        f"        {router}: {{}}\n",
        "    monitoring:\n",
        "      hosts:\n",
        f"        {router}: {{}}\n",
        "  hosts:\n",
    ]
    for index, (name, address) in enumerate(hosts):
        lines += [
            f"    {name}:\n",
            f"      serving_fleet_address: {address}\n",
            "      serving_bind_address: 0.0.0.0\n",
            f"      serving_drain_timeout: {DRAIN_TIMEOUT_S}\n",
            *multi_node_lines(index, hosts, nnodes),
            "      serving_api_key: !vault |\n",
            block,
        ]
    return "".join(lines)


def api_key() -> str:
    return api_key_file(layout.paths().root).read_text().strip()


def host_target(index: int) -> Target:
    """Test host INDEX (0-based) over SSH, as the deploy reaches it."""
    return Target("127.0.0.1", layout.SSH_USER, layout.port_base() + index)


@contextmanager
def router(port: int = ROUTER_PORT) -> Iterator[str]:
    """The router's port on its host, forwarded over SSH to loopback here: its base URL."""
    with forward_port(host_target(ROUTER_HOST_INDEX), layout.paths().ssh(), port) as local:
        yield f"http://127.0.0.1:{local}"
