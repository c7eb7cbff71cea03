"""A multi-node engine's ranks as the inventory gives them: which hosts are one engine, and whether every
rank is there once. Pure (the standard library alone): the filters compose with it in every Ansible
worker, which must not load Docker's client or SSH for it (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def ranks_of(configs: Mapping[str, Mapping[str, Any] | None], mine: Mapping[str, Any]) -> dict[str, int]:
    """The hosts of MINE's multi-node engine, {host: serving_node_rank}, among CONFIGS ({host: its
    serving_config}, every host of the play): those with the same rank 0 (master address and port).
    Empty for an engine on one host."""

    def key(cfg: Mapping[str, Any]) -> tuple[str, int] | None:
        return (
            (str(cfg.get("master_addr")), int(cfg.get("master_port") or 0)) if int(cfg.get("nnodes") or 1) > 1 else None
        )

    ours = key(mine)
    if ours is None:
        return {}
    return {host: int(cfg.get("node_rank") or 0) for host, cfg in configs.items() if cfg and key(cfg) == ours}


def problems(ranks: dict[str, int], nnodes: int, unchecked: Iterable[str] = ()) -> list[str]:
    """The group as the inventory gives it ({host: serving_node_rank}): every rank once. UNCHECKED: the
    play's hosts whose serving variables were never composed (they failed before the rollout)."""
    if not ranks:
        return []
    seen: dict[int, list[str]] = {}
    for host, rank in ranks.items():
        seen.setdefault(rank, []).append(host)
    out = [f"serving_node_rank={rank} is given to {', '.join(sorted(hosts))}: each rank is one host"
           for rank, hosts in sorted(seen.items()) if len(hosts) > 1]  # fmt: skip
    missing = [r for r in range(nnodes) if r not in seen]
    if missing:
        out.append(f"serving_nnodes={nnodes}, but no host in this play has serving_node_rank "
                   f"{', '.join(map(str, missing))} (the group is {dict(sorted(ranks.items()))}): "
                   "deploy every rank together, with no --limit that splits them")  # fmt: skip
        if unchecked:
            out[-1] += f"; {', '.join(sorted(unchecked))} failed before the rollout: see its error above"
    return out
