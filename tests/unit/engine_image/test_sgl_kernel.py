"""The SGLang kernel decision from each library's CUDA targets (the real wheel: tests/integration)."""

from __future__ import annotations

from specdeploy.engine_image.sgl_kernel import BUILD_EXIT, decide

# The shape the real sglang-kernel 0.4.10 wheel has (tests/integration/test_sgl_kernel.py reads it).
LIBS = {
    "sgl_kernel/sm90/common_ops.abi3.so": ["sm_100", "sm_120a", "sm_80", "sm_90a"],
    "sgl_kernel/flash_ops.abi3.so": ["sm_80", "sm_86", "sm_90a"],
    "sgl_kernel/flashmla_ops.abi3.so": ["sm_100", "sm_90a"],
}


def test_auto_keeps_a_wheel_whose_common_ops_has_sm120_and_advises_the_backends():
    report = decide(LIBS)
    assert report.action == "keep" and "common_ops" in report.reasons[0]
    assert report.advice["attention_backend"] == "triton" == report.advice["speculative_draft_attention_backend"]
    assert "flash_ops.abi3.so" in report.advice["reason"] and "fa3" in report.advice["reason"]
    lines = report.lines()
    assert "sgl_kernel/flash_ops.abi3.so: NO sm_120 (sm_80, sm_86, sm_90a)" in lines
    assert lines[-1].startswith("decision (auto): keep")


def test_a_wheel_without_sm120_gives_build_and_the_modes_force_it():
    old = {name: [a for a in arches if not a.startswith("sm_120")] for name, arches in LIBS.items()}
    assert decide(old).action == "build"
    assert decide(LIBS, "always").action == "build" and decide(old, "never").action == "keep"
    everything = {name: [*arches, "sm_120a"] for name, arches in LIBS.items()}
    assert decide(everything).advice == {}
    assert BUILD_EXIT == 10
