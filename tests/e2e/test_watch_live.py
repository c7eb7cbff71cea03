"""`specdeploy watch` on real engine starts: READY, FAILED (root cause), STALLED (stack dump).

Each verdict's latency is measured independently of the watchdog and asserted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from specdeploy.watch.sources import ProcessSource
from specdeploy.watch.watchdog import Watch, WatchOptions

from . import engine

pytestmark = pytest.mark.e2e


def options(tmp_path: Path, port: int, **overrides) -> WatchOptions:
    base = {
        "url": f"http://127.0.0.1:{port}",
        "model": "tiny",
        "tokens": 8,
        "speculative": True,
        "stall_timeout_s": 120.0,
        "timeout_s": 600.0,
        "diagnostics": tmp_path / "diagnostics",
        "progress": False,
    }
    return WatchOptions(**{**base, **overrides})


class HealthWatcher(threading.Thread):
    """Polls /health every 0.1 s on its own, to time the READY verdict against."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url, self.first_ok, self.stop = f"http://127.0.0.1:{port}/health", None, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.first_ok is None:
            try:
                if httpx.get(self.url, timeout=1).status_code == 200:
                    self.first_ok = time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(0.1)


class ExitWatcher(threading.Thread):
    def __init__(self, proc) -> None:
        super().__init__(daemon=True)
        self.proc, self.exited_at = proc, None

    def run(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()


def test_healthy_start_is_ready_with_real_acceptance(engine_ready, tmp_path, port):
    log = tmp_path / "engine.log"
    proc = engine.launch(engine.serve_command(engine_ready, port), log, engine.engine_env())
    health = HealthWatcher(port)
    health.start()
    try:
        verdict = Watch(ProcessSource(proc.pid, log, proc), options(tmp_path, port)).run()
        verdict_at = time.monotonic()
    finally:
        health.stop.set()
        engine.stop(proc)
    assert verdict.status == "READY", verdict.first_line()
    assert verdict.completion and verdict.completion["tokens"] == 8
    assert verdict.acceptance and verdict.acceptance["draft_tokens"] > 0
    assert verdict.acceptance["rate"] > 0.5, verdict.acceptance  # always-accept pair
    assert verdict.acceptance["mean_length"] > 1.0
    assert health.first_ok is not None
    # READY follows /health within the time of one completion on this CPU, not a fixed sleep.
    assert verdict_at - health.first_ok < 15, verdict_at - health.first_ok
    assert (Path(verdict.diagnostics) / "verdict.json").is_file()
    assert "READY" in verdict.first_line() and "acceptance=" in verdict.first_line()


def test_syntax_error_is_named_within_two_seconds_of_the_exit(engine_ready, tmp_path, port):
    module = engine.site_packages() / engine.DEEPSEEK_V2
    lines = module.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("from .interfaces import"))
    lines.insert(at, "from .interfaces import SupportsEagle3,\n")  # the by-hand bug: an invalid import
    module.write_text("".join(lines))
    log = tmp_path / "engine.log"
    try:
        proc = engine.launch(engine.serve_command(engine_ready, port), log, engine.engine_env())
        exits = ExitWatcher(proc)
        exits.start()
        verdict = Watch(ProcessSource(proc.pid, log, proc), options(tmp_path, port)).run()
        verdict_at = time.monotonic()
        exits.join(timeout=30)
    finally:
        engine.restore_pristine_engine()
        engine.stop(proc)
    assert verdict.status == "FAILED", verdict.first_line()
    cause = verdict.root_cause
    assert cause and cause["type"] == "SyntaxError", verdict.first_line()
    assert str(cause["file"]).endswith("deepseek_v2.py") and cause["line"] == at + 1, cause
    assert "Engine core initialization failed" not in verdict.first_line()
    assert "failed to be inspected" not in verdict.first_line()
    assert exits.exited_at is not None
    assert verdict_at - exits.exited_at <= 2.0, verdict_at - exits.exited_at
    assert verdict.exit_code == 1


def test_frozen_engine_is_stalled_with_a_stack_dump(engine_ready, tmp_path, port):
    # A deliberately blocking import: every Python process of the engine waits forever at start.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import threading\n\n\ndef wait_for_a_peer_that_never_comes():\n    threading.Event().wait()\n\n\n"
        "wait_for_a_peer_that_never_comes()\n"
    )
    log = tmp_path / "engine.log"
    proc = engine.launch(engine.serve_command(engine_ready, port), log, engine.engine_env({"PYTHONPATH": str(hook)}))
    stall_timeout = 6.0
    try:
        started = time.monotonic()
        verdict = Watch(
            ProcessSource(proc.pid, log, proc), options(tmp_path, port, stall_timeout_s=stall_timeout)
        ).run()
        took = time.monotonic() - started
        assert proc.poll() is None, "the engine must still be alive: stalled, not dead"
    finally:
        engine.stop(proc)
    assert verdict.status == "STALLED", verdict.first_line()
    assert stall_timeout <= took <= stall_timeout + 20, took
    stacks = (Path(verdict.diagnostics) / "stacks.txt").read_text()
    assert "wait_for_a_peer_that_never_comes" in stacks
    assert any("wait_for_a_peer_that_never_comes" in s for s in verdict.stack_summary), verdict.stack_summary
    assert "innermost:" in verdict.first_line()
