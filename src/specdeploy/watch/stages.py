"""Start-up stages recognised in vLLM and SGLang logs, in the order they happen.

The patterns are data (`stages`, `shard_progress` and `peer_wait_frames` in log_grammar.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from specdeploy.watch.loglines import grammar


class Stage(IntEnum):
    LAUNCHED = 0
    IMPORT = 1
    CONFIG = 2
    DISTRIBUTED = 3
    PEERS = 4  # within distributed init: a rank blocked until the others join
    WEIGHTS = 5
    COMPILE = 6
    KV_CACHE = 7
    CUDA_GRAPHS = 8
    API_SERVER = 9

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Stage.LAUNCHED: "launched",
    Stage.IMPORT: "importing engine",
    Stage.CONFIG: "resolving config",
    Stage.DISTRIBUTED: "initialising distributed (NCCL/gloo)",
    Stage.PEERS: "waiting for peer ranks",
    Stage.WEIGHTS: "loading weights",
    Stage.COMPILE: "compiling (torch.compile / autotune)",
    Stage.KV_CACHE: "profiling KV cache",
    Stage.CUDA_GRAPHS: "capturing CUDA graphs",
    Stage.API_SERVER: "API server up",
}


@dataclass(frozen=True)
class StageEvent:
    stage: Stage
    shards_done: int | None = None
    shards_total: int | None = None


def recognise(text: str) -> StageEvent | None:
    g = grammar()
    shards = g.shard_progress.search(text)
    if shards:
        return StageEvent(Stage.WEIGHTS, int(shards["done"]), int(shards["total"]))
    for name, pattern in reversed(g.stages):
        if pattern.search(text):
            return StageEvent(Stage[name])
    return None


def advances(current: Stage, seen: Stage) -> bool:
    """A start-up only moves forward, except out of a wait for peers: a later distributed-init line
    means the peers came and the init goes on."""
    return seen >= current or (current is Stage.PEERS and seen is Stage.DISTRIBUTED)


def waits_for_peers(stacks: str) -> bool:
    """A stack dump (py-spy) with a rank blocked in the rendezvous: by default torch logs nothing there."""
    return grammar().peer_wait_frames.search(stacks) is not None
