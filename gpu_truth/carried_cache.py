"""An engine cache carried between GPU machines (test-bed tooling, never shipped; docs/gpu-truth.md).

A lent machine lives 30 minutes, so every session's first start of an engine is cold: SGLang 0.5.23
JIT-builds its WNA16 Marlin MoE kernel at first use (229 s on the H100, more than 400 s on the H200),
more than a third of a session's device time spent before the gate measures anything. The product keys
its engine cache by engine, image digest and GPU architecture (specdeploy.serve.engine_cache); here the
"image" is the carried payload, so a cache made on one machine is valid on another of the same
architecture holding the same payload, and the engines check their own artifacts besides (SGLang's JIT
key holds nvcc's and the host compiler's versions and every source's digest).

    python3 gpu_truth/on_device.py cache-out sglang [--only sglang-jit]   # there: the cache, as parts in $OUT
    python3 gpu_truth/carried_cache.py keep /work/.device/NN               # here: into .gpu-payload/carried-cache
    (its parts travel like the payload's, one a call, `on_device.py receive`; the next start seeds from them)

The parts are cut at PART_MIB: $OUT returns at most 8 files of 16 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script
from gpu_truth import machine

NAME = "carried-cache"  # under .gpu-payload/ here and the store there (receive moves it like a payload)
PART_MIB = 15
OUT_FILES = 8  # what $OUT returns at most
SEEDED = ".seeded-from-carried"


def current(engine: str) -> Path:
    """The engine's cache folder the last start on this machine used (with_engine_cache made it)."""
    folders = sorted((machine.STORE / "engine-cache").glob(f"{engine}-*"), key=lambda p: p.stat().st_mtime)
    if not folders:
        raise SystemExit(f"no {engine} engine cache on this machine: start the engine first")
    return folders[-1]


def _finished(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leaves out what a build still running holds (SGLang stages a build, then renames it into place)."""
    name = Path(info.name).name
    return None if name.startswith(".staging-") or name == ".lock" else info


def cache_out(engine: str, only: list[str], out: Path | None = None) -> None:
    """The engine's current cache (or its ONLY subfolders) as xz-compressed parts in OUT, with SHA256SUMS and
    manifest.json: refused, with nothing written, when it needs more files than OUT has left."""
    out = out or machine.OUT
    folder = current(engine)
    subs = only or sorted(p.name for p in folder.iterdir() if p.is_dir())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=3) as tar:
        for sub in subs:
            if (folder / sub).is_dir():
                tar.add(folder / sub, arcname=sub, filter=_finished)
    data = buffer.getvalue()
    size = int(PART_MIB * 1024**2)
    chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
    out.mkdir(parents=True, exist_ok=True)
    room = OUT_FILES - 2 - sum(1 for _ in out.iterdir())
    if len(chunks) > room:
        raise SystemExit(f"{folder.name}: {len(data) / 1024**2:.0f} MiB compressed needs {len(chunks)} parts, "
                         f"$OUT has room for {room}: name fewer subfolders (--only)")  # fmt: skip
    lines = [f"{hashlib.sha256(data).hexdigest()}  cache.tar.xz"]
    for n, chunk in enumerate(chunks):
        (out / f"part-{n:02d}").write_bytes(chunk)
        lines.append(f"{hashlib.sha256(chunk).hexdigest()}  part-{n:02d}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    raw = sum(p.stat().st_size for sub in subs for p in (folder / sub).rglob("*") if p.is_file())
    manifest = {"key": folder.name, "engine": engine, "subfolders": subs, "bytes": raw, "compressed": len(data),
                "parts": len(chunks), "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    machine.log(f"{folder.name} ({', '.join(subs)}): {raw / 1024**2:.0f} MiB, {len(data) / 1024**2:.1f} MiB "
            f"compressed, {len(chunks)} parts in {out}")  # fmt: skip


def seed(folder: Path, store: Path | None = None) -> str:
    """Fills FOLDER (an engine cache about to be mounted) from a carried cache of the same key, once.
    Returns what it did, for the log: nothing carried, another key (not used), parts missing, or seeded."""
    carried = store or machine.STORE / NAME
    if not (carried / "manifest.json").is_file():
        return "no carried cache"
    manifest = json.loads((carried / "manifest.json").read_text())
    if manifest["key"] != folder.name:
        return f"the carried cache is {manifest['key']}, this start's is {folder.name}: not used"
    if (folder / SEEDED).is_file():
        return f"seeded earlier from the cache made {manifest['made']}"
    want = machine.sums(carried)
    parts = sorted(n for n in want if n.startswith("part-"))
    missing = [n for n in parts if not (carried / n).is_file()]
    if missing:
        return f"the carried cache lacks {' '.join(missing)}: not used"
    data = b"".join((carried / n).read_bytes() for n in parts)
    if hashlib.sha256(data).hexdigest() != want["cache.tar.xz"]:
        return "the carried cache's parts do not join to its SHA256SUMS: not used"
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        tar.extractall(folder, filter="data")
    (folder / SEEDED).write_text(json.dumps(manifest) + "\n")
    return f"seeded from the cache made {manifest['made']} ({', '.join(manifest['subfolders'])})"


def keep(returned: Path, into: Path | None = None) -> None:
    """Here: the parts a `cache-out` call returned (its files_at folder) into .gpu-payload/carried-cache,
    checked against their SHA256SUMS, replacing what was there."""
    into = into or machine.CARRIED / NAME
    want = machine.sums(returned)
    for name, digest in want.items():
        if name.startswith("part-") and machine.sha256(returned / name) != digest:
            raise SystemExit(f"{returned / name}: its sha256 differs from SHA256SUMS")
    if into.is_dir():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    for name in ["SHA256SUMS", "manifest.json", *sorted(n for n in want if n.startswith("part-"))]:
        shutil.copy2(returned / name, into / name)
    print(f"{into}: {json.loads((into / 'manifest.json').read_text())['key']}, {len(want) - 1} parts")


def add_parser(sub: Any) -> None:
    out = sub.add_parser("cache-out", help="the engine's cache as parts in $OUT, for a later machine")
    out.add_argument("engine", choices=("vllm", "sglang"))
    out.add_argument("--only", action="append", default=[], help="a subfolder of the cache (default: all)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    keeping = sub.add_parser("keep", help="here: a cache-out call's returned folder into .gpu-payload")
    keeping.add_argument("returned", type=Path)
    args = parser.parse_args()
    keep(args.returned)


if __name__ == "__main__":
    main()
