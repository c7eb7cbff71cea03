"""Summarise py-spy dumps: the innermost frames of each process's busiest thread."""

from __future__ import annotations

import re

_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<state>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<where>[^)]+)\)$")
# Frames that say where an engine hangs, preferred over generic Python internals.
_INTERESTING = ("vllm/", "sglang/", "torch/distributed", "nccl", "cuda", "triton")


def summarise_stacks(dump: str) -> list[str]:
    """One line per process: its first thread's innermost frames, engine-side ones first."""
    summaries: list[str] = []
    pid, cmd, in_first_thread, seen_thread = "?", "", False, False
    frames: list[str] = []

    def flush() -> None:
        if frames:
            preferred = [f for f in frames if any(k in f for k in _INTERESTING)] or frames
            summaries.append(f"pid {pid} ({cmd[:60]}): " + " <- ".join(preferred[:3]))

    for line in dump.splitlines():
        proc = _PROCESS.match(line)
        if proc:
            flush()
            pid, cmd, frames, in_first_thread, seen_thread = proc["pid"], proc["cmd"], [], False, False
            continue
        if _THREAD.match(line):
            in_first_thread = not seen_thread
            seen_thread = True
            continue
        frame = _FRAME.match(line)
        if frame and in_first_thread:
            frames.append(f"{frame['func']} ({frame['where']})")
    flush()
    return summaries
