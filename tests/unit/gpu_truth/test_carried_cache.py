"""The engine cache carried between GPU machines (gpu_truth/carried_cache.py): out of one machine's $OUT,
kept here, seeded into the next start's folder only under the same key and only when whole."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gpu_truth import carried_cache
from gpu_truth import machine as gpu_machine

KEY = "sglang-190e9617cd32-sm90"
SO = random.Random(0).randbytes(1 << 16)  # a built module: does not compress


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store with one engine cache the way a start leaves it: a JIT build published, another still staging."""
    store = tmp_path / "store"
    monkeypatch.setattr(gpu_machine, "STORE", store)
    jit = store / "engine-cache" / KEY / "sglang-jit" / "sm90" / "moe_wna16_marlin"
    (jit / "build-abc").mkdir(parents=True)
    (jit / "build-abc" / "module.so").write_bytes(SO)
    (jit / ".staging-123").mkdir()
    (jit / ".staging-123" / "half.o").write_bytes(b"x")
    (store / "engine-cache" / KEY / "triton").mkdir()
    (store / "engine-cache" / KEY / "triton" / "k.cubin").write_bytes(b"cubin")
    return store


def _out_and_keep(tmp_path: Path, only: list[str]) -> Path:
    out = tmp_path / "out"
    carried_cache.cache_out("sglang", only, out=out)
    kept = tmp_path / "payload" / carried_cache.NAME
    carried_cache.keep(out, into=kept)
    return kept


def test_a_cache_goes_out_in_parts_and_seeds_a_fresh_machines_folder_of_the_same_key(
    machine: Path, tmp_path: Path
) -> None:
    kept = _out_and_keep(tmp_path, ["sglang-jit"])
    fresh = tmp_path / "fresh" / KEY
    fresh.mkdir(parents=True)
    assert carried_cache.seed(fresh, store=kept).startswith("seeded from the cache made")
    built = fresh / "sglang-jit/sm90/moe_wna16_marlin/build-abc/module.so"
    assert built.read_bytes() == SO
    assert not (fresh / "sglang-jit/sm90/moe_wna16_marlin/.staging-123").exists()  # a build in flight stays out
    assert not (fresh / "triton").exists()  # only what was asked
    assert carried_cache.seed(fresh, store=kept).startswith("seeded earlier")  # once


def test_another_key_or_a_damaged_part_seeds_nothing(machine: Path, tmp_path: Path) -> None:
    kept = _out_and_keep(tmp_path, [])
    other = tmp_path / "fresh" / "sglang-190e9617cd32-sm120"
    other.mkdir(parents=True)
    assert "not used" in carried_cache.seed(other, store=kept)
    assert list(other.iterdir()) == []
    same = tmp_path / "again" / KEY
    same.mkdir(parents=True)
    part = kept / "part-00"
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    assert "do not join" in carried_cache.seed(same, store=kept)
    assert list(same.iterdir()) == []
    part.unlink()
    assert "lacks part-00" in carried_cache.seed(same, store=kept)


def test_keep_refuses_a_part_that_came_back_damaged(machine: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    carried_cache.cache_out("sglang", [], out=out)
    (out / "part-00").write_bytes(b"damaged")
    with pytest.raises(SystemExit, match="differs from SHA256SUMS"):
        carried_cache.keep(out, into=tmp_path / "kept")
    assert not (tmp_path / "kept").exists()


def test_a_cache_too_big_for_what_out_returns_is_refused_with_nothing_written(
    machine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for n in range(6):  # a packed call's files already there: two left
        (out / f"f{n}.tgz").write_bytes(b"")
    monkeypatch.setattr(carried_cache, "PART_MIB", 0.001)  # about 1 KiB a part
    with pytest.raises(SystemExit, match="has room for 0"):
        carried_cache.cache_out("sglang", [], out=out)
    assert sorted(p.name for p in out.iterdir()) == [f"f{n}.tgz" for n in range(6)]
