"""A converged deploy proven by its ledger: the inputs' digest, and each host read as the last whole run
left it (specdeploy.converged), and every engine answering the proof of serving (specdeploy.proof, its
own tests in test_proof.py). The host's reading itself runs here against a fake `docker`."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specdeploy import converged
from specdeploy.proof import Proof

SERVING = {"rollout": "r1", "current": "c1", "drafter": "d1",
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
NOT_SERVING = [{"container": EXITED}, {"container": []}, {"rollout": ""}]
ANSWERS = Proof(True, "a 4-token completion answered in 0.05 s")
FROZEN = Proof(False, "engine process(es) stopped (state T): 41 VLLM::EngineCore; no answer to a 4-token completion "
               "in 15 s", 15.0, ["41 VLLM::EngineCore"])  # fmt: skip


@pytest.mark.parametrize("change", NOT_SERVING)
def test_a_host_not_serving_is_not_converged(change: dict[str, Any]) -> None:
    assert converged.serving(SERVING)
    assert not converged.serving(SERVING | change)


def test_proven_only_while_every_host_reads_as_the_ledger_has_it_and_answers(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = checkout / "hosts.yml"
    reading: dict[str, Any] = dict(SERVING)
    answer = [ANSWERS]
    monkeypatch.setattr(converged, "read_host", lambda hv: dict(reading))
    monkeypatch.setattr(converged, "prove_host", lambda hv: answer[0])
    digest = converged.inputs_digest(checkout, inv, [])
    assert converged.proven(inv, digest) == converged.Reading(None)  # no ledger yet: a whole run
    assert converged.remember(inv, digest)
    assert converged.proven(inv, digest) == converged.Reading({"testbed-1": SERVING}, {"testbed-1": ANSWERS})
    assert converged.proven(inv, "sha256:other").hosts is None  # another input
    reading["rollout"] = "r2"  # the record moved on (a rollback, another rollout)
    moved = converged.proven(inv, digest)
    assert moved.hosts is None and moved.why_not.startswith("testbed-1: its records or engine container moved")
    reading.update(rollout="r1", container=["cid2", "sha256:img", "running", "unless-stopped"])
    assert converged.proven(inv, digest).hosts is None  # another container
    reading.update(container=SERVING["container"])
    answer[0] = FROZEN  # /health would say 200: the proof does not
    frozen = converged.proven(inv, digest)
    assert frozen.hosts is None and frozen.why_not == f"testbed-1: {FROZEN.said}"
    answer[0] = ANSWERS
    assert converged.proven(inv, digest).hosts is not None
    converged.forget(inv)
    assert converged.proven(inv, digest).hosts is None


def test_nothing_is_remembered_from_a_host_that_is_not_serving(checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = checkout / "hosts.yml"
    monkeypatch.setattr(converged, "read_host", lambda hv: dict(SERVING))
    monkeypatch.setattr(converged, "prove_host", lambda hv: FROZEN)
    assert not converged.remember(inv, "sha256:x")
    assert not converged.ledger_file(inv).exists()


def test_the_hosts_probe_reads_the_records_and_the_container(tmp_path: Path) -> None:
    """The script read_host runs on the host, run here with a fake docker CLI."""
    state = tmp_path / "serving"
    state.mkdir()
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "SHA256SUMS").write_text("abc  model.safetensors\n")
    (state / "rollout.json").write_text("{}\n")
    current = {"config": {"port": 8000}, "engine_image_drafter_path": str(drafter)}
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
    assert converged.serving(found) and "health" not in found  # /health is no part of the proof
    assert found["container"] == ["cid", "sha256:img", "running", "2026-12-03T09:00:00Z", "unless-stopped"]
    assert len(found["rollout"]) == 64 and len(found["drafter"]) == 64
    fake_docker.write_text("#!/bin/sh\nexit 1\n")  # no such container
    found = json.loads(subprocess.run([sys.executable, "-c", converged._PROBE, str(state), "x"], env=env,
                                      capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert found["container"] == [] and not converged.serving(found)
