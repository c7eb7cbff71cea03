"""The lent GPU machine as every GPU-truth step sees it: the checkout, the store that outlives a call
while the machine stays warm, the call's $OUT, the log line and the parts' digests (test-bed tooling,
never shipped). The bottom of gpu_truth: it imports nothing of the harness, so the steps on_device.py
runs (loads, carried_cache) import this, never on_device itself."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STORE = Path(os.environ.get("GPU_TRUTH_STORE", "/root/gpu-truth"))
CARRIED = ROOT / ".gpu-payload"
OUT = Path(os.environ.get("OUT", "/tmp/gpu-truth-out"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def sums(folder: Path) -> dict[str, str]:
    lines = (folder / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines if line)}
