"""Engine log lines: strip colours, split off the process prefix, classify noise."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM: "(APIServer pid=12)", "(EngineCore_DP0 pid=40)", "(Worker_TP0 pid=41)", "(VllmWorker-0 pid=7)".
_VLLM_PREFIX = re.compile(r"^\((?P<proc>[A-Za-z][\w.-]*) pid=(?P<pid>\d+)\)\s?")
# SGLang: "[2026-03-02 10:00:00 DP0 TP3] ..." or "[2026-03-02 10:00:00 TP0] ...".
_SGLANG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?(?P<ranks>(?: (?:DP|TP|PP|EP)\d+)+)\]\s?")


# vLLM's formatter repeats "ERROR 11-29 10:00:01 [core.py:700] " on every line of a record.
_VLLM_LOGGER = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] "
)
_SGLANG_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\b:?\s?")


@dataclass(frozen=True)
class LogLine:
    process: str  # "APIServer", "EngineCore_DP0", "TP0", ... or "main"
    pid: int | None
    text: str  # without colour codes, process prefix or logger header
    level: str = ""


def parse_line(raw: str) -> LogLine:
    text = _ANSI.sub("", raw.rstrip("\r\n"))
    process, pid = "main", None
    match = _VLLM_PREFIX.match(text)
    if match:
        process, pid, text = match["proc"], int(match["pid"]), text[match.end() :]
    else:
        match = _SGLANG_PREFIX.match(text)
        if match:
            process, text = "_".join(match["ranks"].split()), text[match.end() :]
    level = ""
    header = _VLLM_LOGGER.match(text) or _SGLANG_LEVEL.match(text)
    if header:
        level, text = header["level"], text[header.end() :]
    return LogLine(process, pid, text, level)


@dataclass(frozen=True)
class NoisePattern:
    id: str
    regex: re.Pattern[str]
    why: str


@cache
def noise_catalogue() -> tuple[int, tuple[NoisePattern, ...]]:
    data = yaml.safe_load(resources.files(__package__).joinpath("noise_patterns.yaml").read_text())
    patterns = tuple(NoisePattern(p["id"], re.compile(p["regex"]), p["why"]) for p in data["patterns"])
    return int(data["version"]), patterns


def noise_id(text: str) -> str | None:
    for pattern in noise_catalogue()[1]:
        if pattern.regex.search(text):
            return pattern.id
    return None
