"""A synthetic safetensors checkpoint made on a test-bed host: random shards, no hub. Real
safetensors files (an 8-byte header length, a JSON header, the data), named as the hub names
shards, with their index and a config.json, so the prewarm sees what it would see in a real model
folder. Written with fsync, so the page cache can be emptied again (dirty pages cannot be evicted)."""

from __future__ import annotations

import subprocess

from specdeploy.connection import CommandHost

# Runs on the host with its python3 (Ansible's): FOLDER SHARDS SHARD_BYTES.
MAKER = r"""
import json, os, struct, sys
folder, shards, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(folder, exist_ok=True)
weights = {}
for i in range(1, shards + 1):
    name = f"model-{i:05d}-of-{shards:05d}.safetensors"
    header = json.dumps({f"layers.{i}.weight": {"dtype": "BF16", "shape": [size // 2],
                                                 "data_offsets": [0, size // 2 * 2]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(os.path.join(folder, name), "wb") as out, open("/dev/urandom", "rb") as rand:
        out.write(struct.pack("<Q", len(header)) + header)
        left = size // 2 * 2
        while left:
            block = rand.read(min(left, 16 << 20))
            out.write(block)
            left -= len(block)
        out.flush()
        os.fsync(out.fileno())
    weights[f"layers.{i}.weight"] = name
with open(os.path.join(folder, "model.safetensors.index.json"), "w") as out:
    json.dump({"metadata": {}, "weight_map": weights}, out)
with open(os.path.join(folder, "config.json"), "w") as out:
    json.dump({"architectures": ["Synthetic"], "note": "random shards made by specdeploy's test bed"}, out)
"""


def make(host: CommandHost, folder: str, shards: int, shard_bytes: int) -> None:
    """Make (or remake) the checkpoint in FOLDER on HOST."""
    subprocess.run(host.command("rm", "-rf", folder), check=True, capture_output=True)
    subprocess.run(host.command("python3", "-c", MAKER, folder, str(shards), str(shard_bytes)), check=True,
                   capture_output=True, timeout=1800)  # fmt: skip


def evict(host: CommandHost, folder: str) -> None:
    """Empty the page cache of FOLDER's files (posix_fadvise DONTNEED through vmtouch -e)."""
    subprocess.run(host.command("vmtouch", "-q", "-e", folder), check=True, capture_output=True)


def remove(host: CommandHost, folder: str) -> None:
    subprocess.run(host.command("rm", "-rf", folder), check=True, capture_output=True)
