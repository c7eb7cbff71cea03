"""Serving state (`make verify` after `make deploy`): the engine container runs the recorded image,
its port answers, the model is listed, the rollout record proves it READY, and the image's patch
manifest and drafter digest match what the inventory says. Each check names what is wrong."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
from testinfra.host import Host

from specdeploy import names, proof
from specdeploy.engine_image import drafter, profiles
from specdeploy.serve.config import ServingConfig

CONTAINER = names.ENGINE_CONTAINER


@pytest.fixture
def record(host: Host, hostvars: dict[str, Any]) -> dict[str, Any]:
    path = hostvars.get("serving_state_dir", names.SERVING_STATE_DIR) + "/current.json"
    state = host.file(path)
    assert state.exists, f"{path} is missing: nothing was deployed on this host (make deploy)"
    return dict(json.loads(state.content_string))


def _inspect(host: Host, what: str, fmt: str) -> str:
    out = host.run(f"docker inspect --format '{fmt}' {what}")
    assert out.rc == 0, f"docker inspect {what}: {out.stderr.strip()}"
    return str(out.stdout).strip()


def test_engine_container_runs_the_recorded_image(host: Host, record: dict[str, Any]) -> None:
    state = host.run(f"docker inspect --format '{{{{.State.Status}}}}' {CONTAINER}")
    assert state.rc == 0, f"the engine container {CONTAINER} does not exist: {state.stderr.strip()}"
    assert state.stdout.strip() == "running", f"{CONTAINER} is {state.stdout.strip()}, not running"
    assert _inspect(host, CONTAINER, "{{.Image}}") == record["image_id"], "the engine runs another image than recorded"


def _get(host: Host, record: dict[str, Any], path: str) -> tuple[int, str]:
    cfg = ServingConfig.from_vars(record["config"])
    if not cfg.serves_api:
        pytest.skip(f"rank {cfg.node_rank} of a multi-node engine runs headless: its API is rank 0's")
    port = int(record["config"]["port"])
    script = (
        "import sys, urllib.request, urllib.error\n"
        f"try:\n    r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=10)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    out = host.run(f"python3 -c {shlex.quote(script)}")
    assert out.rc == 0, f"port {port} does not answer on the host: {out.stderr.strip()[-300:]}"
    code, _, body = out.stdout.partition("\n")
    return int(code), body


def test_api_port_answers(host: Host, record: dict[str, Any]) -> None:
    code, _ = _get(host, record, "/health")
    assert code == 200, f"/health answered {code}"


def test_engine_answers_a_completion(host: Host, record: dict[str, Any], hostvars: dict[str, Any]) -> None:
    """Serving is answering: a real completion in bounded time and no engine process stopped or stuck
    (specdeploy.proof, run on the host). /health alone is not proof: a frozen engine core's API still says 200."""
    state_dir = hostvars.get("serving_state_dir", names.SERVING_STATE_DIR)
    out = host.run(proof.as_root("python3", "-c", proof.on_host_script(), CONTAINER, state_dir))
    lines = str(out.stdout).strip().splitlines()
    assert out.rc == 0 and lines, f"the proof of serving could not run on the host: {out.stderr.strip()[-300:]}"
    found = proof.Proof.from_json(lines[-1])
    assert found.serves, f"the engine {CONTAINER} does not serve: {found.said}"


def test_model_is_listed(host: Host, record: dict[str, Any]) -> None:
    code, body = _get(host, record, "/v1/models")
    if record["config"].get("api_key_set"):
        assert code == 401, f"/v1/models answered {code} without the API key"
        return
    assert code == 200, f"/v1/models answered {code}"
    listed = [m["id"] for m in json.loads(body)["data"]]
    assert record["config"]["served_model_name"] in listed, f"served model not listed: {listed}"


def test_image_patch_manifest_and_drafter_match_the_inventory(
    host: Host, record: dict[str, Any], hostvars: dict[str, Any]
) -> None:
    labels = json.loads(_inspect(host, record["image_id"], "{{json .Config.Labels}}"))
    # The inventory's values win; the serving record holds what the deploy used.
    prof = profiles.profile(
        hostvars.get("engine_image_profile") or record.get("engine_image_profile") or profiles.DEFAULT
    )
    assert labels[names.PATCH_DIGEST_LABEL] == profiles.expected_patch_digest(prof), "patch manifest differs"
    path = hostvars.get("engine_image_drafter_path") or record.get("engine_image_drafter_path")
    assert path, "the drafter's folder is unknown: set engine_image_drafter_path, or redeploy (make deploy records it)"
    out = host.run(f"cd {path} && find . -type f -exec sha256sum {{}} +")
    assert out.rc == 0, f"cannot hash the drafter at {path}: {out.stderr.strip()}"
    files = {name.removeprefix("./"): sha for sha, name in (line.split(None, 1) for line in out.stdout.splitlines())}
    assert labels[names.DRAFTER_DIGEST_LABEL] == drafter.digest(files), f"the image's drafter is not {path}"


def test_engine_is_proven_ready_in_the_rollout_record(host: Host, hostvars: dict[str, Any]) -> None:
    """Converged means proven: the rollout finished and the running container is its READY version."""
    path = hostvars.get("serving_state_dir", names.SERVING_STATE_DIR) + "/rollout.json"
    state = host.file(path)
    assert state.exists, f"{path} is missing: no rollout was recorded on this host (make deploy)"
    rollout = json.loads(state.content_string)
    assert rollout["phase"] == "done", f"the last rollout stopped in phase {rollout['phase']!r}: rerun make deploy"
    running = _inspect(host, CONTAINER, "{{.Id}}")
    ready = (rollout.get("last_ready") or {}).get("container_id")
    assert ready == running, f"{CONTAINER} ({running[:12]}) is not the version proven READY ({str(ready)[:12]})"
    started = (rollout.get("last_ready") or {}).get("started_at")
    if started:  # a rank of a multi-node engine: one that restarted alone never rejoined its group
        now = _inspect(host, CONTAINER, "{{.State.StartedAt}}")
        assert now == started, f"{CONTAINER} restarted alone at {now}, after its group was proven: make deploy"
    policy = _inspect(host, CONTAINER, "{{.HostConfig.RestartPolicy.Name}}")
    assert policy == "unless-stopped", f"{CONTAINER} has restart policy {policy!r}: it would not survive a reboot"
