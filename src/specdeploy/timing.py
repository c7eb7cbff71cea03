"""Where a `make deploy` went: one table at its end, from what each phase already records.

- set-up and the test bed: timed by `make deploy` and the CLI;
- the playbook, per role: the `specdeploy_timing` callback (ansible/callback_plugins), each task's
  wall time added to its role, written to the file SPECDEPLOY_TIMING_FILE names;
- the image build's slowest steps: `image-steps.json` beside the build's log (engine_image.docker_build);
- the engine's start-up stages: the watchdog's `verdict.json` (`startup`);
- the benchmark gate: `bench.json` (`gate.seconds`).

A part that did not run this time (a converged image, an engine not restarted) is left out, not zero."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMING_ENV = "SPECDEPLOY_TIMING_FILE"  # where the callback writes the playbook's per-role seconds
STEPS_FILE = "image-steps.json"
SLOWEST_STEPS = 3
NAME_MAX = 60  # a build step's instruction, cut: the table stays one line a row


@dataclass(frozen=True)
class Row:
    name: str
    seconds: float
    detail: str = ""
    part: bool = False  # a part of the row above (indented; not added to the total)


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def playbook_rows(timing_file: Path) -> list[Row]:
    """The playbook's roles, slowest first, from the callback's file ({"roles": {name: s}, "total_s": s})."""
    doc = _read(timing_file)
    if not isinstance(doc, dict) or not isinstance(doc.get("roles"), dict):
        return []
    roles = sorted(((str(k), float(v)) for k, v in doc["roles"].items()), key=lambda kv: -kv[1])
    rows = [Row("playbook (ansible-playbook)", float(doc.get("total_s") or sum(s for _, s in roles)))]
    named = ((name if name.startswith("play:") else f"role {name}", s) for name, s in roles if s >= 0.5)
    return rows + [Row(name, seconds, part=True) for name, seconds in named]


def build_rows(run_dirs: list[Path]) -> list[Row]:
    """The image builds of this deploy (one per build host) and each one's slowest steps."""
    rows: list[Row] = []
    for steps_file in sorted(p / STEPS_FILE for p in run_dirs if (p / STEPS_FILE).is_file()):
        steps = _read(steps_file)
        if not isinstance(steps, dict) or not isinstance(steps.get("steps"), list):
            continue
        rows.append(Row("image build", float(steps.get("seconds") or 0), str(steps.get("tag") or "")))
        slowest = sorted(steps["steps"], key=lambda s: -float(s.get("seconds") or 0))[:SLOWEST_STEPS]
        rows += [Row(f"step {str(s.get('step', '?'))[:NAME_MAX]}", float(s.get("seconds") or 0), part=True)
                 for s in slowest]  # fmt: skip
    return rows


def startup_rows(run_dirs: list[Path]) -> list[Row]:
    """Each watched start-up of this deploy (the verdict) and its stages, as the watchdog timed them."""
    rows: list[Row] = []
    for run in sorted(run_dirs):
        verdict = _read(run / "verdict.json")
        if not isinstance(verdict, dict):
            continue
        what = "speculation-off baseline start-up" if (run / "baseline.json").is_file() else "engine start-up"
        status = f"{verdict.get('status', '?')} ({run.parent.name})"
        rows.append(Row(what, float(verdict.get("elapsed_s") or 0), status))
        stages = [s for s in verdict.get("startup") or [] if isinstance(s, dict) and s.get("seconds")]
        rows += [Row(str(s.get("stage")), float(s["seconds"]), part=True) for s in stages]
        bench = _read(run / "bench.json")
        if isinstance(bench, dict) and isinstance(bench.get("gate"), dict):
            rows.append(Row("benchmark gate", float(bench["gate"].get("seconds") or 0), run.parent.name))
    return rows


def runs_since(runs_root: Path, started_epoch: float) -> list[Path]:
    """The run folders (every host's) written since STARTED_EPOCH: this deploy's."""
    if not runs_root.is_dir():
        return []
    return [p for p in runs_root.glob("*/*") if p.is_dir() and p.stat().st_mtime >= started_epoch]


def render(rows: list[Row], total_s: float) -> list[str]:
    """The table: each row's seconds and its share of the whole deploy."""
    width = max([len(r.name) + (2 if r.part else 0) for r in rows] + [24])
    lines = [f"where the time went ({total_s:.1f} s in all):"]
    for row in rows:
        name = ("  " + row.name) if row.part else row.name
        share = f"{100 * row.seconds / total_s:4.0f}%" if total_s > 0 else "    "
        detail = f"  {row.detail}" if row.detail else ""
        lines.append(f"  {name:<{width}} {row.seconds:8.1f} s {share}{detail}")
    return lines


def deploy_table(*, began: float, make_start: float | None, testbed_s: float | None, timing_file: Path,
                 runs_root: Path, ended: float, proof_s: float | None = None) -> list[str]:  # fmt: skip
    """The table `specdeploy deploy` prints last. BEGAN, MAKE_START, ENDED: epoch seconds (the CLI's
    start, `make deploy`'s, the end); the set-up is the time between make's start and the CLI's.
    PROOF_S: a converged deploy's reading of its hosts (specdeploy.converged), in place of a playbook."""
    rows: list[Row] = []
    if make_start is not None and began - make_start >= 0.5:
        rows.append(Row("set-up (make setup: the venv, pinned packages)", began - make_start))
    if testbed_s is not None:
        rows.append(Row("test bed (hosts reconciled, SSH ready)", testbed_s))
    if proof_s is not None:
        rows.append(Row("converged, proven (the records, the engine's image, /health)", proof_s))
        return render(rows, ended - (make_start if make_start is not None else began))
    runs = runs_since(runs_root, began)
    rows += playbook_rows(timing_file) + build_rows(runs) + startup_rows(runs)
    return render(rows, ended - (make_start if make_start is not None else began))
