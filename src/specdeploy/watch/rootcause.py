"""Find the exception that started a failure, across every process's interleaved output.

Python prints a chained cause before its consequence, and a child process's traceback reaches
the log before the parent's generic wrapper, so the first traceback that is neither noise nor a
known wrapper is the origin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from specdeploy.watch.loglines import LogLine, noise_id

_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?$')
_EXCEPTION = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Warning))(?::\s?(?P<msg>.*))?$"
)
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
# Generic wrappers: true, but never the reason.
_WRAPPERS = tuple(
    re.compile(rx)
    for rx in (
        r"Engine core initialization failed",
        r"WorkerProc initialization failed",
        r"failed to be inspected",
        r"Worker failed with error",
        r"EngineDeadError|EngineGenerateError",
        r"^SystemExit|^KeyboardInterrupt",
        r"Error in inspecting model architecture",
        r"returned non-zero exit status",
        r"See stack trace for root cause",
        r"Error raised in subprocess",
    )
)
# Inside a pydantic ValidationError: "  Value error, <message> [type=value_error, ...]".
_PYDANTIC_INNER = re.compile(r"^\s*(?P<kind>Value error|Assertion failed|Type error),\s*(?P<msg>.*?)(?:\s*\[type=.*)?$")
_PYDANTIC_KIND = {"Value error": "ValueError", "Assertion failed": "AssertionError", "Type error": "TypeError"}
ENGINE_PATH_MARKERS = ("/vllm/", "/sglang/", "/sgl_kernel/")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str | None


@dataclass
class ExceptionRecord:
    process: str
    type: str
    message: str
    frames: list[Frame]
    detail: list[str] = field(default_factory=list)
    chained_to_previous: bool = False

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1] if self.type.startswith("pydantic") else self.type

    def location(self) -> Frame | None:
        """The innermost engine-side frame (else the innermost frame at all)."""
        for frame in reversed(self.frames):
            if any(marker in frame.file for marker in ENGINE_PATH_MARKERS):
                return frame
        return self.frames[-1] if self.frames else None

    def is_wrapper(self) -> bool:
        text = f"{self.type}: {self.message}"
        return any(rx.search(text) for rx in _WRAPPERS)

    def unwrapped(self) -> ExceptionRecord:
        """A pydantic ValidationError names its real error on a following line."""
        if not self.type.endswith("ValidationError"):
            return self
        for line in self.detail:
            match = _PYDANTIC_INNER.match(line)
            if match:
                kind = _PYDANTIC_KIND[match["kind"]]
                return ExceptionRecord(self.process, kind, match["msg"], self.frames, self.detail)
        return self


@dataclass
class RootCause:
    type: str
    message: str
    process: str
    file: str | None
    line: int | None

    def headline(self) -> str:
        text = f"{self.type}: {self.message}".rstrip(": ")
        if self.type == "SyntaxError" and self.file and f"line {self.line}" not in text:
            text += f" ({PurePosixPath(self.file).name}, line {self.line})"
        return text

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "unknown location"


class TracebackCollector:
    """Feed log lines as they arrive; ask for the root cause at any time."""

    def __init__(self) -> None:
        self.records: list[ExceptionRecord] = []
        self._open: dict[str, list[Frame]] = {}
        self._chain_next: dict[str, bool] = {}
        self._last: dict[str, ExceptionRecord] = {}
        self.error_lines: list[LogLine] = []

    def feed(self, line: LogLine) -> None:
        text, proc = line.text, line.process
        if text.startswith(_TRACEBACK):
            self._open[proc] = []
            self._last.pop(proc, None)
            return
        if any(text.startswith(marker) for marker in _CHAINED):
            self._chain_next[proc] = True
            self._last.pop(proc, None)
            return
        frames = self._open.get(proc)
        if frames is not None:
            frame = _FRAME.match(text)
            if frame:
                frames.append(Frame(frame["file"], int(frame["line"]), frame["func"]))
                return
            exc = _EXCEPTION.match(text)
            if exc and not text.startswith((" ", "\t")):
                record = ExceptionRecord(
                    proc,
                    exc["type"],
                    (exc["msg"] or "").strip(),
                    frames,
                    chained_to_previous=self._chain_next.pop(proc, False),
                )
                self.records.append(record)
                self._last[proc] = record
                del self._open[proc]
            return  # source lines and carets inside a traceback
        last = self._last.get(proc)
        if last is not None and text.strip() and (text.startswith((" ", "\t")) or not line.level):
            last.detail.append(text)  # continuation of a multi-line exception message
            return
        self._last.pop(proc, None)
        if line.level in {"ERROR", "CRITICAL"} and noise_id(text) is None:
            self.error_lines.append(line)

    def root_cause(self) -> RootCause | None:
        candidates = [r.unwrapped() for r in self.records]
        meaningful = [r for r in candidates if not r.is_wrapper() and noise_id(f"{r.type}: {r.message}") is None]
        chosen = meaningful[0] if meaningful else (candidates[0] if candidates else None)
        if chosen is None:
            if self.error_lines:
                first = self.error_lines[0]
                return RootCause("error", first.text, first.process, None, None)
            return None
        where = chosen.location()
        return RootCause(chosen.short_type, chosen.message, chosen.process, where.file if where else None,
                         where.line if where else None)  # fmt: skip


def root_cause_of(lines: Iterable[LogLine]) -> RootCause | None:
    collector = TracebackCollector()
    for line in lines:
        collector.feed(line)
    return collector.root_cause()
