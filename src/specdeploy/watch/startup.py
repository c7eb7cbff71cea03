"""Where a start-up's minutes went: the watchdog's stage entries as a table of durations.

The watchdog notes when it first saw each stage (weights, profiling, compile, CUDA graphs, API up);
each stage lasts until the next one begins, the last until the verdict. So the rows add up to the
time to the verdict, and each row is what a user tunes against (a loader, the page cache, a flag)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def startup_table(stages: Sequence[dict[str, Any]], elapsed_s: float) -> list[dict[str, Any]]:
    """[{"stage", "began_s", "seconds"}], in the order the stages began."""
    ordered = sorted(stages, key=lambda s: float(s["at_s"]))
    rows = []
    for index, stage in enumerate(ordered):
        began = float(stage["at_s"])
        ends = float(ordered[index + 1]["at_s"]) if index + 1 < len(ordered) else max(elapsed_s, began)
        rows.append({"stage": str(stage["stage"]), "began_s": round(began, 2), "seconds": round(ends - began, 2)})
    return rows


def render(rows: Sequence[dict[str, Any]], status: str = "READY") -> list[str]:
    """The table as `make deploy` prints it: one line per stage, its share of the whole, and the total."""
    total = sum(float(r["seconds"]) for r in rows)
    lines = [f"{r['stage']:<40} {float(r['seconds']):8.1f} s  {float(r['seconds']) / total if total else 0:5.0%}"
             for r in rows]  # fmt: skip
    return [*lines, f"{'to ' + status:<40} {total:8.1f} s"]
