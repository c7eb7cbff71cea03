"""The P2P verdict (specdeploy.gpu.p2p) on the real one-GPU capture from the H200 and on figure
sets shaped as the probe prints them for the cases a multi-GPU host shows: ok, broken (wrong data,
a failed all-reduce), slow (the IOMMU/ACS redirect), no peer access, and a probe that hangs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdeploy.gpu import p2p
from specdeploy.gpu.p2p_probe import SCHEMA

H200 = json.loads((Path(__file__).parents[2] / "data" / "p2p" / "h200-x1-p2p-probe.json").read_text())


def pair(src: int, dst: int, *, direct: float = 50.0, staged: float = 20.0, access: bool = True,
         correct: bool = True) -> dict[str, object]:  # fmt: skip
    return {"src": src, "dst": dst, "bytes": 1 << 28, "peer_access": access, "direct_gbps": direct,
            "staged_gbps": staged, "direct_correct": correct, "staged_correct": True}  # fmt: skip


def host(pairs: list[dict[str, object]], on: dict[str, object] | None = None,
         off: dict[str, object] | None = None) -> dict[str, object]:  # fmt: skip
    runs = [{"p2p": True, "correct": True, "bus_gbps": 40.0, **(on or {})},
            {"p2p": False, "correct": True, "bus_gbps": 15.0, **(off or {})}]  # fmt: skip
    return {"schema": SCHEMA, "gpus": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 2, "pairs": pairs,
            "all_reduce": runs}  # fmt: skip


def test_the_real_one_gpu_capture_has_no_pair_and_needs_no_flag():
    verdict = p2p.judge(H200)
    assert verdict.value == "no-p2p" and "one GPU" in verdict.reason
    assert verdict.env == {} and verdict.vllm_args == []
    assert verdict.facts == [
        "all-reduce (P2P on): right sum, bus 0.0 GB/s",
        "all-reduce (NCCL_P2P_DISABLE=1): right sum, bus 0.0 GB/s",
    ]


def test_proven_p2p_keeps_it_on_and_skips_vllms_own_check():
    verdict = p2p.judge(host([pair(0, 1), pair(1, 0)]))
    assert verdict.value == "p2p-ok" and verdict.env == {"VLLM_SKIP_P2P_CHECK": "1"} and verdict.vllm_args == []
    assert (
        verdict.facts[0]
        == "GPU0->GPU1: peer access yes, 50.0 GB/s direct vs 20.0 GB/s through host memory, data correct"
    )
    assert verdict.serving()["reason"].startswith("p2p-ok: ")


@pytest.mark.parametrize(("figures", "why"), [
    (host([pair(0, 1, correct=False), pair(1, 0)]), "a peer copy delivered wrong data"),
    (host([pair(0, 1), pair(1, 0)], on={"correct": False}), "all-reduce with P2P on failed or summed wrong"),
    (host([pair(0, 1), pair(1, 0)], on={"error": "DistBackendError: NCCL error"}), "failed or summed wrong"),
    (host([pair(0, 1, direct=3.1, staged=20.0), pair(1, 0)]), "slower than staging through host memory (worst GPU0->GPU1: 3.1 vs 20.0 GB/s)"),  # noqa: E501
    (host([pair(0, 1), pair(1, 0)], on={"bus_gbps": 5.0}), "slower with P2P on (5.0 GB/s) than off (15.0 GB/s)"),
])  # fmt: skip
def test_broken_p2p_goes_through_host_memory_and_names_the_fix(figures, why):
    verdict = p2p.judge(figures)
    assert verdict.value == "p2p-broken" and why in verdict.reason
    assert verdict.env == {"NCCL_P2P_DISABLE": "1"} and verdict.vllm_args == ["--disable-custom-all-reduce"]
    assert "iommu=pt" in verdict.reason and "ECAP_ACS+6.w=0000" in verdict.reason and "nccl#2079" in verdict.reason


def test_no_peer_access_turns_custom_all_reduce_off_and_leaves_nccl_to_route():
    verdict = p2p.judge(host([pair(0, 1, access=False), pair(1, 0, access=False)]))
    assert verdict.value == "no-p2p" and "2 of 2 GPU pairs" in verdict.reason
    assert verdict.env == {} and verdict.sglang_args == ["--disable-custom-all-reduce"]


def test_a_probe_that_hangs_is_a_broken_verdict_within_its_timeout():
    hang = [sys.executable, "-c", "import time; time.sleep(30)"]
    verdict = p2p.run_probe(hang, timeout_s=0.5)
    assert verdict.value == "p2p-broken" and "did not finish" in verdict.reason
    crashed = p2p.run_probe([sys.executable, "-c", "import sys; sys.exit('CUDA error: peer mapping')"])
    assert crashed.value == "p2p-broken" and "CUDA error: peer mapping" in crashed.reason
    printed = p2p.run_probe([sys.executable, "-c", f"print({json.dumps(json.dumps(H200))})"])
    assert printed.value == "no-p2p"


def test_the_operator_override():
    measured = p2p.judge(host([pair(0, 1, direct=3.0), pair(1, 0)]))
    assert p2p.override(measured, "auto") is measured
    assert p2p.override(measured, "on").env == {} and "override of: p2p-broken" in p2p.override(measured, "on").reason
    assert p2p.override(p2p.judge(host([pair(0, 1), pair(1, 0)])), "off").env == {"NCCL_P2P_DISABLE": "1"}
    # The role's serving_p2p over the settings it holds (a verdict's serving() shape): named as the verdict was.
    settings = measured.serving()
    assert p2p.override_settings(settings, "auto") is settings
    on = p2p.override_settings(settings, "on")
    assert on["reason"] == "p2p-ok: serving_p2p: on (the operator's override of: p2p-broken)" and on["env"] == {}
    assert p2p.override_settings({}, "off")["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert (p2p.mode(False), p2p.mode(True), p2p.mode("auto")) == ("off", "on", "auto")  # YAML's unquoted off/on
    with pytest.raises(ValueError, match="auto, on, off"):
        p2p.override(measured, "maybe")
