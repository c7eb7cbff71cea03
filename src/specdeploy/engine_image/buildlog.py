"""Reading `docker build` output: the steps worth showing live, and the failing step's root cause."""

from __future__ import annotations

import re

_STEP = re.compile(r"^Step (?P<n>\d+)/(?P<m>\d+) : (?P<instruction>.*)$")
_FINDING = re.compile(r"^\s*(?:✗ |error: |refusing to patch )")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RETURNED = re.compile(r"returned a non-zero code: (?P<code>\d+)")


def build_failure_summary(lines: list[str]) -> str:
    """The failing build step and the root cause our own checks printed in it."""
    clean = [_ANSI.sub("", line).rstrip() for line in lines]
    step, start = None, 0
    for i, line in enumerate(clean):
        match = _STEP.match(line.strip())
        if match:
            step, start = match, i
    tail = [ln.strip() for ln in clean[start + 1 :] if ln.strip() and not ln.startswith(" ---> ")]
    returned = next((m for ln in tail if (m := _RETURNED.search(ln))), None)
    output = [ln for ln in tail if not _RETURNED.search(ln)]
    causes = [ln for ln in output if _FINDING.match(ln)] or output[-3:]
    where = f"step {step['n']}/{step['m']} ({step['instruction'][:90]})" if step else "before the first step"
    code = f" (exit {returned['code']})" if returned else ""
    return f"image build failed at {where}{code}: " + " | ".join(dict.fromkeys(causes))


def progress_line(line: str) -> str | None:
    """Build steps worth showing while the build runs."""
    match = _STEP.match(line.strip())
    return f"[{match['n']}/{match['m']}] {match['instruction'][:100]}" if match else None
