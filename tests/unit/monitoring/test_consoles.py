"""specdeploy.monitoring.consoles: Prometheus's targets answer in words, and no monitoring group refused
before any SSH."""

from __future__ import annotations

import re

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.monitoring import consoles


def target(job: str, host: str, health: str, error: str = "") -> dict:
    return {"labels": {"job": job, "host": host, "instance": f"{host}:8000"}, "health": health, "lastError": error}


def test_prometheus_state_counts_the_up_targets_and_names_the_others() -> None:
    answer = {"status": "success", "data": {"activeTargets": [
        target("engine", "gpu-1", "up"), target("engine", "gpu-2", "down", "connection refused"),
        target("router", "gpu-1", "up"), target("sentinel", "gpu-1", "unknown")]}}  # fmt: skip
    said = consoles.prometheus_state(answer)
    assert said.startswith("2 of 4 scrape targets up; not up: ")
    assert "engine@gpu-2: connection refused" in said and "sentinel@gpu-1: unknown" in said
    assert "router" not in said


def test_all_up_says_so_and_nothing_else() -> None:
    answer = {"data": {"activeTargets": [target("engine", "gpu-1", "up")]}}
    assert consoles.prometheus_state(answer) == "1 of 1 scrape targets up"


def test_no_monitoring_group_is_refused_with_the_way_to_add_one() -> None:
    with pytest.raises(SpecdeployError) as raised:
        consoles.open_consoles({"gpu-1": {"ansible_host": "10.0.0.1"}}, [], 9090)
    assert "no `monitoring` group" in str(raised.value) and "--tags monitoring" in str(raised.value.hint)


def test_the_inventorys_port_is_taken_when_it_is_a_number_and_a_template_is_refused_by_name() -> None:
    assert consoles.remote_port("gpu-1", "monitoring_prometheus_port", None, 9090) == 9090
    assert consoles.remote_port("gpu-1", "monitoring_prometheus_port", "9190", 9090) == 9190
    assert consoles.remote_port("gpu-1", "monitoring_prometheus_port", 9290, 9090) == 9290
    with pytest.raises(SpecdeployError, match=re.escape("gpu-1: monitoring_prometheus_port is '{{ port }}'")):
        consoles.remote_port("gpu-1", "monitoring_prometheus_port", "{{ port }}", 9090)
