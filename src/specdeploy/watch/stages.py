"""Start-up stages recognised in vLLM and SGLang logs, in the order they happen.

The patterns are data (`stages` and `shard_progress` in log_grammar.yaml)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from specdeploy.watch.loglines import grammar


class Stage(IntEnum):
    LAUNCHED = 0
    IMPORT = 1
    CONFIG = 2
    DISTRIBUTED = 3
    WEIGHTS = 4
    COMPILE = 5
    KV_CACHE = 6
    CUDA_GRAPHS = 7
    API_SERVER = 8

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Stage.LAUNCHED: "launched",
    Stage.IMPORT: "importing engine",
    Stage.CONFIG: "resolving config",
    Stage.DISTRIBUTED: "initialising distributed (NCCL/gloo)",
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
