"""The alert rules: each engine in its own metric form, and the acceptance alert from the gate's record.
(promtool fires and quiets each rule in tests/integration/test_monitoring.py.)"""

from __future__ import annotations

import pytest
import yaml

from specdeploy.monitoring import alerts
from specdeploy.monitoring.alerts import AlertSettings
from specdeploy.monitoring.targets import EngineTarget, RecordedAcceptance
from tests.support import promtool_cases

VLLM = EngineTarget("gpu-1", "vllm", "10.0.0.1:8000", speculative=True)
SGLANG = EngineTarget("gpu-2", "sglang", "10.0.0.2:30000", speculative=True)
PLAIN = EngineTarget("gpu-3", "vllm", "10.0.0.3:8000", speculative=False)
RECORD = RecordedAcceptance("gpu-1", 2.3, "specdeploy/engine:abc", "1x H100 80GB HBM3", "d1", "2026-12-07T10:00:00Z")


def by_name(doc: dict, name: str) -> list[dict]:
    return [r for r in doc["groups"][0]["rules"] if r["alert"] == name]


def test_each_engine_gets_its_rules_in_its_own_metric_form() -> None:
    doc, _ = alerts.rule_file([VLLM, SGLANG], {}, AlertSettings(), router=False)
    frozen = {r["labels"]["engine"]: r["expr"] for r in by_name(doc, "SpecdeployEngineFrozen")}
    assert "vllm:num_requests_running" in frozen["vllm"] and "vllm:generation_tokens_total" in frozen["vllm"]
    assert "sglang:num_running_reqs" in frozen["sglang"] and "sglang:prompt_tokens_total" in frozen["sglang"]
    assert "[60s]" in frozen["vllm"]
    kv = {r["labels"]["engine"]: r["expr"] for r in by_name(doc, "SpecdeployKVCacheSaturated")}
    assert kv == {"vllm": "max by (host) (vllm:kv_cache_usage_perc) > 0.95",
                  "sglang": "max by (host) (sglang:token_usage) > 0.95"}  # fmt: skip
    assert not by_name(doc, "SpecdeployOutOfRouter")  # no router, no membership rule


def test_the_acceptance_alert_sits_below_the_gates_record_in_each_engines_form() -> None:
    sglang_record = RecordedAcceptance("gpu-2", 2.0, "img", "hw", "d2", "t")
    settings = AlertSettings(acceptance_fraction=0.9, acceptance_window_s=600)
    doc, notes = alerts.rule_file(
        [VLLM, SGLANG, PLAIN], {"gpu-1": RECORD, "gpu-2": sglang_record}, settings, router=True
    )
    rules = {r["labels"]["engine"]: r for r in by_name(doc, "SpecdeployAcceptanceBelowGate")}
    assert notes == []
    # vLLM: counters, a rate ratio (1 + accepted / drafts); SGLang: a gauge, averaged over the window.
    assert rules["vllm"]["expr"] == (
        '(1 + sum by (host) (rate(vllm:spec_decode_num_accepted_tokens_total{host="gpu-1"}[600s]))'
        ' / sum by (host) (rate(vllm:spec_decode_num_drafts_total{host="gpu-1"}[600s]))) < 2.07'
    )
    assert (
        rules["sglang"]["expr"]
        == '(avg by (host) (avg_over_time(sglang:spec_accept_length{host="gpu-2"}[600s]))) < 1.8'
    )
    assert "rate(sglang:spec_accept_length" not in rules["sglang"]["expr"]
    assert "2.30 the gate measured" in rules["vllm"]["annotations"]["description"]
    assert by_name(doc, "SpecdeployOutOfRouter") and by_name(doc, "SpecdeployRouterErrors")


def test_a_speculative_engine_without_a_record_gets_no_acceptance_rule_and_a_note() -> None:
    doc, notes = alerts.rule_file([VLLM, PLAIN], {}, AlertSettings(), router=False)
    assert not by_name(doc, "SpecdeployAcceptanceBelowGate")
    assert len(notes) == 1 and notes[0].startswith("gpu-1: no acceptance alert")  # the plain engine needs none


@pytest.mark.parametrize(("given", "said"), [
    ({"frozen_s": 0}, "monitoring_alert_frozen_s must be > 0"),
    ({"kv_saturated": 1.5}, "monitoring_alert_kv_saturated must be in (0, 1]"),
    ({"acceptance_fraction": 0}, "monitoring_alert_acceptance_fraction must be in (0, 1]"),
])  # fmt: skip
def test_thresholds_out_of_range_are_refused_by_name(given: dict, said: str) -> None:
    assert any(p.startswith(said) for p in AlertSettings.from_vars(given).problems())
    assert AlertSettings.from_vars({"frozen_s": "30", "kv_saturated": "0.9"}) == AlertSettings(
        frozen_s=30, kv_saturated=0.9
    )


def test_every_generated_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    """tests/support/alert_cases.yml (run by promtool on the test bed) covers each rule both ways."""
    spec = yaml.safe_load(promtool_cases.CASES.read_text())
    names = {r["alert"] for r in promtool_cases.rules_for(spec["context"])["groups"][0]["rules"]}
    covered = promtool_cases.covered()
    assert set(covered) == names
    assert all(outcomes == {True, False} for outcomes in covered.values()), covered
