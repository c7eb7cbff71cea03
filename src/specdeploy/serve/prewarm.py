"""Warm the page cache with the model's files while the old engine still serves.

The new engine then loads from memory instead of the disk. Readers run in parallel (`vmtouch -t`
over byte ranges, fed to `xargs -P`), in the order the engine reads: the small files (config,
tokenizer) first, then the weight shards in natural order (vLLM's default loader sorts them so:
`model-00002-of-00064` before `model-00010-of-00064`). A model larger than the memory that can be
spared is warmed up to that bound, from its first shard on: the engine's first minutes then read
from memory, and the report says how much. Afterwards `vmtouch` reads the residency of every model
file from mincore(2), which is what the engine will actually find.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdeploy.record_types import PrewarmReport

if TYPE_CHECKING:  # (the GPU machine's gate step reads records without Docker's client)
    from specdeploy.connection import CommandHost


# What may be spared by default: the old engine still serves, and its host needs the rest.
DEFAULT_MAX_FRACTION = 0.5
# A reader's unit of work: small enough that N readers share even a one-shard model, large enough
# that a 547 GB model is ~2,000 vmtouch runs.
CHUNK_BYTES = 256 * 1024**2
MAX_READERS = 16
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
GIB = 1024**3
_RESIDENT = re.compile(r"Resident Pages:\s*(\d+)/(\d+)")


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int


@dataclass(frozen=True)
class Chunk:
    """Bytes [start, end) of one file."""

    path: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PrewarmPlan:
    chunks: tuple[Chunk, ...]
    model_bytes: int
    model_files: int
    budget_bytes: int
    readers: int

    @property
    def planned_bytes(self) -> int:
        return sum(c.size for c in self.chunks)

    @property
    def partial(self) -> bool:
        return self.planned_bytes < self.model_bytes

    @property
    def files_touched(self) -> int:
        return len({c.path for c in self.chunks})


def _natural_key(path: str) -> list[Any]:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", os.path.basename(path))]


def read_order(files: Iterable[ModelFile]) -> list[ModelFile]:
    """Non-weight files (small: config, tokenizer, index) first, then weights in natural order."""
    items = [f for f in files if f.size > 0]
    rest = sorted((f for f in items if not f.path.endswith(WEIGHT_SUFFIXES)), key=lambda f: _natural_key(f.path))
    weights = sorted((f for f in items if f.path.endswith(WEIGHT_SUFFIXES)), key=lambda f: _natural_key(f.path))
    return rest + weights


def default_readers(cpus: int) -> int:
    """One reader per CPU up to 16: a reader mostly waits on the disk, and NVMe wants a deep queue."""
    return max(1, min(MAX_READERS, cpus))


def plan(files: Iterable[ModelFile], budget_bytes: int, readers: int) -> PrewarmPlan:
    """Chunks in read order, up to BUDGET_BYTES (the last file cut at the bound)."""
    ordered = read_order(files)
    chunks: list[Chunk] = []
    left = max(0, budget_bytes)
    for f in ordered:
        take = min(f.size, left)
        for start in range(0, take, CHUNK_BYTES):
            chunks.append(Chunk(f.path, start, min(take, start + CHUNK_BYTES)))
        left -= take
        if left == 0:
            break
    return PrewarmPlan(tuple(chunks), sum(f.size for f in ordered), len(ordered), budget_bytes, max(1, readers))


def budget(available_bytes: int, max_fraction: float, max_bytes: int) -> int:
    """What may be spared: MAX_FRACTION of MemAvailable, and at most MAX_BYTES when that is > 0."""
    spare = int(available_bytes * max_fraction)
    return min(spare, max_bytes) if max_bytes > 0 else spare


def resident_fraction(vmtouch_output: str) -> float | None:
    """The fraction of pages in memory from vmtouch's summary (`Resident Pages: 512/1024 ...`)."""
    match = _RESIDENT.search(vmtouch_output)
    if not match or int(match.group(2)) == 0:
        return None
    return int(match.group(1)) / int(match.group(2))


# Each pair of stdin records is a byte range and a path; xargs hands them out in order, so the
# readers ($1 of them) work on the engine's first shards first. The clock is read on the host.
READER_SCRIPT = (
    'start=$(date +%s.%N); xargs -0 -r -n 2 -P "$1" vmtouch -q -t -p; rc=$?; '
    'end=$(date +%s.%N); echo "prewarm $start $end $rc"'
)


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB" if nbytes >= GIB else f"{nbytes / 1024**2:.1f} MiB"


class Prewarmer:
    """Runs a PrewarmPlan on HOST (vmtouch, find, nproc; over SSH when HOST is remote)."""

    def __init__(self, host: CommandHost, model_path: str, max_fraction: float = DEFAULT_MAX_FRACTION,
                 max_bytes: int = 0, readers: int = 0) -> None:  # fmt: skip
        self.host, self.model_path = host, model_path
        self.max_fraction, self.max_bytes, self.readers = max_fraction, max_bytes, readers

    def _run(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.host.command(*argv), input=stdin, capture_output=True, text=True, check=False)

    def files(self) -> list[ModelFile]:
        proc = self._run("find", self.model_path, "-type", "f", "-printf", "%s\\t%p\\n")
        out = []
        for line in proc.stdout.splitlines():
            size, _, path = line.partition("\t")
            if size.isdigit() and path:
                out.append(ModelFile(path, int(size)))
        return out

    def facts(self) -> tuple[int, int] | None:
        """(MemAvailable in bytes, CPUs) on the host; None when either cannot be read."""
        proc = self._run("sh", "-c", "grep MemAvailable /proc/meminfo; nproc")
        try:
            lines = proc.stdout.split("\n")
            return int(lines[0].split()[1]) * 1024, int(lines[1])
        except (IndexError, ValueError):
            return None

    def residency(self, files: Iterable[ModelFile]) -> float | None:
        listing = "".join(f"{f.path}\0" for f in files)
        proc = self._run("sh", "-c", "xargs -0 -r vmtouch -f", stdin=listing)
        return resident_fraction(proc.stdout) if proc.returncode == 0 else None

    def warm(self) -> PrewarmReport:
        if self._run("sh", "-c", "command -v vmtouch").returncode != 0:
            return PrewarmReport(False, "page cache not warmed: no vmtouch on the host (the serving role installs it)")
        files, facts = self.files(), self.facts()
        if not files or facts is None:
            return PrewarmReport(False, f"page cache not warmed: cannot list {self.model_path} or read MemAvailable")
        available, cpus = facts
        readers = self.readers or default_readers(cpus)
        todo = plan(files, budget(available, self.max_fraction, self.max_bytes), readers)
        if not todo.chunks:
            spare = f"nothing may be spared (MemAvailable {_size(available)})"
            return PrewarmReport(False, f"page cache not warmed: {spare}", model_bytes=todo.model_bytes)
        listing = "".join(f"{c.start}-{c.end}\0{c.path}\0" for c in todo.chunks)
        proc = self._run("sh", "-c", READER_SCRIPT, "prewarm", str(readers), stdin=listing)
        match = re.search(r"^prewarm (\S+) (\S+) (\d+)$", proc.stdout, re.MULTILINE)
        if not match or match.group(3) != "0":
            return PrewarmReport(False, f"page cache warming failed: {(proc.stderr or proc.stdout).strip()[-300:]}",
                                 model_bytes=todo.model_bytes)  # fmt: skip
        seconds = max(float(match.group(2)) - float(match.group(1)), 1e-6)
        resident = self.residency(files)
        rate = todo.planned_bytes / seconds / 1e9
        if todo.partial:
            bound = f"{self.max_fraction:.0%} of MemAvailable ({_size(available)})"
            if self.max_bytes and todo.budget_bytes == self.max_bytes:
                bound = f"serving_prewarm_max_gb ({_size(self.max_bytes)})"
            scope = (f"the first {todo.files_touched} of {todo.model_files} files in the engine's read order, "
                     f"{_size(todo.planned_bytes)} of {_size(todo.model_bytes)} "
                     f"({todo.planned_bytes / todo.model_bytes:.0%}; the bound: {bound})")  # fmt: skip
        else:
            scope = f"{todo.model_files} files, {_size(todo.model_bytes)}"
        kept = "unknown" if resident is None else f"{resident:.0%}"
        return PrewarmReport(
            True,
            f"page cache warmed{' partially' if todo.partial else ''}: {scope}; {seconds:.1f} s, {rate:.2f} GB/s "
            f"with {readers} readers; {kept} of the model resident afterwards",
            model_bytes=todo.model_bytes, planned_bytes=todo.planned_bytes, budget_bytes=todo.budget_bytes,
            readers=readers, seconds=round(seconds, 3), gb_per_s=round(rate, 3), resident_fraction=resident,
            partial=todo.partial,
        )  # fmt: skip


def prewarmer(host: CommandHost, model_path: str, values: dict[str, Any]) -> Prewarmer:
    """From the role's prewarm dict (readers, max_fraction, max_gb), checked by serve.variables."""
    fraction = float(values.get("max_fraction", DEFAULT_MAX_FRACTION))
    max_bytes = int(float(values.get("max_gb", 0)) * GIB)
    readers = int(values.get("readers", 0))
    return Prewarmer(host, model_path, max_fraction=fraction, max_bytes=max_bytes, readers=readers)
