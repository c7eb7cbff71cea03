"""GPU peer-to-peer, measured rather than guessed: the probe itself.

Runs with the engine's own Python (it needs only the standard library and torch, so it runs as a
file too: `python3 p2p_probe.py`), on the target's GPUs, and prints one JSON document:
- for every ordered GPU pair: whether the driver reports peer access, a timed device-to-device copy
  (the peer path) and the same copy staged through pinned host memory (P2P forced off), each
  checked for correct data;
- an NCCL all-reduce over all GPUs (one process a GPU), with P2P on and with `NCCL_P2P_DISABLE=1`,
  checked for the right sum and timed.
It does not judge: specdeploy.gpu.p2p turns the figures into a verdict. Whoever runs it bounds it
in time (a hang is itself a verdict)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

SCHEMA = 1


def _sync(*devices: int) -> None:
    import torch  # noqa: PLC0415 (the probe's only dependency, imported where it runs)

    for device in devices:
        torch.cuda.synchronize(device)


def _pattern(size: int, device: int) -> Any:
    import torch  # noqa: PLC0415

    return (torch.arange(size, dtype=torch.int64, device=f"cuda:{device}") % 251).to(torch.uint8)


def _same(a: Any, b: Any) -> bool:
    """Equal contents of two uint8 tensors on different GPUs, compared on the host (no peer path)."""
    return bool((a.cpu() == b.cpu()).all().item())


def copy_figures(src: int, dst: int, size_mb: int, repeats: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    size = size_mb * 1024 * 1024
    a = _pattern(size, src)
    peer = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dst}")
    staged = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dst}")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    out: dict[str, Any] = {"src": src, "dst": dst, "bytes": size}
    out["peer_access"] = bool(torch.cuda.can_device_access_peer(src, dst))
    for name, copy in (("direct", lambda: peer.copy_(a)), ("staged", lambda: (host.copy_(a), staged.copy_(host)))):
        copy()  # warm-up: first-touch and peer mapping are not bandwidth
        _sync(src, dst)
        start = time.perf_counter()
        for _ in range(repeats):
            copy()
        _sync(src, dst)
        seconds = time.perf_counter() - start
        out[f"{name}_gbps"] = round(size * repeats / seconds / 1e9, 2)
    out["direct_correct"] = _same(a, peer)
    out["staged_correct"] = _same(a, staged)
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _all_reduce_rank(rank: int, job: dict[str, int], out: Any) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    world, port, size_mb, repeats = job["world"], job["port"], job["size_mb"], job["repeats"]
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        elements = size_mb * 1024 * 1024 // 4
        data = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=f"cuda:{rank}")
        dist.all_reduce(data)  # warm-up, and the sum that is checked
        expected = world * (world + 1) / 2
        correct = bool(torch.all(data == expected).item())
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(data)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / repeats
        # NCCL's bus bandwidth for all-reduce: 2(n-1)/n of the buffer crosses each link.
        bus = elements * 4 * (2 * (world - 1) / world) / seconds / 1e9 if world > 1 else 0.0
        if rank == 0:
            out.put({"correct": correct, "seconds": round(seconds, 6), "bus_gbps": round(bus, 2)})
    finally:
        dist.destroy_process_group()


def all_reduce_figures(world: int, p2p: bool, size_mb: int, repeats: int) -> dict[str, Any]:
    """One all-reduce run in fresh processes (NCCL reads NCCL_P2P_DISABLE at init)."""
    import torch.multiprocessing as mp  # noqa: PLC0415

    os.environ["NCCL_P2P_DISABLE"] = "0" if p2p else "1"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start = time.perf_counter()
    try:
        job = {"world": world, "port": _free_port(), "size_mb": size_mb, "repeats": repeats}
        mp.start_processes(_all_reduce_rank, args=(job, results), nprocs=world, join=True, start_method="spawn")
    except Exception as exc:  # a rank that failed: its error is the figure
        return {"p2p": p2p, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
    finally:
        os.environ.pop("NCCL_P2P_DISABLE", None)
    doc = dict(results.get(timeout=10))
    return {"p2p": p2p, **doc, "wall_s": round(time.perf_counter() - start, 2)}


def probe(size_mb: int = 256, repeats: int = 5, all_reduce_mb: int = 64) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    start = time.perf_counter()
    count = torch.cuda.device_count()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "gpus": [torch.cuda.get_device_name(i) for i in range(count)],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(str(p) for p in torch.cuda.nccl.version()) if count else None,
    }
    doc["pairs"] = [copy_figures(i, j, size_mb, repeats) for i in range(count) for j in range(count) if i != j]
    doc["all_reduce"] = (
        [all_reduce_figures(count, p2p, all_reduce_mb, repeats) for p2p in (True, False)] if count else []
    )
    doc["seconds"] = round(time.perf_counter() - start, 2)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copy-mb", type=int, default=256, help="bytes per pair copy (MiB)")
    parser.add_argument("--all-reduce-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.copy_mb, args.repeats, args.all_reduce_mb), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
