"""Rollouts that survive their own faults, on the test bed with a real engine (`make test-faults`).

Each test injects a fault at a point of a real `make deploy` (SSH sessions killed, dockerd
SIGKILLed, the controller SIGKILLed, the host rebooted, bad versions, bad input) and asserts the
end state: a proven engine serves (recorded READY, restart policy set), or the last READY one does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from specdeploy_testbed import testbed
from tests.integration.helpers import CLI, ROOT, Result, record_timing, specdeploy
from tests.integration.test_serving import ENGINE, complete_and_count, engine_image_tag, remote

pytestmark = pytest.mark.integration
STATE = "/var/lib/specdeploy/serving/rollout.json"
FAULTS: list[str] = []  # "fault | end state | seconds to recover", for the README table


def host(docker_client):
    return docker_client.containers.get(testbed.container_name("testbed-1"))


def sh(docker_client, script: str) -> str:
    _, out = host(docker_client).exec_run(["sh", "-c", script])
    return out.decode(errors="replace")


def record(docker_client) -> dict:
    return json.loads(sh(docker_client, f"cat {STATE}") or "{}")


def variant(name: str, **extra) -> list[str]:
    """Extra vars that make a new version (another digest) of the same image."""
    values = {"serving_image": engine_image_tag(), "serving_env": {"VLLM_CPU_KVCACHE_SPACE": "1",
              "SPECDEPLOY_VARIANT": name}, **extra}  # fmt: skip
    return ["--tags", "deploy", "-e", json.dumps(values)]


def proven(docker_client) -> dict:
    """The engine serves a real completion, is recorded as the last READY version, has its policy."""
    container = remote().containers.get(ENGINE)
    rec = record(docker_client)
    assert container.status == "running", container.status
    assert rec["last_ready"]["container_id"] == container.id and rec["phase"] == "done", rec
    assert container.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
    text, _, _ = complete_and_count()
    assert text
    return rec


def deploy_with_fault(args: list[str], trigger: str, fault: Callable[[subprocess.Popen[str]], None],
                      delay_s: float = 3.0, timeout: int = 1200) -> Result:  # fmt: skip
    """`specdeploy deploy ARGS`, streaming its output; FAULT runs DELAY_S after a line has TRIGGER."""
    start = time.monotonic()
    proc = subprocess.Popen([*CLI, "deploy", *args], cwd=ROOT, env={**os.environ, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    lines: list[str] = []
    fired = threading.Event()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if trigger in line and not fired.is_set():
            fired.set()
            threading.Timer(delay_s, fault, args=(proc,)).start()
    proc.wait(timeout=timeout)
    assert fired.is_set(), f"never saw {trigger!r}:\n{''.join(lines)[-3000:]}"
    return Result(proc.returncode, "".join(lines), time.monotonic() - start)


def no_raw_exception(result: Result) -> None:
    for raw in ("Traceback", "Connection aborted", "RemoteDisconnected", "Socket is closed"):
        assert raw not in result.output.split("PLAY RECAP")[-1] or "lost contact" in result.output, result.output


@pytest.fixture(scope="module")
def baseline(testbed_up, docker_client):
    """A proven deploy to start from."""
    result = specdeploy("deploy", timeout=2400)
    assert result.returncode == 0, result.output[-3000:]
    proven(docker_client)
    return result


def test_ssh_sessions_killed_during_the_watch_reconnect_and_reach_ready(baseline, docker_client):
    def kill_sessions(_proc):
        sh(docker_client, "pkill -KILL -f 'sshd: deploy' || true")

    result = deploy_with_fault(variant("ssh-drop"), "watching specdeploy-engine", kill_sessions)
    assert result.returncode == 0, result.output[-4000:]
    assert "survived 1 loss(es) of contact" in result.output or "survived 2 loss(es)" in result.output, (
        result.output[-4000:])  # fmt: skip
    proven(docker_client)
    FAULTS.append(f"every SSH session killed during the watch | new version READY in the same play | "
                  f"{result.seconds:.0f}")  # fmt: skip


def test_dockerd_sigkilled_during_the_watch(baseline, docker_client):
    def kill_dockerd(_proc):
        sh(docker_client, "pkill -KILL -x dockerd")

    result = deploy_with_fault(variant("dockerd-kill"), "watching specdeploy-engine", kill_dockerd)
    no_raw_exception(result)
    if result.returncode != 0:
        assert "lost contact with" in result.output or "rolled back" in result.output, result.output[-4000:]
    start = time.monotonic()
    rerun = specdeploy("deploy", *variant("dockerd-kill"), timeout=1200)
    assert rerun.returncode == 0, rerun.output[-4000:]
    proven(docker_client)
    again = specdeploy("deploy", "--full", *variant("dockerd-kill"), timeout=1200)
    assert "status: unchanged" in again.output, again.output[-3000:]
    end = "READY in the same play (live-restore)" if result.returncode == 0 else "a sentence; the rerun proved it"
    FAULTS.append(f"dockerd SIGKILLed during the watch | {end}; rerun converges | "
                  f"{result.seconds + time.monotonic() - start:.0f}")  # fmt: skip


@pytest.mark.parametrize("phase, trigger, delay", [("watching", "watching specdeploy-engine", 3.0),
                                                   ("stopping-old", "page cache", 0.3)])  # fmt: skip
def test_controller_killed_then_the_rerun_resumes_and_proves(baseline, docker_client, phase, trigger, delay):
    def kill_controller(proc):
        os.killpg(proc.pid, signal.SIGKILL)

    killed = deploy_with_fault(variant(f"killed-{phase}"), trigger, kill_controller, delay_s=delay)
    assert killed.returncode == -signal.SIGKILL
    interrupted = record(docker_client)["phase"]
    assert interrupted != "done", interrupted
    start = time.monotonic()
    rerun = specdeploy("deploy", *variant(f"killed-{phase}"), timeout=1200)
    assert rerun.returncode == 0, rerun.output[-4000:]
    assert "status: unchanged" not in rerun.output  # never converged before a proof
    proven(docker_client)
    FAULTS.append(f"controller SIGKILLed in phase {interrupted} | the rerun resumed and proved it | "
                  f"{time.monotonic() - start:.0f}")  # fmt: skip


def test_a_reboot_after_a_proven_deploy_serves_again_without_a_deploy(baseline, docker_client):
    proven(docker_client)
    start = time.monotonic()
    host(docker_client).restart(timeout=30)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if complete_and_count()[0]:
                break
        except Exception:
            time.sleep(3)
    else:
        pytest.fail("the engine did not serve again within 300 s of the reboot")
    FAULTS.append(
        f"the host rebooted after a proven deploy | serving again, no deploy | {time.monotonic() - start:.0f}"
    )


def test_a_reboot_after_an_interrupted_deploy_then_the_rerun_restores_service(baseline, docker_client):
    killed = deploy_with_fault(variant("reboot-interrupted"), "watching specdeploy-engine",
                               lambda proc: os.killpg(proc.pid, signal.SIGKILL))  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    host(docker_client).restart(timeout=30)
    time.sleep(10)
    start = time.monotonic()
    rerun = specdeploy("deploy", *variant("reboot-interrupted"), timeout=1200)
    assert rerun.returncode == 0 and "status: unchanged" not in rerun.output, rerun.output[-4000:]
    proven(docker_client)
    FAULTS.append(f"the host rebooted during an interrupted deploy | the rerun restored service, proven | "
                  f"{time.monotonic() - start:.0f}")  # fmt: skip


def test_two_failed_deploys_then_rollback_brings_back_the_ready_version_before(baseline, docker_client):
    ok = specdeploy("deploy", *variant("before-failures"), timeout=1200)
    assert ok.returncode == 0, ok.output[-3000:]
    good = proven(docker_client)["last_ready"]["config"]
    for bad in (99999, 99998):
        failed = specdeploy("deploy", *variant("bad", serving_max_model_len=bad), timeout=1200)
        assert failed.returncode != 0 and "rolled back to the previous engine" in failed.output, failed.output[-3000:]
        assert proven(docker_client)["last_ready"]["config"] == good
    previous = remote().containers.get(f"{ENGINE}-previous")
    assert previous.attrs["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"  # it was proven
    start = time.monotonic()
    back = specdeploy("rollback", timeout=1200)
    assert back.returncode == 0, back.output[-3000:]
    rec = proven(docker_client)
    assert rec["last_ready"]["container_id"] == previous.id
    FAULTS.append(f"two failed deploys, then make rollback | the READY version before serves | "
                  f"{time.monotonic() - start:.0f}")  # fmt: skip


def _untouched(docker_client, before: tuple[str, str]) -> None:
    container = remote().containers.get(ENGINE)
    assert (container.id, container.attrs["State"]["StartedAt"]) == before


def test_preflight_refuses_a_foreign_listener_on_the_port(baseline, docker_client):
    container = remote().containers.get(ENGINE)
    before = (container.id, container.attrs["State"]["StartedAt"])
    sh(docker_client, "setsid python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &")
    time.sleep(1)
    try:
        refused = specdeploy("deploy", "-e", "serving_port=8123", timeout=600)
    finally:
        sh(docker_client, "pkill -f 'http.server 8123' || true")
    assert refused.returncode != 0
    assert "the serving port 8123 is taken" in refused.output and "(python3)" in refused.output, refused.output[-3000:]
    assert "PLAY [Build" not in refused.output  # refused in preflight, before any build
    _untouched(docker_client, before)


def test_preflight_refuses_too_little_space_for_the_build(baseline, docker_client):
    """The threshold raised over what is free: filling this machine's shared disk for real (fallocate)
    would starve everything else running on it."""
    container = remote().containers.get(ENGINE)
    before = (container.id, container.attrs["State"]["StartedAt"])
    refused = specdeploy("deploy", "-e", "preflight_build_free_gb=100000", timeout=600)
    assert refused.returncode != 0
    assert "free under /var/lib/docker (the Docker data root, for the image build)" in refused.output
    assert "preflight_build_free_gb" in refused.output and "PLAY [Build" not in refused.output
    _untouched(docker_client, before)


def test_preflight_refuses_a_full_model_filesystem(baseline, docker_client):
    """A real full filesystem: a 64 MiB tmpfs on the test host, filled with fallocate."""
    container = remote().containers.get(ENGINE)
    before = (container.id, container.attrs["State"]["StartedAt"])
    sh(
        docker_client,
        "mkdir -p /srv/full && mount -t tmpfs -o size=64m tmpfs /srv/full && fallocate -l 60m /srv/full/x",
    )
    try:
        refused = specdeploy("deploy", "-e", "serving_model_path=/srv/full/model", timeout=600)
    finally:
        sh(docker_client, "umount /srv/full")
    assert refused.returncode != 0
    assert "GiB free under /srv/full/model (the model's filesystem)" in refused.output, refused.output[-3000:]
    assert "preflight_model_free_gb" in refused.output and "PLAY [Build" not in refused.output
    _untouched(docker_client, before)


BAD_VALUES = [
    ("serving_port", "70000"), ("serving_tensor_parallel_size", "0"), ("serving_max_model_len", "-8192"),
    ("serving_stall_timeout", "-5"), ("serving_timeout", "0"), ("serving_reconnect_grace", "-1"),
    ("serving_num_speculative_tokens", "40"), ("serving_model_path", "models/kimi"),
    ("serving_state_dir", "var/lib/specdeploy"), ("serving_shm_size", "sixteen gigs"),
    ("serving_bind_address", "localhost:8000"), ("serving_served_model_name", "kimi k2.5"),
    ("serving_engine", "tgi"), ("serving_gpus", "all"), ("serving_ipc_mode", "none"),
    ("serving_speculative_method", "eagle"), ("serving_extra_args", "--enforce-eager --max-num-seqs 8"),
    ("serving_env", {"VLLM_API_KEY": "sk-plain-text"}), ("serving_env", {"HF_TOKEN": "hf_plain"}),
    ("serving_extra_args", ["--api-key", "sk-plain-text"]), ("serving_volumes", {"srv/hook": "/hook"}),
]  # fmt: skip


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES, ids=[f"{v}={x}"[:50] for v, x in BAD_VALUES])
def test_a_bad_inventory_value_is_refused_in_preflight_naming_it(baseline, docker_client, variable, value):
    container = remote().containers.get(ENGINE)
    before = (container.id, container.attrs["State"]["StartedAt"])
    refused = specdeploy("deploy", "-e", json.dumps({variable: value}), timeout=600)
    assert refused.returncode != 0
    # Ours ("serving_port=70000: must be ...") or the role's argument spec ("value of serving_engine must be one of").
    assert f"{variable}=" in refused.output or f"value of {variable} must be" in refused.output, refused.output[-3000:]
    assert "PLAY [Build" not in refused.output and "PLAY [Deploy" not in refused.output
    assert "sk-plain-text" not in refused.output.replace(json.dumps({variable: value}), "")
    _untouched(docker_client, before)


def test_zz_report(baseline):
    """The faults table for the README, measured in this run."""
    for row in FAULTS:
        record_timing(f"fault | {row}", 0.0)
    assert FAULTS
