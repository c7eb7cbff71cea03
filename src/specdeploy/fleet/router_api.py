"""The router's worker API and the sentinel's hold API, as URLs (standard library only: the sentinel
imports it on the router host).

Measured on vllm-router 0.1.17: `remove_worker` of a URL that is not a member answers 200 (a no-op,
so removal is idempotent), and `add_worker` waits for the worker's `/health` up to the router's
`--worker-startup-timeout-secs` before it answers."""

from __future__ import annotations

from urllib.parse import quote

from specdeploy import names


def worker_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def membership_url(action: str, worker: str, router_port: int) -> str:
    """The POST that adds or removes WORKER, against ROUTER_PORT on loopback."""
    if action not in ("add", "remove"):
        raise ValueError(f"membership action {action!r}: add or remove")
    return f"http://127.0.0.1:{router_port}/{action}_worker?url={quote(worker, safe='')}"


def members_url(router_port: int) -> str:
    return f"http://127.0.0.1:{router_port}/list_workers"


SENTINEL_PORT = names.SENTINEL_PORT  # the sentinel's hold API, on the router host's loopback (roles/sentinel)


def hold_url(action: str, worker: str, sentinel_port: int) -> str:
    """The POST that holds WORKER out of the sentinel's hands for a rollout, or releases it."""
    if action not in ("hold", "release"):
        raise ValueError(f"sentinel action {action!r}: hold or release")
    return f"http://127.0.0.1:{sentinel_port}/{action}?worker={quote(worker, safe='')}"
