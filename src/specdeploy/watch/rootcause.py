"""Find the exception that started a failure, across every process's interleaved output.

Python prints a chained cause before its consequence, and a child process's traceback reaches
the log before the parent's generic wrapper, so the first exception that is neither noise, a
known wrapper nor a consequence of another process's death is the origin. The shapes of the
lines (prefixes, traceback headers anywhere in a line, frames without a prefix, exceptions with
no header, C++ terminations, device asserts, C/CUDA check lines, tracebacks a wrapper printed as a
Python list) come from `log_grammar.yaml`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import PurePosixPath

from specdeploy.watch.loglines import MAIN, LogLine, grammar, noise_id, parse_line

ENGINE_PATH_MARKERS = ("/vllm/", "/sglang/", "/sgl_kernel/")
_PYDANTIC_KIND = {"Value error": "ValueError", "Assertion failed": "AssertionError", "Type error": "TypeError"}


class Weight(IntEnum):
    """How much a record explains a failure; the first record of the highest weight wins."""

    WRAPPER = 0  # "Engine core initialization failed": true, never the reason
    SECONDARY = 1  # "Connection closed by peer": another process died first
    CAUSE = 2


@dataclass
class Frame:
    file: str
    line: int
    func: str | None
    source: str | None = None


@dataclass
class ExceptionRecord:
    process: str
    type: str
    message: str
    frames: list[Frame]
    origin: str = "traceback"  # traceback | headerless | c++ | fatal | cuda-check | quoted
    detail: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1] if self.type.startswith("pydantic") else self.type

    def location(self) -> Frame | None:
        """The innermost engine-side frame (else the innermost frame at all)."""
        for frame in reversed(self.frames):
            if any(marker in frame.file for marker in ENGINE_PATH_MARKERS):
                return frame
        return self.frames[-1] if self.frames else None

    def weight(self) -> Weight:
        text = f"{self.type}: {self.message}"
        g = grammar()
        if any(rx.search(text) for rx in g.wrappers):
            return Weight.WRAPPER
        if any(rx.search(text) for rx in g.secondary):
            return Weight.SECONDARY
        return Weight.CAUSE

    def unwrapped(self) -> ExceptionRecord:
        """A pydantic ValidationError names its real error on a following line."""
        if not self.type.endswith("ValidationError"):
            return self
        for line in self.detail:
            stripped = line.strip()
            for kind, real in _PYDANTIC_KIND.items():
                if stripped.startswith(f"{kind}, "):
                    message = stripped[len(kind) + 2 :].split(" [type=", 1)[0].strip()
                    return ExceptionRecord(self.process, real, message, self.frames, self.origin, self.detail)
        return self

    def explained_message(self) -> str:
        """The message (with the line of a multi-line message that names the specific reason), or
        for a bare `assert`, the asserted condition from the source line."""
        if self.message:
            detail = next(
                (d.strip() for d in self.detail if any(rx.search(d) for rx in grammar().message_details)), None
            )
            return f"{self.message} | {detail}" if detail and detail not in self.message else self.message
        innermost = self.frames[-1] if self.frames else None
        if innermost and innermost.source and innermost.source.startswith("assert"):
            return f"{innermost.source} failed"
        return ""


@dataclass
class RootCause:
    type: str
    message: str
    process: str
    file: str | None
    line: int | None
    origin: str = "traceback"

    def headline(self) -> str:
        text = f"{self.type}: {self.message}".rstrip(": ")
        if self.type == "SyntaxError" and self.file and f"line {self.line}" not in text:
            text += f" ({PurePosixPath(self.file).name}, line {self.line})"
        return text

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "unknown location"


@dataclass
class _OpenTraceback:
    frames: list[Frame] = field(default_factory=list)


class TracebackCollector:
    """Feed log lines as they arrive; ask for the root cause at any time."""

    def __init__(self) -> None:
        self.records: list[ExceptionRecord] = []
        self.device_asserts: list[tuple[str, str]] = []  # (process, "IndexKernel.cu:111: Assertion `...` failed")
        self.error_lines: list[LogLine] = []
        self.fatal_lines: list[LogLine] = []
        self._open: dict[str, _OpenTraceback] = {}  # insertion order: the newest is last
        self._last: dict[str, ExceptionRecord] = {}  # a record whose message may go on
        self._newest: ExceptionRecord | None = None
        self._cpp_type: dict[str, str] = {}
        self._previous: LogLine | None = None

    # ------------------------------------------------------------------ attribution

    def _owner(self, line: LogLine) -> str:
        """A line without a prefix belongs to the traceback still open (SGLang prints a rank's
        frames without its prefix), else to the record it continues, else to the main process."""
        if not line.bare:
            return line.process
        if self._open:
            return next(reversed(self._open))
        if self._newest is not None and self._last.get(self._newest.process) is self._newest:
            return self._newest.process
        return MAIN

    def _header_owner(self, line: LogLine) -> str:
        """A bare `Traceback` line right after a process's error line (a logger that printed its
        message, then the traceback) is that process's; otherwise the main process's."""
        prev = self._previous
        if line.bare and prev is not None and not prev.bare and prev.level in {"ERROR", "CRITICAL"}:
            return prev.process
        return self._owner(line) if line.bare and self._open else line.process

    # ------------------------------------------------------------------ feeding

    def feed(self, line: LogLine) -> None:
        try:
            self._feed(line)
        finally:
            self._previous = line

    def _record(self, record: ExceptionRecord) -> None:
        self.records.append(record)
        self._last[record.process] = record
        self._newest = record

    def _standalone(self, line: LogLine) -> bool:
        """Lines read on their own, whatever traceback is open: a traceback header, a C/CUDA check
        line (a worker's unprefixed printf can land between another rank's frames), a wrapper's list."""
        g, text = grammar(), line.text
        if g.traceback_header.search(text):
            owner = self._header_owner(line)
            self._open.pop(owner, None)  # re-insert: the newest open traceback is last
            self._open[owner] = _OpenTraceback()
            self._last.pop(owner, None)
            return True
        if check := g.cuda_check.search(text):
            self._cuda_check(line.process, check)
            return True
        return self._quoted(self._owner(line), text)

    def _feed(self, line: LogLine) -> None:
        if self._standalone(line):
            return
        g, text = grammar(), line.text
        owner = self._owner(line)
        if any(rx.match(text) for rx in g.chained):
            self._last.pop(owner, None)
            return
        frame = g.frame.match(text)
        tb = self._open.get(owner)
        if tb is None and frame and line.bare:
            tb = self._open[owner] = _OpenTraceback()  # the log starts mid-traceback
        if tb is not None:
            if frame:
                tb.frames.append(Frame(frame["file"], int(frame["line"]), frame["func"]))
            elif text[:1] in (" ", "\t"):
                if tb.frames and tb.frames[-1].source is None and text.strip().strip("^~ "):
                    tb.frames[-1].source = text.strip()
            elif (exc := g.exception.match(text)) and noise_id(text) is None:
                del self._open[owner]
                self._record(ExceptionRecord(owner, exc["type"], (exc["msg"] or "").strip(), tb.frames))
            elif exc:
                del self._open[owner]  # a known-noise exception (e.g. the SparseMatrix import)
            return
        if (cont := self._last.get(owner)) is not None and text.strip() and self._continues(line, cont):
            if any(rx.match(text.strip()) for rx in g.hint_lines):
                cont.hints.append(text.strip())
            else:
                cont.detail.append(text)
            return
        self._last.pop(owner, None)
        self._structural(line, owner, text)

    def _cuda_check(self, process: str, check: re.Match[str]) -> None:
        where = Frame(check["where"], int(check["line"]), None)
        self._record(ExceptionRecord(process, check["type"] or "Failed", check["msg"], [where], "cuda-check"))
        self._last.pop(process, None)  # one line: what follows is not its message

    def _quoted(self, owner: str, text: str) -> bool:
        """A wrapper's list of strings holding a traceback or exception lines: what they say is
        recorded first (the origin), then the wrapper's own exception, if the line is one."""
        g = grammar()
        if ("['" not in text and '["' not in text) or (owner in self._open and text[:1] in (" ", "\t")):
            return False  # no list; or the source line Python echoes under a frame
        inner = TracebackCollector()
        for quoted in g.quoted_lines.finditer(text):
            try:
                items = ast.literal_eval(quoted[0])
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            for item in items:  # traceback.format_exception's items end with a newline; plain messages do not
                for raw in str(item).splitlines():
                    inner.feed(parse_line(raw))
        if not inner.records:
            return False
        for record in inner.records:
            self._record(replace(record, process=owner, origin="quoted"))
        tb = self._open.get(owner)
        if outer := (g.exception if tb else g.headerless_exception).match(text):
            self._open.pop(owner, None)  # the wrapper's exception line ends its traceback
            self._record(ExceptionRecord(owner, outer["type"], (outer["msg"] or "").strip(), tb.frames if tb else []))
        return True

    def _continues(self, line: LogLine, record: ExceptionRecord) -> bool:
        """A multi-line message goes on in bare lines, or in indented or hint lines of the same
        process (vLLM repeats its header on every line of one record)."""
        g, text = grammar(), line.text
        if g.headerless_exception.match(text):
            return False
        if line.bare:
            return True
        # vLLM prefixes a process's raw stderr too: a prefixed line with no logger header goes on.
        return line.process == record.process and (
            not line.level or text[:1] in (" ", "\t") or any(rx.match(text) for rx in g.hint_lines)
        )

    def _structural(self, line: LogLine, owner: str, text: str) -> None:
        """Lines outside any traceback: device asserts, C++ terminations, fatal errors, exceptions
        with no header, error lines."""
        g = grammar()
        if noise_id(text) is not None:
            return
        if assertion := g.device_assert.search(text):
            where = PurePosixPath(assertion["where"]).name
            self.device_asserts.append((owner, f"{where}:{assertion['line']}: Assertion `{assertion['cond']}` failed"))
            return
        if cpp := g.cpp_type.search(text):
            self._cpp_type[owner] = cpp["type"]
            return
        if owner in self._cpp_type and (what := g.cpp_message.match(text)):
            self._record(ExceptionRecord(owner, self._cpp_type.pop(owner), what["msg"].strip(), [], "c++"))
            return
        if fatal := g.fatal_python_error.match(text):
            self._record(ExceptionRecord(owner, "Fatal Python error", fatal["msg"].strip(), [], "fatal"))
            return
        if exc := g.headerless_exception.match(text):
            self._record(ExceptionRecord(owner, exc["type"], exc["msg"].strip(), [], "headerless"))
            return
        if any(rx.search(text) for rx in g.fatal_lines):
            self.fatal_lines.append(line)
        if line.level in {"ERROR", "CRITICAL"}:
            self.error_lines.append(line)

    # ------------------------------------------------------------------ verdict

    def root_cause(self) -> RootCause | None:
        candidates = [r.unwrapped() for r in self.records]
        chosen = max(candidates, key=lambda r: r.weight(), default=None)  # max keeps the first of a weight
        if chosen is None:
            return self._without_exception()
        where = chosen.location()
        message = chosen.explained_message()
        if self.device_asserts and any(grammar().device_assert_reported.search(r.message) for r in candidates):
            message = f"{message}; first device assert: {self.device_asserts[0][1]}"
        return RootCause(chosen.short_type, message, chosen.process, where.file if where else None,
                         where.line if where else None, chosen.origin)  # fmt: skip

    def _without_exception(self) -> RootCause | None:
        if self.device_asserts:
            process, text = self.device_asserts[0]
            return RootCause("device-side assert", text, process, None, None, "device-assert")
        severe = [line for line in self.fatal_lines if line.level in {"ERROR", "CRITICAL"}]
        for lines in (severe, self.fatal_lines, self.error_lines):
            if lines:
                return RootCause("error", lines[0].text.strip(), lines[0].process, None, None, "error-line")
        return None


def root_cause_of(lines: Iterable[LogLine]) -> RootCause | None:
    collector = TracebackCollector()
    for line in lines:
        collector.feed(line)
    return collector.root_cause()
