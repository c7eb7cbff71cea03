"""Engine log lines: strip colours and collector prefixes, split off the process prefix and the
logger header, classify noise. The grammar is data: `log_grammar.yaml` and `noise_patterns.yaml`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MAIN = "main"
_LEVELS = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "CRITICAL"}  # glog's one-letter levels


def _load(name: str) -> Any:
    return yaml.safe_load(resources.files(__package__).joinpath(name).read_text())


def _compile_all(patterns: list[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


@dataclass(frozen=True)
class Grammar:
    """log_grammar.yaml, compiled once."""

    version: int
    collector_prefixes: tuple[re.Pattern[str], ...]
    process_prefixes: tuple[re.Pattern[str], ...]
    logger_headers: tuple[re.Pattern[str], ...]
    traceback_header: re.Pattern[str]
    chained: tuple[re.Pattern[str], ...]
    frame: re.Pattern[str]
    exception: re.Pattern[str]
    headerless_exception: re.Pattern[str]
    cpp_type: re.Pattern[str]
    cpp_message: re.Pattern[str]
    fatal_python_error: re.Pattern[str]
    cuda_check: re.Pattern[str]
    quoted_lines: re.Pattern[str]
    device_assert: re.Pattern[str]
    device_assert_reported: re.Pattern[str]
    hint_lines: tuple[re.Pattern[str], ...]
    message_details: tuple[re.Pattern[str], ...]
    wrappers: tuple[re.Pattern[str], ...]
    secondary: tuple[re.Pattern[str], ...]
    fatal_lines: tuple[re.Pattern[str], ...]
    stages: tuple[tuple[str, re.Pattern[str]], ...]
    shard_progress: re.Pattern[str]
    peer_wait_frames: re.Pattern[str]


@cache
def grammar() -> Grammar:
    data = _load("log_grammar.yaml")
    tb = data["traceback"]
    return Grammar(
        version=int(data["version"]),
        collector_prefixes=_compile_all(data["collector_prefixes"]),
        process_prefixes=_compile_all(data["process_prefixes"]),
        logger_headers=_compile_all(data["logger_headers"]),
        traceback_header=re.compile(tb["header"]),
        chained=_compile_all(tb["chained"]),
        frame=re.compile(tb["frame"]),
        exception=re.compile(tb["exception"]),
        headerless_exception=re.compile(data["headerless_exception"]),
        cpp_type=re.compile(data["cpp_terminate"]["type"]),
        cpp_message=re.compile(data["cpp_terminate"]["message"]),
        fatal_python_error=re.compile(data["fatal_python_error"]),
        cuda_check=re.compile(data["cuda_check"]),
        quoted_lines=re.compile(data["quoted_lines"]),
        device_assert=re.compile(data["device_assert"]),
        device_assert_reported=re.compile(data["device_assert_reported"]),
        hint_lines=_compile_all(data["hint_lines"]),
        message_details=_compile_all(data["message_details"]),
        wrappers=_compile_all(data["wrappers"]),
        secondary=_compile_all(data["secondary"]),
        fatal_lines=_compile_all(data["fatal_lines"]),
        stages=tuple((stage, re.compile(rx)) for stage, rxs in data["stages"].items() for rx in rxs),
        shard_progress=re.compile(data["shard_progress"]),
        peer_wait_frames=re.compile(data["peer_wait_frames"]),
    )


@dataclass(frozen=True)
class LogLine:
    process: str  # "APIServer", "EngineCore_DP0", "VllmWorker rank=3", "TP3", "rank3", ... or "main"
    pid: int | None
    text: str  # without colour codes, prefixes or logger header
    level: str = ""
    bare: bool = False  # neither a process prefix nor a logger header: whose line it is must be inferred


def _process_of(match: re.Match[str]) -> tuple[str, int | None]:
    groups = match.groupdict()
    if groups.get("proc"):
        return groups["proc"], int(groups["pid"]) if groups.get("pid") else None
    if groups.get("ranks"):
        return "_".join(groups["ranks"].split()), None
    if groups.get("rank"):
        return f"rank{groups['rank']}", None
    return MAIN, None


def parse_line(raw: str) -> LogLine:
    g = grammar()
    text = _ANSI.sub("", raw.rstrip("\r\n"))
    for prefix in g.collector_prefixes:
        match = prefix.match(text)
        if match:
            text = text[match.end() :]
    process, pid, prefixed = MAIN, None, False
    for prefix in g.process_prefixes:
        match = prefix.match(text)
        if match:
            (process, pid), text, prefixed = _process_of(match), text[match.end() :], True
            break
    level = ""
    for header in g.logger_headers:
        match = header.match(text)
        if match:
            level, text = _LEVELS.get(match["level"], match["level"]), text[match.end() :]
            break
    return LogLine(process, pid, text, level, bare=not prefixed and not level)


@dataclass(frozen=True)
class NoisePattern:
    id: str
    regex: re.Pattern[str]
    why: str
    progress: bool  # a sign of life (a tqdm bar, NCCL INFO), though never a cause


@cache
def noise_catalogue() -> tuple[int, tuple[NoisePattern, ...]]:
    data = _load("noise_patterns.yaml")
    patterns = tuple(
        NoisePattern(p["id"], re.compile(p["regex"]), p["why"], bool(p.get("progress", False)))
        for p in data["patterns"]
    )
    return int(data["version"]), patterns


def noise_match(text: str) -> NoisePattern | None:
    for pattern in noise_catalogue()[1]:
        if pattern.regex.search(text):
            return pattern
    return None


def noise_id(text: str) -> str | None:
    pattern = noise_match(text)
    return pattern.id if pattern else None
