"""Kimi-K2.5's files as the checkpoint ships them (specdeploy_testbed.real_files), held to the fixture
tests/data/kimi_k25/tensors.json (its sources in the README beside it) and read back by safetensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from specdeploy_testbed import real_files, real_shapes

FIXTURE = json.loads((Path(__file__).parents[2] / "data" / "kimi_k25" / "tensors.json").read_text())
LAYER = "language_model.model.layers.{n}."


def by_name(tensors: list[real_files.Tensor]) -> dict[str, list[Any]]:
    return {t.name: [t.dtype, list(t.shape)] for t in tensors}


def expected_layer(n: int, dense: bool) -> dict[str, list[Any]]:
    prefix = LAYER.format(n=n)
    kinds = ["attention", "dense_mlp"] if dense else ["attention", "moe"]
    out = {prefix + name: spec for kind in kinds for name, spec in FIXTURE[kind].items()}
    for e in range(0 if dense else 384):
        out |= {f"{prefix}mlp.experts.{e}.{name}": spec for name, spec in FIXTURE["expert"].items()}
    return out


def test_the_dense_layer_is_the_checkpoints() -> None:
    assert by_name(real_files.layer_tensors(real_shapes.TEXT, 0)) == expected_layer(0, dense=True)


def test_an_moe_layer_is_the_checkpoints_with_all_384_experts() -> None:
    tensors = real_files.layer_tensors(real_shapes.TEXT, 1)
    assert by_name(tensors) == expected_layer(1, dense=False)
    shapes = {t.name.rsplit(".", 2)[-2]: list(t.values) for t in tensors if t.name.startswith(f"{LAYER.format(n=1)}"
                                                                                                "mlp.experts.0.")
              and t.dtype == "I64"}  # fmt: skip
    assert shapes == FIXTURE["expert_weight_shape_values"]


def test_four_layers_are_one_file_a_layer_and_about_35_gb() -> None:
    text = {**real_shapes.TEXT, "num_hidden_layers": 4}
    files = real_files.shards(text)
    assert len(files) == 4
    assert by_name(files[0])["language_model.model.embed_tokens.weight"] == FIXTURE["top"][
        "language_model.model.embed_tokens.weight"]  # fmt: skip
    assert {n: s for n, s in by_name(files[-1]).items() if not n.startswith("language_model.model.layers")} == {
        k: v for k, v in FIXTURE["top"].items() if k != "language_model.model.embed_tokens.weight"}  # fmt: skip
    total = sum(t.nbytes for f in files for t in f)
    assert 34e9 < total < 36e9  # the "about 35 GB": 3 MoE layers of 384 experts, one dense, embeddings


SMALL = {**real_shapes.TEXT, "hidden_size": 64, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
         "qk_nope_head_dim": 8, "v_head_dim": 8, "num_attention_heads": 2, "intermediate_size": 96,
         "moe_intermediate_size": 32, "n_routed_experts": 3, "vocab_size": 40, "num_hidden_layers": 3}  # fmt: skip


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    monkeypatch.setattr(real_files, "BLOCK", 4096)  # a pattern shorter than a tensor: written in pieces
    return tmp_path, real_files.write_weights(tmp_path, SMALL)


def test_the_written_files_are_safetensors_the_library_reads(written: tuple[Path, dict[str, Any]]) -> None:
    folder, summary = written
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    expected = {t.name: t for f in real_files.shards(SMALL) for t in f}
    assert set(index["weight_map"]) == set(expected)
    assert summary["files"] == 3 and summary["tensors"] == len(expected)
    assert not list(folder.glob("*.part"))
    seen = set()
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(folder / name, framework="np") as f:  # the Rust reader checks every offset and size
            for key in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                seen.add(key)
                t = expected[key]
                if t.dtype == "I64":
                    assert f.get_tensor(key).tolist() == list(t.values)
                elif t.dtype == "F32":
                    assert np.isfinite(f.get_tensor(key)).all()
                elif t.dtype == "I32":
                    assert f.get_tensor(key).shape == t.shape
    assert seen == set(expected)
    assert summary["bytes"] == sum((folder / n).stat().st_size for n in set(index["weight_map"].values()))


def test_every_bf16_value_is_finite(written: tuple[Path, dict[str, Any]]) -> None:
    folder, _ = written
    path = folder / "model-00002-of-00003.safetensors"
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    assert size % 8 == 0
    for key, meta in header.items():
        if key == "__metadata__" or meta["dtype"] != "BF16":
            continue
        start, end = (8 + size + o for o in meta["data_offsets"])
        exponent = (np.frombuffer(raw[start:end], dtype="<u2") >> 7) & 0xFF
        assert (exponent != 0xFF).all(), key  # no inf, no NaN
        assert len(np.unique(np.frombuffer(raw[start:end], dtype="<u2"))) > 1  # not one repeated value


def test_the_packed_weights_are_not_zeros_nor_the_same_block_everywhere(written: tuple[Path, dict[str, Any]]) -> None:
    folder, _ = written
    with safe_open(folder / "model-00002-of-00003.safetensors", framework="np") as f:
        packed = f.get_tensor("language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed")
    assert packed.any()
    assert len(np.unique(packed)) > packed.size // 2
