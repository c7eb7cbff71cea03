"""The sentinel's own metrics, in the Prometheus text format."""

from __future__ import annotations

from specdeploy.fleet.sentinel_metrics import Tally


def test_probes_removals_and_membership_are_counted_per_host_with_few_labels() -> None:
    tally = Tally()
    tally.probed("gpu-1", "alive", 0.25)
    tally.probed("gpu-1", "frozen", 0.75)
    tally.moved("gpu-1", "remove", "frozen")
    tally.state("gpu-1", member=False, held=False)
    tally.moved("gpu-1", "add", "alive")
    text = tally.exposition()
    assert 'specdeploy_sentinel_probes_total{host="gpu-1",kind="frozen"} 1' in text
    assert 'specdeploy_sentinel_probe_seconds_sum{host="gpu-1"} 1' in text
    assert 'specdeploy_sentinel_probe_seconds_count{host="gpu-1"} 2' in text
    assert 'specdeploy_sentinel_removals_total{host="gpu-1",reason="frozen"} 1' in text
    assert 'specdeploy_sentinel_returns_total{host="gpu-1"} 1' in text
    assert 'specdeploy_sentinel_member{host="gpu-1"} 0' in text
    assert "# TYPE specdeploy_sentinel_probe_seconds summary" in text
    tally.forget("gpu-1")
    assert "specdeploy_sentinel_member{" not in tally.exposition()
    assert 'removals_total{host="gpu-1"' in tally.exposition()  # counters outlive the registration
