"""The engine's caches kept per host and image, so a restart does not redo its compile and JIT work.

Every engine container (the rollout, the benchmark's baseline, a rollback's, each rank of a group) mounts
one folder of the host, `<serving_state_dir>/engine-cache/<key>`, at CACHE_MOUNT, and the engine's own
cache variables point into it. The key is the engine, the image's digest and the GPUs' architecture: a
cache is never shared between two images (an engine or a kernel library that changed would read the old
artifacts) nor between GPU generations. The host keeps the newest few keys, within a size bound.

What each pinned release reads (held to the wheels by tests/integration/test_engine_words.py):
- vLLM 0.33.0: `VLLM_CACHE_ROOT` (torch.compile's AOT cache, FlashInfer's autotune cache, model infos;
  `envs.compile_factors` ignores it, so the path is no part of the compile cache's key);
  `TRITON_CACHE_DIR` (kept as given: `compilation/compiler_interface.initialize_inductor_cache` sets its
  own only when the caller has none); FlashInfer 0.7.2's JIT modules under
  `$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer` (`flashinfer/jit/env.py`);
- SGLang 0.5.23: `SGLANG_CACHE_DIR` (DeepGEMM, CuTe AOT objects, FlashInfer's autotune results:
  `srt/environ.py`) and `SGLANG_JIT_CACHE_DIR`, which does not follow it: the JIT kernels (its WNA16
  Marlin MoE kernel, 229 s to build on an H100) go to `~/.cache/sglang/jit` unless it is set
  (`kernels/jit/utils/compile/cache.cache_root`); and the same Triton and FlashInfer variables;
- both: `CUDA_CACHE_PATH`, the CUDA driver's cache of kernels it compiled from PTX.

The variables name the mount itself, never a path through a link: SGLang 0.5.23 keeps a JIT build only
if the build's own staging files are left out of its dependency list. It tells them apart by comparing
resolved paths with its unresolved staging folder, so through a link no later start finds the build
(H100, 2026-12-07; docs/engine-facts.md). A bind mount is not a link.

Nothing here varies per run: the mount and the variables are the same for every start of one image on
one host, so the engines' own cache keys stay stable (tests/unit/serve/test_engine_cache.py).
A corrupt or half-written cache must not fail a start: each engine checks its artifacts and rebuilds
what it cannot read (tests/e2e/test_engine_cache.py cuts every file of one in half: the real engine starts).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.connection import CommandHost

CACHE_MOUNT = "/var/cache/specdeploy-engine"
FOLDER = "engine-cache"  # under serving_state_dir
KEEP = 3  # serving_engine_cache_keep's default: the current image and two to roll back to
MAX_GB = 50.0  # serving_engine_cache_max_gb's default
GB = 1024**3
_KEY = re.compile(r"^(vllm|sglang)-[0-9a-f]{12}-[a-z0-9]+$")

# Each engine's variables, relative to CACHE_MOUNT.
VARIABLES: dict[str, dict[str, str]] = {
    "vllm": {
        "VLLM_CACHE_ROOT": "vllm",
        "TRITON_CACHE_DIR": "triton",
        "FLASHINFER_WORKSPACE_BASE": "flashinfer",
        "CUDA_CACHE_PATH": "cuda",
    },
    "sglang": {
        "SGLANG_CACHE_DIR": "sglang",
        "SGLANG_JIT_CACHE_DIR": "sglang-jit",
        "TRITON_CACHE_DIR": "triton",
        "FLASHINFER_WORKSPACE_BASE": "flashinfer",
        "CUDA_CACHE_PATH": "cuda",
    },
}


# The VLLM_* variables specdeploy renders that vLLM 0.33.0 leaves out of its compile cache's key
# (`envs.compile_factors`, its ignored_factors): a path or a credential, never a compile input.
VLLM_UNHASHED = ("VLLM_CACHE_ROOT", "VLLM_API_KEY", "VLLM_HOST_IP")


def architecture(compute_caps: list[str]) -> str:
    """`sm90` from nvidia-smi's compute_cap rows ("9.0"); `sm90-sm120` for a mix; `cpu` for none."""
    found = sorted({f"sm{c.strip().replace('.', '')}" for c in compute_caps if re.fullmatch(r"\d+\.\d+", c.strip())})
    return "-".join(found) or "cpu"


def key(engine: str, image_id: str, arch: str) -> str:
    """The cache's name: engine, the image digest's first 12 hex digits, the GPUs' architecture."""
    digest = image_id.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{12,64}", digest):
        raise ValueError(f"not an image digest: {image_id!r}")
    return f"{engine}-{digest[:12]}-{arch}"


def environment(engine: str) -> dict[str, str]:
    """The engine's cache variables, inside the container."""
    return {name: f"{CACHE_MOUNT}/{sub}" for name, sub in VARIABLES[engine].items()}


@dataclass(frozen=True)
class Entry:
    """One cache folder on the host: its name, when a start last used it (epoch s) and its bytes."""

    name: str
    used: float
    size: int


def to_prune(entries: list[Entry], current: str, keep: int = KEEP, max_bytes: int = int(MAX_GB * GB)) -> list[str]:
    """The folders to remove, oldest use first: beyond the newest KEEP, then while all of them together
    exceed MAX_BYTES. The current image's is never removed (it is in use). Folders that are not caches
    (another name) are left alone."""
    ours = sorted((e for e in entries if _KEY.match(e.name)), key=lambda e: e.used, reverse=True)
    mine = sum(e.size for e in ours if e.name == current)  # the current one counts, made now or not
    others = [e for e in ours if e.name != current]
    room = max(keep, 1) - 1
    gone = [e.name for e in others[room:]]
    kept = others[:room]
    while kept and mine + sum(e.size for e in kept) > max_bytes:
        gone.append(kept.pop().name)
    return gone


def listing_script(root: str) -> str:
    """Prints `gpu <compute_cap>` for each GPU nvidia-smi answers for, then `<last use epoch> <bytes> <name>`
    for each folder under ROOT (none when ROOT is missing)."""
    smi = "nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sed 's/^/gpu /'"
    return (f"{smi}; cd {shlex.quote(root)} 2>/dev/null || exit 0; for d in */; do d=${{d%/}}; "
            f"[ -d \"$d\" ] || continue; "
            f"printf '%s %s %s\\n' \"$(stat -c %Y \"$d\")\" \"$(du -sb \"$d\" | cut -f1)\" \"$d\"; done")  # fmt: skip


def parse_listing(text: str) -> tuple[list[str], list[Entry]]:
    """(the GPUs' compute capabilities, the cache folders) from listing_script's output."""
    caps, entries = [], []
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "gpu" and len(parts) == 2:
            caps.append(parts[1])
        elif len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            entries.append(Entry(parts[2], float(parts[0]), int(parts[1])))
    return caps, entries


def prepare_script(root: str, current: str, remove: list[str]) -> str:
    """Makes ROOT/CURRENT, marks it used now (its mtime: the pruning's clock) and removes REMOVE."""
    folder = shlex.quote(f"{root}/{current}")
    gone = " ".join(shlex.quote(f"{root}/{name}") for name in remove)
    return f"mkdir -p {folder} && touch {folder}" + (f" && rm -rf -- {gone}" if gone else "")


@dataclass(frozen=True)
class Prepared:
    """A start's cache on the host: its folder, whether an earlier start left anything in it, and what
    the pruning removed."""

    key: str
    path: str
    warm_bytes: int  # what the folder held before this start (0: a cold start)
    removed: tuple[str, ...]

    def says(self) -> str:
        state = (f"warm, {self.warm_bytes / 1024**2:.0f} MiB kept by an earlier start" if self.warm_bytes
                 else "cold: the first start of this image here")  # fmt: skip
        pruned = f"; removed {', '.join(self.removed)} (serving_engine_cache_keep / _max_gb)" if self.removed else ""
        return f"engine cache {self.key}: {state}{pruned}"


def prepare(host: CommandHost, state_dir: str, engine: str, image_id: str, *, keep: int, max_gb: float) -> Prepared:
    """This image's cache folder on HOST, made and marked used, and the pruning done (as root: the state
    folder is root's), in two commands there: the GPUs' architecture and the listing, then the change."""
    root = f"{state_dir.rstrip('/')}/{FOLDER}"

    def as_root(script: str, what: str) -> str:
        try:
            proc = subprocess.run(host.as_root("sh", "-c", script), capture_output=True, text=True, timeout=120,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise SpecdeployError(f"{host} did not answer within 120 s while {what}",
                                  hint="check the host, then rerun: make deploy") from exc  # fmt: skip
        if proc.returncode != 0:
            hint = "check SSH and sudo on the host, or set serving_engine_cache: false"
            raise SpecdeployError(f"{what} on {host} failed: {proc.stderr.strip()[-300:]}", hint=hint)
        return proc.stdout

    caps, entries = parse_listing(as_root(listing_script(root), f"listing {root}"))
    name = key(engine, image_id, architecture(caps))
    warm = next((e.size for e in entries if e.name == name), 0)
    gone = to_prune(entries, name, keep, int(max_gb * GB))
    as_root(prepare_script(root, name, gone), f"preparing {root}/{name}")
    return Prepared(name, f"{root}/{name}", warm if warm > 64 * 1024 else 0, tuple(gone))
