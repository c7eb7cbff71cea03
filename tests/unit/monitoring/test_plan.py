"""The monitoring host's files, composed from the targets and the gate's records on the controller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdeploy import records
from specdeploy.monitoring import plan
from specdeploy.monitoring.alerts import AlertSettings
from specdeploy.monitoring.scrape import Ports
from specdeploy.monitoring.targets import EngineTarget

TARGET = EngineTarget("gpu-1", "vllm", "10.0.0.1:8000", speculative=True)


def figures(acceptance: float | None) -> dict:
    return {"completed": 8, "failed": 0, "duration_s": 10.0, "concurrency": 4, "max_tokens": 64,
            "output_tokens_per_s": 100.0, "ttft_ms": {"p50": 10.0, "p99": 20.0}, "itl_ms": {"p50": 5.0, "p99": 9.0},
            "acceptance_rate": 0.5, "acceptance_length": acceptance, "per_position_acceptance": [0.7, 0.5]}  # fmt: skip


def run(state: Path, name: str, passed: bool, acceptance: float | None) -> None:
    folder = records.host_runs("gpu-1", state) / name
    records.write_verdict(folder, {"verdict": "READY"})
    records.write_bench(folder, {"schema": 1, "time": name, "hardware": "1x H100", "figures": figures(acceptance),
                                 "gate": {"enabled": True, "passed": passed}, "speedup": {"1": 1.6, "64": 0.93}},
                        "gpu-1", f"engine:{name}")  # fmt: skip


def test_the_acceptance_alert_follows_the_last_passed_gate(tmp_path: Path) -> None:
    run(tmp_path, "20261207T100000", passed=True, acceptance=2.3)
    run(tmp_path, "20261207T110000", passed=False, acceptance=1.2)  # rolled back: not what serves
    files = plan.compose([TARGET], "router", Ports(), AlertSettings(), state=tmp_path)
    rules = yaml.safe_load(files.rules_yml)["groups"][0]["rules"]
    acceptance = [r for r in rules if r["alert"] == "SpecdeployAcceptanceBelowGate"]
    assert len(acceptance) == 1 and acceptance[0]["expr"].endswith("< 2.07")
    assert "engine:20261207T100000" in acceptance[0]["annotations"]["description"]
    board = json.loads(files.dashboards["specdeploy-vllm.json"])
    text = board["panels"][-1]["options"]["content"]
    assert "x1.60 at 1, x0.93 at 64" in text and "2.30" in text
    assert yaml.safe_load(files.prometheus_yml)["scrape_configs"][0]["static_configs"][0]["targets"] == [
        "10.0.0.1:8000"
    ]
    written = plan.write_dashboards(files, state=tmp_path)
    assert [p.name for p in written] == ["specdeploy-vllm.json"] and json.loads(written[0].read_text())["uid"]


def test_no_record_no_acceptance_alert_and_bad_thresholds_refused(tmp_path: Path) -> None:
    files = plan.compose([TARGET], "router", Ports(), AlertSettings(), state=tmp_path)
    assert "SpecdeployAcceptanceBelowGate" not in files.rules_yml and files.notes
    with pytest.raises(ValueError, match="monitoring_alert_error_ratio"):
        plan.compose([TARGET], "router", Ports(), AlertSettings(error_ratio=2.0), state=tmp_path)


class Tagged(str):
    """What ansible-core 2.19 hands a plugin: a str subclass (its data tagging), which yaml.safe_dump refuses."""


def test_values_ansible_hands_in_as_str_subclasses_are_written_as_plain_yaml(tmp_path: Path) -> None:
    target = EngineTarget(Tagged("gpu-1"), Tagged("vllm"), "10.0.0.1:8000", speculative=False)
    with pytest.raises(yaml.representer.RepresenterError):
        yaml.safe_dump({"host": target.host})
    files = plan.compose([target], Tagged("router"), Ports(), AlertSettings(), state=tmp_path)
    assert yaml.safe_load(files.prometheus_yml)["scrape_configs"][0]["static_configs"][0]["labels"]["host"] == "gpu-1"
