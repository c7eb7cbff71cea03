"""The watch's stages on the pinned vLLM's own start-up (tests/data/real_logs, made on the lent H200)."""

from __future__ import annotations

from pathlib import Path

from specdeploy.watch.loglines import parse_line
from specdeploy.watch.stages import Stage, recognise

LOGS = Path(__file__).resolve().parents[2] / "data" / "real_logs"


def test_the_pinned_vllm_start_up_is_staged_load_compile_profile_graphs() -> None:
    """vLLM 0.33.0 on the H200 at Kimi-K2.5's full depth: each stage begins where the engine says it does
    ("Using LBNHC KV cache layout" right after the load is no KV profiling), so the compile's seconds are
    the compile's."""
    log = LOGS / "h200-vllm-0.33-kimi-k25-full-depth-spec-off-ready.log"
    began: dict[Stage, str] = {}
    for raw in log.read_text().splitlines():
        event = recognise(parse_line(raw).text)
        if event and event.stage not in began and all(event.stage.value > s.value for s in began):
            began[event.stage] = raw
    assert [s for s in began if s >= Stage.WEIGHTS] == [Stage.WEIGHTS, Stage.COMPILE, Stage.KV_CACHE,
                                                         Stage.CUDA_GRAPHS, Stage.API_SERVER]  # fmt: skip
    assert "Loading model from scratch" in began[Stage.WEIGHTS] and "18:43:56" in began[Stage.COMPILE]
    assert "torch.compile took 49.74 s in total" in began[Stage.KV_CACHE]
