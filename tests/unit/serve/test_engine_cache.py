"""The engine cache kept per host and image (specdeploy.serve.engine_cache): its key, what each engine's
container gets, the pruning, and the host's side run by a real shell here."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from specdeploy.connection import CommandHost
from specdeploy.serve import engine_cache
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.engine_cache import CACHE_MOUNT, Entry

DIGEST = "sha256:" + "ab12" * 16
BASE = {"image": "img:1", "model_path": "/srv/models/target", "served_model_name": "m", "speculative_method": "eagle3",
        "num_speculative_tokens": 3}  # fmt: skip


def test_the_key_is_the_engine_the_image_digest_and_the_gpus_architecture() -> None:
    assert engine_cache.key("vllm", DIGEST, "sm90") == "vllm-ab12ab12ab12-sm90"
    assert engine_cache.architecture(["9.0", "9.0"]) == "sm90"
    assert engine_cache.architecture(["12.0", "9.0 "]) == "sm120-sm90"  # a mixed host: its own key
    assert engine_cache.architecture([]) == engine_cache.architecture(["[N/A]"]) == "cpu"
    with pytest.raises(ValueError, match="not an image digest"):
        engine_cache.key("vllm", "specdeploy/engine:latest", "sm90")  # a tag may move: never a cache's key


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_engines_container_mounts_the_cache_and_points_its_own_variables_into_it(engine: str) -> None:
    cfg = ServingConfig.from_vars({**BASE, "engine": engine, "cache_dir": "/state/engine-cache/k"})
    kwargs = cfg.container_kwargs(DIGEST)
    assert kwargs["volumes"]["/state/engine-cache/k"] == {"bind": CACHE_MOUNT, "mode": "rw"}
    env = kwargs["environment"]
    own = "VLLM_CACHE_ROOT" if engine == "vllm" else "SGLANG_CACHE_DIR"
    assert env[own].startswith(CACHE_MOUNT + "/")
    for name in ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH"):
        assert env[name].startswith(CACHE_MOUNT + "/")
    # each its own folder; SGLang's JIT kernels have their own variable, which SGLANG_CACHE_DIR does not move
    assert len({env[n] for n in engine_cache.VARIABLES[engine]}) == {"vllm": 4, "sglang": 5}[engine]
    assert engine != "sglang" or env["SGLANG_JIT_CACHE_DIR"].startswith(CACHE_MOUNT + "/")
    off = cfg.speculation_off().container_kwargs(DIGEST)  # the benchmark's baseline: the same cache
    assert off["volumes"] == kwargs["volumes"] and off["environment"] == env
    none = ServingConfig.from_vars({**BASE, "engine": engine}).container_kwargs(DIGEST)
    assert CACHE_MOUNT not in str(none["volumes"]) and own not in none["environment"]


def test_an_operators_own_variable_wins_and_the_cache_changes_no_digest() -> None:
    mine = ServingConfig.from_vars({**BASE, "engine": "vllm", "cache_dir": "/c", "env": {"TRITON_CACHE_DIR": "/t"}})
    assert mine.environment()["TRITON_CACHE_DIR"] == "/t"
    plain = ServingConfig.from_vars({**BASE, "engine": "vllm"})
    assert ServingConfig.from_vars({**BASE, "engine": "vllm", "cache_dir": "/c"}).digest() == plain.digest()


RANKS = ({}, {"nnodes": 2, "node_rank": 0, "master_addr": "10.0.0.1"},
         {"nnodes": 2, "node_rank": 1, "master_addr": "10.0.0.1"})  # fmt: skip


def test_nothing_per_run_or_per_rank_reaches_the_variables_vllm_hashes_into_its_compile_cache() -> None:
    """vLLM 0.33 hashes every VLLM_* variable it knows, less those its envs.compile_factors ignores
    (VLLM_CACHE_ROOT, VLLM_API_KEY, VLLM_HOST_IP, ...; held to the wheel by
    tests/integration/test_engine_words.py): one differing between two starts of one image makes the
    second cold. The rollout, its baseline and every rank of a group render the same ones."""
    ignored = set(engine_cache.VLLM_UNHASHED)
    starts = [
        ServingConfig.from_vars({**BASE, "engine": "vllm", "cache_dir": "/c", "api_key": key, **rank})
        for key in ("k1", "k2")
        for rank in RANKS
    ]
    starts += [s.speculation_off() for s in starts]
    hashed = [{k: v for k, v in s.environment().items() if k.startswith("VLLM_") and k not in ignored} for s in starts]
    assert all(h == hashed[0] for h in hashed)
    assert "VLLM_CACHE_ROOT" in starts[0].environment() and "VLLM_CACHE_ROOT" in ignored


def test_the_pruning_keeps_the_newest_few_within_the_bound_and_never_the_current() -> None:
    gib = 1024**3
    entries = [Entry(f"vllm-{n:012x}-sm90", used=1000 + n, size=10 * gib) for n in range(5)]
    current = entries[0].name  # the oldest use, but this start's
    assert engine_cache.to_prune(entries, current, keep=3, max_bytes=100 * gib) == [entries[2].name, entries[1].name]
    assert engine_cache.to_prune(entries, current, keep=3, max_bytes=25 * gib) == [
        entries[2].name, entries[1].name, entries[3].name]  # fmt: skip
    assert engine_cache.to_prune(entries, current, keep=1, max_bytes=1) == [e.name for e in entries[4:0:-1]]
    stranger = [Entry("lost+found", 0, 1), Entry("notes", 0, gib * 1000)]
    assert engine_cache.to_prune([*entries[:1], *stranger], current, keep=1, max_bytes=1) == []


def test_the_host_side_lists_prepares_and_prunes_with_a_real_shell(tmp_path: Path) -> None:
    root = tmp_path / "state" / engine_cache.FOLDER
    old = root / f"vllm-{'0' * 12}-cpu"
    (old / "vllm").mkdir(parents=True)
    (old / "vllm" / "artifact").write_bytes(b"x" * 200_000)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    host = CommandHost()  # here: the commands run on this machine, as root or through sudo -n
    first = engine_cache.prepare(host, str(tmp_path / "state"), "vllm", DIGEST, keep=1, max_gb=1)
    assert first.key == "vllm-ab12ab12ab12-" + first.key.rsplit("-", 1)[1]
    assert first.path == f"{root}/{first.key}" and Path(first.path).is_dir()
    assert first.warm_bytes == 0 and first.removed == (old.name,) and not old.exists()  # keep=1: only this one
    assert "cold" in first.says() and old.name in first.says()
    (Path(first.path) / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (Path(first.path) / "vllm" / "torch_compile_cache" / "graph").write_bytes(b"y" * 300_000)
    again = engine_cache.prepare(host, str(tmp_path / "state"), "vllm", DIGEST, keep=1, max_gb=1)
    assert again.key == first.key and again.warm_bytes >= 300_000 and again.removed == ()
    assert again.says() == f"engine cache {first.key}: warm, 0 MiB kept by an earlier start"
    caps, entries = engine_cache.parse_listing(
        engine_cache.subprocess.run(["sh", "-c", engine_cache.listing_script(str(root))], capture_output=True,
                                    text=True, check=True).stdout)  # fmt: skip
    assert [e.name for e in entries] == [first.key] and all(c for c in caps)
    missing = engine_cache.subprocess.run(["sh", "-c", engine_cache.listing_script(str(tmp_path / "none"))],
                                          capture_output=True, text=True, check=True)  # fmt: skip
    assert engine_cache.parse_listing(missing.stdout)[1] == []
