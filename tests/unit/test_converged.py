"""A converged deploy proven by its ledger: the inputs' digest, and each host read as the last whole run
left it (specdeploy.converged). The host's probe itself runs here against a fake `docker` and a real
HTTP server for /health."""

from __future__ import annotations

import http.server
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specdeploy import converged

SERVING = {"rollout": "r1", "current": "c1", "drafter": "d1", "health": 200,
           "container": ["cid", "sha256:img", "running", "2026-12-03T09:00:00Z", "unless-stopped"]}  # fmt: skip
INVENTORY = """\
all:
  children:
    testbed:
      hosts:
        testbed-1: {ansible_host: 127.0.0.1, ansible_port: 2221, ansible_user: deploy}
      vars: {ansible_ssh_common_args: -o StrictHostKeyChecking=yes}
"""


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "checkout"
    for rel in ("roles/serving/tasks/main.yml", "src/specdeploy/cli.py", "ansible/site.yml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n")
    (root / "hosts.yml").write_text(INVENTORY)
    monkeypatch.setenv("SPECDEPLOY_STATE", str(tmp_path / "state"))
    return root


def test_the_inputs_digest_moves_with_every_input_and_nothing_else(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = checkout / "hosts.yml"
    first = converged.inputs_digest(checkout, inv, [])
    assert converged.inputs_digest(checkout, inv, []) == first
    cache = checkout / "src/specdeploy/__pycache__"
    cache.mkdir()
    (cache / "cli.cpython-311.pyc").write_bytes(b"\0")
    monkeypatch.setenv("SPECDEPLOY_MAKE_START", "123.4")  # set by make for every run
    assert converged.inputs_digest(checkout, inv, []) == first
    assert converged.inputs_digest(checkout, inv, ["serving_max_model_len=1024"]) != first
    monkeypatch.setenv("ANSIBLE_FORKS", "4")
    assert converged.inputs_digest(checkout, inv, []) != first
    monkeypatch.delenv("ANSIBLE_FORKS")
    (checkout / "roles/serving/tasks/main.yml").write_text("# changed\n")
    assert converged.inputs_digest(checkout, inv, []) != first


def test_only_a_generated_inventory_without_a_router_qualifies(checkout: Path) -> None:
    inv = checkout / "hosts.yml"
    hosts = converged.inventory_hosts(inv)
    assert hosts is not None and hosts["testbed-1"]["ansible_port"] == 2221
    assert hosts["testbed-1"]["ansible_ssh_common_args"] == "-o StrictHostKeyChecking=yes"
    inv.write_text(INVENTORY + "    router:\n      hosts:\n        testbed-1: {}\n")
    assert converged.inventory_hosts(inv) is None
    inv.write_text("[web]\nhost1\n")
    assert converged.inventory_hosts(inv) is None


EXITED = ["cid", "sha256:img", "exited", "2026-12-03T09:00:00Z", "unless-stopped"]
NOT_SERVING = [{"health": 503}, {"health": None}, {"container": EXITED},
               {"container": []}, {"rollout": ""}]  # fmt: skip


@pytest.mark.parametrize("change", NOT_SERVING)
def test_a_host_not_serving_is_not_converged(change: dict[str, Any]) -> None:
    assert converged.serving(SERVING)
    assert not converged.serving(SERVING | change)


def test_proven_only_while_every_host_reads_as_the_ledger_has_it(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = checkout / "hosts.yml"
    reading: dict[str, Any] = dict(SERVING)
    monkeypatch.setattr(converged, "read_host", lambda hv: dict(reading))
    digest = converged.inputs_digest(checkout, inv, [])
    assert converged.proven(inv, digest) is None  # no ledger yet: a whole run
    assert converged.remember(inv, digest)
    assert converged.proven(inv, digest) == {"testbed-1": SERVING}
    assert converged.proven(inv, "sha256:other") is None  # another input
    reading["rollout"] = "r2"  # the record moved on (a rollback, another rollout)
    assert converged.proven(inv, digest) is None
    reading.update(rollout="r1", container=["cid2", "sha256:img", "running", "unless-stopped"])
    assert converged.proven(inv, digest) is None  # another container
    reading.update(container=SERVING["container"], health=503)
    assert converged.proven(inv, digest) is None
    reading["health"] = 200
    assert converged.proven(inv, digest) is not None
    converged.forget(inv)
    assert converged.proven(inv, digest) is None


def test_nothing_is_remembered_from_a_host_that_is_not_serving(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = checkout / "hosts.yml"
    monkeypatch.setattr(converged, "read_host", lambda hv: SERVING | {"health": None})
    assert not converged.remember(inv, "sha256:x")
    assert not converged.ledger_file(inv).exists()


@pytest.fixture
def health_server() -> Iterator[int]:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_the_hosts_probe_reads_the_records_the_container_and_health(tmp_path: Path, health_server: int) -> None:
    """The script read_host runs on the host, run here: a fake docker CLI, a real /health."""
    state = tmp_path / "serving"
    state.mkdir()
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "SHA256SUMS").write_text("abc  model.safetensors\n")
    (state / "rollout.json").write_text("{}\n")
    current = {"config": {"port": health_server}, "engine_image_drafter_path": str(drafter)}
    (state / "current.json").write_text(json.dumps(current))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_docker = bin_dir / "docker"
    fake_docker.write_text("#!/bin/sh\necho 'cid sha256:img running 2026-12-03T09:00:00Z unless-stopped'\n")
    fake_docker.chmod(fake_docker.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-c", converged._PROBE, str(state), "specdeploy-engine"], env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    found = json.loads(out)
    assert converged.serving(found)
    assert found["container"] == ["cid", "sha256:img", "running", "2026-12-03T09:00:00Z", "unless-stopped"]
    assert len(found["rollout"]) == 64 and len(found["drafter"]) == 64
    (state / "current.json").write_text(json.dumps({"config": {"port": 9}}))  # nothing listens on port 9
    found = json.loads(subprocess.run([sys.executable, "-c", converged._PROBE, str(state), "x"], env=env,
                                      capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert found["health"] is None and not converged.serving(found)
