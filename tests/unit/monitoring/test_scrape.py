"""What Prometheus scrapes, from the inventory's composed serving variables."""

from __future__ import annotations

from specdeploy.monitoring import scrape
from specdeploy.monitoring.targets import EngineTarget

HOSTVARS = {
    "gpu-1": {"ansible_host": "10.0.0.1", "serving_config": {"engine": "vllm", "port": 8000, "node_rank": 0,
                                                             "speculative_method": "eagle3"}},
    "gpu-2": {"ansible_host": "10.0.0.2", "serving_fleet_address": "192.168.1.2",
              "serving_config": {"engine": "sglang", "port": 30000, "node_rank": 0, "speculative_method": "none"}},
    "gpu-3": {"ansible_host": "10.0.0.3", "serving_config": {"engine": "vllm", "port": 8000, "node_rank": 1}},
    "router": {"ansible_host": "10.0.0.9"},
}  # fmt: skip


def test_every_engine_api_is_a_target_at_the_fleets_address_and_headless_ranks_are_not() -> None:
    targets = scrape.engine_targets(list(HOSTVARS), HOSTVARS)
    assert targets == [
        EngineTarget("gpu-1", "vllm", "10.0.0.1:8000", speculative=True),
        EngineTarget("gpu-2", "sglang", "192.168.1.2:30000", speculative=False),
    ]


def test_the_engine_on_the_monitoring_host_itself_is_reached_on_loopback() -> None:
    """Its API binds 127.0.0.1 by default: its own name (10.0.0.1 here) would not reach it."""
    targets = scrape.engine_targets(list(HOSTVARS), HOSTVARS, monitoring_host="gpu-1")
    assert [t.address for t in targets] == ["127.0.0.1:8000", "192.168.1.2:30000"]


def test_the_configuration_labels_each_target_with_its_host_and_keeps_the_router_host_parts_local() -> None:
    targets = scrape.engine_targets(list(HOSTVARS), HOSTVARS)
    config = scrape.prometheus_config(targets, "router", scrape.Ports(router_metrics=29000, sentinel=8081))
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs[scrape.ENGINE_JOB]["static_configs"] == [
        {"targets": ["10.0.0.1:8000"], "labels": {"host": "gpu-1", "engine": "vllm"}},
        {"targets": ["192.168.1.2:30000"], "labels": {"host": "gpu-2", "engine": "sglang"}},
    ]
    assert jobs[scrape.ROUTER_JOB]["static_configs"][0]["targets"] == ["127.0.0.1:29000"]
    assert jobs[scrape.SENTINEL_JOB]["honor_labels"] is True  # its series name the worker's host
    assert config["rule_files"] == [scrape.RULES_PATH]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    alone = scrape.prometheus_config(targets, "gpu-1", scrape.Ports())
    assert {j["job_name"] for j in alone["scrape_configs"]} == {scrape.ENGINE_JOB, "prometheus", "alertmanager"}
