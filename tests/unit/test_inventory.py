from __future__ import annotations

import yaml

from specdeploy import inventory
from specdeploy.targets import SshSettings, Target, from_hostvars


def test_render_carries_verified_ssh_settings(tmp_path):
    ssh = SshSettings(known_hosts=(tmp_path / "kh",), identity_file=tmp_path / "id")
    hosts = [inventory.InventoryHost("h1", Target("127.0.0.1", "deploy", 2221))]
    doc = yaml.safe_load(inventory.render(hosts, ssh, group="testbed", source="test"))
    group = doc["all"]["children"]["testbed"]
    assert group["hosts"]["h1"] == {
        "ansible_host": "127.0.0.1",
        "ansible_port": 2221,
        "ansible_user": "deploy",
    }
    assert "StrictHostKeyChecking=yes" in group["vars"]["ansible_ssh_common_args"]
    assert group["vars"]["ansible_ssh_private_key_file"] == str(tmp_path / "id")


def test_write_is_idempotent(tmp_path):
    path = tmp_path / "sub" / "hosts.yml"
    assert inventory.write(path, "a\n") is True
    mtime = path.stat().st_mtime_ns
    assert inventory.write(path, "a\n") is False
    assert path.stat().st_mtime_ns == mtime
    assert inventory.write(path, "b\n") is True
    assert path.read_text() == "b\n"


def test_rendered_inventory_round_trips_to_ssh_settings(tmp_path):
    # Two known_hosts files: the option value holds a space and must survive Ansible's shlex split.
    ssh = SshSettings(known_hosts=(tmp_path / "a", tmp_path / "b"), identity_file=tmp_path / "id")
    hosts = [inventory.InventoryHost("gpu-1", Target("10.0.0.5", "deploy", 2200))]
    doc = yaml.safe_load(inventory.render(hosts, ssh, group="targets", source="test"))
    group = doc["all"]["children"]["targets"]
    hostvars = {**group["vars"], **group["hosts"]["gpu-1"], "inventory_hostname": "gpu-1"}
    target, settings = from_hostvars(hostvars)
    assert target == Target("10.0.0.5", "deploy", 2200)
    assert settings.identity_file == tmp_path / "id"
    assert settings.known_hosts[1] == tmp_path / "b"
