"""specdeploy.serve.hosts: an inventory's groups read through the real ansible-inventory, and the status
lines."""

from __future__ import annotations

from pathlib import Path

from specdeploy.serve import hosts


def test_a_group_takes_child_groups_once_each_in_order(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpus:\n      hosts:\n        gpu-1: {ansible_host: 10.0.0.1}\n        gpu-2: {}\n"
        "    monitoring:\n      hosts:\n        gpu-2: {}\n      children:\n        extra:\n          hosts:\n"
        "            ops-1: {}\n            gpu-2: {}\n"
    )
    assert hosts.read(inventory).group("monitoring") == ["gpu-2", "ops-1"]
    assert hosts.read(inventory).group("nothing") == []
    assert hosts.inventory_hostvars(inventory)["gpu-1"]["ansible_host"] == "10.0.0.1"
    # one reading serves both (`make monitor` asked ansible-inventory twice)
    listed = hosts.read(inventory)
    assert listed.group("monitoring") == ["gpu-2", "ops-1"]
    assert listed.hostvars["gpu-2"] == {"inventory_hostname": "gpu-2"}


def test_status_lines_name_each_container_or_how_to_deploy_one() -> None:
    row = {"state": "running", "exit_code": 0, "restarts": 1, "tags": ["specdeploy/engine:vllm"],
           "image": "sha256:0123456789abcdef", "started_at": "2026-12-07T19:00:00Z"}  # fmt: skip
    lines = hosts.status_lines({"gpu-1": {"specdeploy-engine": row}, "gpu-2": {}})
    assert lines[0] == "gpu-1:" and "running" in lines[1] and "restarts=1" in lines[1]
    assert "image=specdeploy/engine:vllm" in lines[1]
    assert lines[2:] == ["gpu-2:", "  no engine container (deploy with: make deploy)"]
