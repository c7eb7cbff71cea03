"""A draft length per batch size: serving_speculative_schedule, its rules, and the choice `auto` makes.

One value, three forms: "" (today's one draft length), "auto" (the gate measures each length and picks),
or explicit inclusive batch-size ranges, each with its draft length (0 allowed). The inventory may write
the ranges as vLLM's own triples ([[1, 4, 3], [5, 256, 1]]) or as text ("1-4:3, 5-256:1"); the config
keeps the text (canonical, hashable, in the digest).

The rules are vLLM 0.33's own (vllm/v1/spec_decode/dynamic/utils.py: non-empty, three whole numbers an
entry, positive ranges, start <= end, length >= 0, no overlap, the first range from 1), checked here
because the engine checks them only once the model is loaded (its Scheduler), plus one it does not say:
a length above serving_num_speculative_tokens, which vLLM lowers without a word. A gap between ranges
takes the range before it, and sizes past the last range take the last one (vLLM's lookup).

Sits at the bottom (record types' level): the gate chooses a schedule, serve renders it.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

AUTO = "auto"
OFF = ""
# Within a range a length is kept unless the fastest other length beats it by more than this: the
# sweep's noise, so that a measured tie never splits a range.
TIE = 0.02
# `auto`'s schedule must be at least this fast as speculation off at every measured level (the issue's
# bar; the sweep's own noise on the test bed is about 2 %).
SCHEDULE_FLOOR = 0.97
_TEXT = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class Span:
    """Batch sizes START..END (inclusive) draft LENGTH tokens a step (0: none)."""

    start: int
    end: int
    length: int

    def text(self) -> str:
        return f"{self.start}-{self.end}:{self.length}"


def _entries(value: Any) -> list[tuple[Any, ...]] | str:
    """The entries as tuples, or why the value has no entries at all."""
    if isinstance(value, str) and value.lstrip().startswith("["):  # a list kept as JSON text (canonical)
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return "ranges such as [[1, 4, 3], [5, 256, 1]] (not JSON)"
    if isinstance(value, str):
        parts = [p for p in value.split(",") if p.strip()]
        found = [_TEXT.match(p) for p in parts]
        if not parts or not all(found):
            return 'text of "start-end:length" ranges separated by commas, e.g. "1-4:3, 5-256:1"'
        return [tuple(int(g) for g in m.groups()) for m in found if m]
    if isinstance(value, Sequence) and value:
        return [tuple(e) if isinstance(e, Sequence) and not isinstance(e, str) else (e,) for e in value]
    return '"", auto, or ranges such as [[1, 4, 3], [5, 256, 1]]'


def _entry_problem(entry: tuple[Any, ...]) -> str | None:
    if len(entry) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry):
        return f"[start, end, length] entries of whole numbers (not {list(entry)!r})"
    start, end, length = entry
    if start <= 0 or end <= 0:
        return f"positive batch sizes (the range {start}-{end})"
    if start > end:
        return f"ranges whose start is at most their end ({start}-{end})"
    return f"draft lengths of 0 or more ({start}-{end}:{length})" if length < 0 else None


def problem(value: Any) -> str | None:
    """Why VALUE is no schedule (phrased to follow "must be"), or None. vLLM's rules, in its order."""
    if value in (OFF, AUTO, None):
        return None
    entries = _entries(value)
    if isinstance(entries, str):
        return entries
    wrong = next((p for p in map(_entry_problem, entries) if p), None)
    if wrong:
        return wrong
    spans = sorted((Span(*e) for e in entries), key=lambda s: s.start)
    overlap = next(((a, b) for a, b in itertools.pairwise(spans) if b.start <= a.end), None)
    if overlap:
        return f"ranges that do not overlap ({overlap[0].text()} and {overlap[1].text()})"
    if spans[0].start != 1:
        return f"ranges whose first starts at 1, so that every batch size has a length (it starts at {spans[0].start})"
    return None


def parse(value: Any) -> tuple[Span, ...]:
    """The explicit ranges of a good VALUE, sorted ("" and auto have none)."""
    if value in (OFF, AUTO, None):
        return ()
    entries = _entries(value)
    if isinstance(entries, str):
        raise ValueError(entries)
    return tuple(sorted((Span(*(int(x) for x in e)) for e in entries), key=lambda s: s.start))


def canonical(value: Any) -> str:
    """The config's form: "", auto, or "1-4:3,5-256:1" (a bad value as given: its rule says so)."""
    if value in (OFF, AUTO, None):
        return str(value or OFF)
    if problem(value):  # as given, for its rule to say
        return value if isinstance(value, str) else json.dumps(value)
    return ",".join(s.text() for s in parse(value))


def length_at(spans: Sequence[Span], batch: int) -> int:
    """The draft length at BATCH as vLLM's lookup gives it: a gap takes the range before, the tail the last."""
    found = spans[0].length
    for span in spans:
        if span.start > batch:
            break
        found = span.length
    return found


def above(spans: Sequence[Span], most: int) -> list[Span]:
    """Ranges whose length vLLM would lower to MOST (serving_num_speculative_tokens) without a word."""
    return [s for s in spans if s.length > most]


def choose(speeds: Mapping[int, Mapping[int, float]], most_batch: int) -> tuple[Span, ...]:
    """`auto`: SPEEDS[length][concurrency] (output tokens/s; length 0 is speculation off) -> the fastest
    length at each measured concurrency, each holding from its concurrency up to the next one's (the
    first from 1, the last to MOST_BATCH), equal neighbours merged. A length within TIE of the fastest
    keeps the longer range's neighbour's length, so noise does not split a range."""
    levels = sorted({c for row in speeds.values() for c in row})
    if not levels:
        raise ValueError("nothing measured")
    picks: list[int] = []
    for level in levels:
        at = {length: row[level] for length, row in speeds.items() if level in row and row[level] > 0}
        if not at:
            raise ValueError(f"no length measured at concurrency {level}")
        best = max(at.values())
        near = sorted(length for length, speed in at.items() if speed >= best * (1 - TIE))
        keep = picks[-1] if picks and picks[-1] in near else max(at, key=lambda k: at[k])
        picks.append(keep)
    bounds = [1, *levels[1:]]
    spans: list[Span] = []
    for i, (start, length) in enumerate(zip(bounds, picks, strict=True)):
        end = bounds[i + 1] - 1 if i + 1 < len(bounds) else max(most_batch, start)
        if spans and spans[-1].length == length:
            spans[-1] = Span(spans[-1].start, end, length)
        else:
            spans.append(Span(start, end, length))
    return tuple(spans)


def text(spans: Sequence[Span]) -> str:
    """For the verdict: `1-3: 3 drafts, 4-256: none`."""
    return ", ".join(f"{s.start}-{s.end}: {s.length if s.length else 'none'}" for s in spans)


def all_off(spans: Sequence[Span]) -> bool:
    """Every range drafts nothing: render no speculative config at all (a 0 entry is not speculation off:
    vLLM 0.33 ran x0.85 at 8 requests on the H200 with one, docs/engine-facts.md)."""
    return bool(spans) and all(s.length == 0 for s in spans)


def vllm_words(value: str) -> list[list[int]]:
    """The config's text as num_speculative_tokens_per_batch_size, in vLLM's words. Never [] (the engine
    half-enables on it)."""
    spans = parse(value)
    if not spans:
        raise ValueError("no ranges: leave num_speculative_tokens_per_batch_size out")
    return [[s.start, s.end, s.length] for s in spans]


def chosen(speeds: Mapping[int, Mapping[int, float]], most_batch: int) -> dict[str, Any]:
    """`auto`'s record: the schedule choose() makes from SPEEDS, in the config's text and in words, whether
    it drafts at all, and the speeds behind it (up to MOST_BATCH, or the highest level measured)."""
    levels = [c for row in speeds.values() for c in row]
    spans = choose(speeds, max([most_batch, *levels]))
    return {"schedule": ",".join(s.text() for s in spans), "said": text(spans), "drafts": not all_off(spans),
            "speeds": {str(k): {str(c): v for c, v in row.items()} for k, row in speeds.items()}}  # fmt: skip


def drafts_within(spans: Sequence[Span], most: int) -> bool:
    """Whether some batch size from 1 to MOST drafts (no ranges: one length, which does)."""
    return not spans or any(length_at(spans, batch) > 0 for batch in range(1, max(most, 1) + 1))
