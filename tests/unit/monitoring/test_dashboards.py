"""The dashboards: every query from the engine's own metric form, acceptance per position where it exists."""

from __future__ import annotations

from specdeploy.monitoring import dashboards


def test_each_engine_has_its_panels_and_only_vllm_has_acceptance_per_position() -> None:
    vllm, sglang = dashboards.dashboard("vllm", [], {}), dashboards.dashboard("sglang", [], {})
    titles = [p["title"] for p in vllm["panels"]]
    assert "Acceptance per draft position" in titles and "Acceptance per draft position" not in [
        p["title"] for p in sglang["panels"]]  # fmt: skip
    assert all(q.count("vllm:") >= 1 and "sglang:" not in q for q in dashboards.queries("vllm"))
    assert all("sglang:" in q and "vllm:" not in q for q in dashboards.queries("sglang"))
    assert vllm["panels"][-1]["options"]["content"].startswith("No gate record yet")
    ids = [p["id"] for p in vllm["panels"]]
    assert ids == sorted(set(ids))
