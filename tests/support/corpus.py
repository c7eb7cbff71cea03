"""The corpus of real engine logs (tests/data/real_logs/manifest.yaml): what each log is, where
it came from, and how a verdict on it is judged. Used by the replay tests and by `make bench`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]
CORPUS = ROOT / "tests" / "data" / "real_logs"
VERDICTS = ("FAILED", "STALLED", "READY")
STALL_WINDOW_S = 2.0


@dataclass(frozen=True)
class Cause:
    type: str | None  # None where the pasted window does not print the type
    keywords: tuple[str, ...]
    process: str | None = None


@dataclass(frozen=True)
class CorpusLog:
    file: str
    engine: str
    version: str
    source: dict[str, Any]
    kind: str
    verdict: str
    exit: str
    cause: Cause | None
    not_cause: tuple[str, ...] = ()
    shape: tuple[str, ...] = ()
    made_here: bool = False  # produced by running something (marked in the manifest), not pasted

    @property
    def path(self) -> Path:
        return CORPUS / self.file

    @property
    def id(self) -> str:
        return self.file.removesuffix(".log")

    def replay_end(self) -> list[str]:
        if self.verdict == "READY":
            return ["--end", "serve"]
        if self.verdict == "STALLED":
            return ["--end", "hang"]
        if self.exit.upper() == "SIGKILL" or self.exit == "137":
            return ["--end", "sigkill"]
        code = int(self.exit) if self.exit.isdigit() else 1
        return ["--end", "exit", "--code", str(code)]


def load() -> list[CorpusLog]:
    entries = yaml.safe_load((CORPUS / "manifest.yaml").read_text())
    logs = []
    for e in entries:
        cause = e.get("cause")
        logs.append(
            CorpusLog(
                file=e["file"],
                engine=e["engine"],
                version=str(e["version"]),
                source=e.get("source", {}),
                kind=e["kind"],
                verdict=e["verdict"],
                exit=str(e.get("exit", "unknown")),
                cause=Cause(cause["type"], tuple(cause["keywords"]), cause.get("process")) if cause else None,
                not_cause=tuple(e.get("not_cause") or ()),
                shape=tuple(e.get("shape") or ()),
                made_here=bool(e.get("made_here", False)),
            )
        )
    return logs


def names_true_cause(first_line: str, log: CorpusLog) -> tuple[bool, str]:
    """Does a verdict's first line name this log's true cause (type and key words, no wrapper)?"""
    if log.cause is None:
        return True, ""
    shown = first_line.split(" at ", 1)[0] if " at " in first_line else first_line
    wanted = [k for k in (log.cause.type, *log.cause.keywords) if k]
    missing = [k for k in wanted if k not in first_line]
    if missing:
        return False, f"missing {missing}"
    wrong = [w for w in log.not_cause if w in shown]
    if wrong:
        return False, f"names {wrong}"
    return True, ""


@dataclass
class Replayed:
    code: int
    first_line: str
    verdict: dict[str, Any]
    latency_s: float | None  # verdict after the exit (crash) or after the stall window (hang)
    output: str
    marks: dict[str, float] = field(default_factory=dict)


def replay_through_cli(log: CorpusLog, work: Path, port: int, stall_window_s: float = STALL_WINDOW_S) -> Replayed:
    """Run the log as a live process under `specdeploy watch -- ...`, as a user would."""
    marks, verdict_file = work / "marks.jsonl", work / "verdict.json"
    cmd = [sys.executable, "-m", "specdeploy.cli", "watch", "--no-progress", "--log-file", str(work / "engine.log"),
           "--json", str(verdict_file), "--diagnostics", str(work / "diagnostics"),
           "--stall-timeout", str(stall_window_s), "--timeout", "120"]  # fmt: skip
    if log.verdict == "READY":
        cmd += ["--url", f"http://127.0.0.1:{port}", "--model", "replay"]
    cmd += ["--", sys.executable, "-m", "tests.support.log_replay", str(log.path), *log.replay_end(),
            "--port", str(port), "--marks", str(marks)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
        done = time.time()
    finally:
        stop_replay(marks)
    recorded = [json.loads(line) for line in marks.read_text().splitlines()] if marks.exists() else []
    mark = recorded[-1] if recorded else {}
    latency = None
    if "exited" in mark:
        latency = done - mark["exited"]
    elif log.verdict == "STALLED" and "written" in mark:
        latency = done - (mark["written"] + stall_window_s)
    verdict = json.loads(verdict_file.read_text()) if verdict_file.exists() else {}
    first = proc.stdout.splitlines()[0] if proc.stdout else ""
    return Replayed(proc.returncode, first, verdict, latency, proc.stdout + proc.stderr, mark)


def stop_replay(marks: Path) -> None:
    """A hanging or serving replay outlives the watch; end it."""
    if not marks.exists():
        return
    for line in marks.read_text().splitlines():
        with contextlib.suppress(ProcessLookupError, KeyError, ValueError):
            os.kill(int(json.loads(line)["pid"]), 9)
