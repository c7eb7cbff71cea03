"""Every real log in tests/data/real_logs/ replayed as a live process and judged through the CLI.

The logs were printed by real vLLM and SGLang servers and pasted into public issues (the manifest
names each source), or produced here by running a real engine (marked `made_here`). Each is
written to a log file in bursts by a process that then ends as the real one did, while
`specdeploy watch -- ...` judges it: the verdict, the cause's type and key words with no wrapper
or noise named, and the latency measured from the replay's own clock.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdeploy.watch.memory import memory_figures
from tests.support.corpus import CorpusLog, load, names_true_cause, replay_through_cli

from .helpers import ROOT, free_port

LOGS = load()
DEATH_LATENCY_S = 2.0  # verdict after the process exits
STALL_LATENCY_S = 2.0  # verdict after the stall window


@pytest.mark.parametrize("log", LOGS, ids=[log.id for log in LOGS])
def test_real_log_replayed_through_the_cli(log: CorpusLog, tmp_path):
    result = replay_through_cli(log, tmp_path, free_port())
    expected_code = {"READY": 0, "FAILED": 1, "STALLED": 2}[log.verdict]
    assert result.first_line.startswith(f"{log.verdict} "), result.output[-3000:]
    assert result.code == expected_code, result.output[-3000:]
    if log.verdict == "FAILED":
        ok, why = names_true_cause(result.first_line, log)
        assert ok, f"{why}: {result.first_line}"
        assert result.latency_s is not None and result.latency_s <= DEATH_LATENCY_S, result.latency_s
    if log.verdict == "STALLED":
        assert "no progress for" in result.first_line
        assert result.latency_s is not None and result.latency_s <= STALL_LATENCY_S, result.latency_s
    if log.verdict == "READY":
        assert result.verdict["completion"]["tokens"] == 1
        # the engine's own memory accounting rides in the verdict (issue 36: set beside the prediction)
        assert result.verdict["memory"] == memory_figures(log.path.read_text().splitlines()).to_dict()


def test_corpus_covers_what_the_issue_asks_for():
    engines: dict[str, set[str]] = {"vllm": set(), "sglang": set(), "torch": set()}
    for log in LOGS:
        assert log.path.is_file(), log.file
        assert log.source.get("url") or (log.made_here and log.source.get("made_on")), f"{log.file} names no source"
        engines[log.engine].add(".".join(log.version.split()[0].split(".")[:2]))
    pasted = [log for log in LOGS if not log.made_here]
    assert len(pasted) >= 30
    assert len(engines["vllm"]) >= 6, engines
    assert len(engines["sglang"]) >= 4, engines
    kinds = {log.kind for log in pasted}
    assert {"crash-api-server", "crash-engine-core", "crash-rank", "hang", "healthy"} <= kinds, kinds


def test_pid_that_died_before_the_watch_is_failed_with_its_cause(tmp_path):
    """The seeds' case: someone looks after the engine has already died."""
    log = next(entry for entry in LOGS if entry.verdict == "FAILED" and entry.engine == "sglang")
    engine_log = tmp_path / "engine.log"
    with engine_log.open("wb") as out:
        dead = subprocess.run([sys.executable, "-m", "tests.support.log_replay", str(log.path), "--end", "exit"],
                              cwd=ROOT, stdout=out, check=False)  # fmt: skip
    assert dead.returncode == 1
    pid = _a_pid_that_has_exited()
    proc = subprocess.run([sys.executable, "-m", "specdeploy.cli", "watch", "--no-progress", "--pid", str(pid),
                           "--log-file", str(engine_log), "--diagnostics", str(tmp_path / "d")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    first = proc.stdout.splitlines()[0]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert first.startswith("FAILED ")
    assert names_true_cause(first, log)[0], first
    assert f"exit status unknown: pid {pid} had exited before the watch started" in first


def test_death_of_a_pid_that_is_not_the_watchdogs_child_says_its_status_is_unknown(tmp_path):
    log = next(entry for entry in LOGS if entry.verdict == "FAILED" and entry.engine == "vllm")
    engine_log = tmp_path / "engine.log"
    with engine_log.open("wb") as out:
        # Our child, not the watchdog's: it prints after a delay, so the watch attaches while it lives.
        engine = subprocess.Popen([sys.executable, "-c", "import time, runpy, sys; time.sleep(4); "
                                   "sys.argv = ['log_replay', sys.argv[1], '--end', 'exit', '--code', '3']; "
                                   "runpy.run_module('tests.support.log_replay', run_name='__main__')",
                                   str(log.path)], cwd=ROOT, stdout=out)  # fmt: skip
    try:
        proc = subprocess.run([sys.executable, "-m", "specdeploy.cli", "watch", "--no-progress", "--pid",
                               str(engine.pid), "--log-file", str(engine_log), "--diagnostics", str(tmp_path / "d")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    finally:
        engine.wait()
    first = proc.stdout.splitlines()[0]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert names_true_cause(first, log)[0], first
    assert f"exit status unknown: pid {engine.pid} is not this watchdog's child" in first
    assert "exited None" not in first and "exit None" not in first


def _a_pid_that_has_exited() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
