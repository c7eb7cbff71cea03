"""Start-up stages recognised in vLLM and SGLang logs, in the order they happen."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum


class Stage(IntEnum):
    LAUNCHED = 0
    IMPORT = 1
    CONFIG = 2
    WEIGHTS = 3
    KV_CACHE = 4
    CUDA_GRAPHS = 5
    API_SERVER = 6

    @property
    def label(self) -> str:
        return {
            0: "launched",
            1: "importing engine",
            2: "resolving config",
            3: "loading weights",
            4: "profiling KV cache",
            5: "capturing CUDA graphs",
            6: "API server up",
        }[int(self)]


_STAGE_PATTERNS: tuple[tuple[Stage, re.Pattern[str]], ...] = tuple(
    (stage, re.compile(rx))
    for stage, rx in (
        (Stage.IMPORT, r"vLLM API server version|Automatically detected platform|server_args=ServerArgs"),
        (Stage.CONFIG, r"Resolved architecture|non-default args|Initializing a V1 LLM engine|Using max model len"),
        (Stage.WEIGHTS, r"Loading (?:safetensors )?checkpoint shards|Starting to load model|Load weight begin"),
        (Stage.KV_CACHE, r"KV cache|Memory profiling takes|KV Cache is allocated|available_gpu_mem"),
        (Stage.CUDA_GRAPHS, r"Capturing CUDA graph|Capture cuda graph|cudagraph capturing|Graph capturing"),
        (
            Stage.API_SERVER,
            r"Starting vLLM API server|Application startup complete|Uvicorn running on|fired up and ready",
        ),
    )
)
# "Loading safetensors checkpoint shards:  50% Completed | 31/62 [..."
_SHARDS = re.compile(r"checkpoint shards:\s+(?P<pct>\d+)%[^|]*\|\s*(?P<done>\d+)/(?P<total>\d+)")


@dataclass(frozen=True)
class StageEvent:
    stage: Stage
    shards_done: int | None = None
    shards_total: int | None = None


def recognise(text: str) -> StageEvent | None:
    shards = _SHARDS.search(text)
    if shards:
        return StageEvent(Stage.WEIGHTS, int(shards["done"]), int(shards["total"]))
    for stage, pattern in reversed(_STAGE_PATTERNS):
        if pattern.search(text):
            return StageEvent(stage)
    return None
