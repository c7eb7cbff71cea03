"""Safetensors -> GPU load throughput on a lent GPU machine (issue 18's optional figure), one run.

Run on the device (container-free, the machine's own python3 and torch):
    python3 bench/bench_gpu_load.py --gb 20 --dir /tmp/ckpt
A synthetic checkpoint of random bf16 shards (256 MiB tensors, 2 GiB shards, no hub) is written and
synced; then, each from an emptied page cache (posix_fadvise DONTNEED) and again from a warm one:
the disk's own read rate (one buffered stream), the default path as vLLM's default loader takes it
(safetensors `safe_open` on CPU, each tensor copied to cuda:0), and fastsafetensors
(`SafeTensorsFileLoader(..., nogds=True)`: no GPUDirect Storage, as on a host without it), with its
default O_DIRECT reads and with buffered ones (FASTSAFETENSORS_ODIRECT=0). Prints
one JSON object of GB/s figures. Standard library + torch + safetensors (+ fastsafetensors if installed).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import torch

TENSOR_BYTES, SHARD_BYTES = 256 * 1024**2, 2 * 1024**3


def write_checkpoint(folder: Path, total_bytes: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    shards = max(1, total_bytes // SHARD_BYTES)
    per_shard = SHARD_BYTES // TENSOR_BYTES
    paths = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for s in range(shards):
        header: dict[str, Any] = {}
        for t in range(per_shard):
            header[f"layers.{s}.w{t}"] = {"dtype": "BF16", "shape": [TENSOR_BYTES // 2],
                                          "data_offsets": [t * TENSOR_BYTES, (t + 1) * TENSOR_BYTES]}  # fmt: skip
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        path = folder / f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        with path.open("wb") as out:
            out.write(struct.pack("<Q", len(raw)) + raw)
            for _ in range(per_shard):
                data = torch.randn(TENSOR_BYTES // 2, generator=gen, device="cuda", dtype=torch.bfloat16)
                out.write(data.view(torch.uint8).cpu().numpy().tobytes())
            out.flush()
            os.fsync(out.fileno())
        paths.append(path)
    return paths


def evict(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read(paths: list[Path]) -> float:
    buf = bytearray(16 * 1024**2)
    total, start = 0, time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total / (time.perf_counter() - start) / 1e9


def default_path(paths: list[Path]) -> float:
    from safetensors import safe_open  # noqa: PLC0415

    total, start = 0, time.perf_counter()
    for path in paths:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = f.get_tensor(key).to("cuda:0")
                total += tensor.numel() * tensor.element_size()
                del tensor
    torch.cuda.synchronize()
    return total / (time.perf_counter() - start) / 1e9


def fastsafetensors_path(paths: list[Path], direct: bool = True) -> float:
    """fastsafetensors 0.5.0 reads local files with O_DIRECT by default (past the page cache);
    FASTSAFETENSORS_ODIRECT=0 makes it read buffered."""
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup  # noqa: PLC0415

    os.environ["FASTSAFETENSORS_ODIRECT"] = "1" if direct else "0"
    start = time.perf_counter()
    loader = SafeTensorsFileLoader(SingleGroup(), "cuda:0", nogds=True)
    loader.add_filenames({0: [str(p) for p in paths]})
    buffers = loader.copy_files_to_device()
    total = 0
    for key in loader.get_keys():
        tensor = buffers.get_tensor(key)
        total += tensor.numel() * tensor.element_size()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    buffers.close()
    loader.close()
    return total / seconds / 1e9


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=20)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/specdeploy-ckpt"))
    args = parser.parse_args()
    t0 = time.perf_counter()
    paths = write_checkpoint(args.dir, int(args.gb * 1e9))
    size = sum(p.stat().st_size for p in paths)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "checkpoint_gb": round(size / 1e9, 2), "shards": len(paths),
                           "write_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    loaders = {"disk": disk_read, "default": default_path}
    try:
        import fastsafetensors  # noqa: F401, PLC0415

        loaders["fastsafetensors"] = fastsafetensors_path
        loaders["fastsafetensors_buffered"] = lambda paths: fastsafetensors_path(paths, direct=False)
    except ImportError as exc:
        out["fastsafetensors"] = f"not installed: {exc}"
    for cache in ("cold", "warm"):
        for name, load in loaders.items():
            if cache == "cold":
                evict(paths)
            else:
                disk_read(paths)  # the prewarm's effect: every page resident
            torch.cuda.empty_cache()
            out[f"{name}_{cache}_gb_s"] = round(load(paths), 2)
            print(json.dumps({name: cache, "gb_s": out[f"{name}_{cache}_gb_s"]}), file=sys.stderr, flush=True)
    for path in paths:
        path.unlink()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
