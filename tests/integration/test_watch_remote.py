"""The watchdog against a container on a test host: Docker SDK over SSH (host keys verified), through
the same HostConnection the serving action builds from the inventory, and the SSH port forward used
for readiness."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from dataclasses import asdict

import pytest
from docker.errors import NotFound

from specdeploy.connection import CommandHost, HostConnection, docker_client
from specdeploy.engine_image.ship import ship_image
from specdeploy.errors import SpecdeployError
from specdeploy.serve.hosts import inventory_hostvars
from specdeploy.targets import Target, forward_port
from specdeploy.watch.remote import watch_container_on_host
from specdeploy.watch.watchdog import Verdict, WatchOptions
from specdeploy_testbed import testbed

pytestmark = pytest.mark.integration

CRASH = (
    'echo "(APIServer pid=1) INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.32.0"; sleep 2; '
    'echo "(EngineCore_DP0 pid=7) ERROR 11-29 10:00:02 [core.py:1] Traceback (most recent call last):"; '
    'echo "(EngineCore_DP0 pid=7) ERROR 11-29 10:00:02 [core.py:1]   File \\"/opt/venv/vllm/config/parallel.py\\", '
    'line 42, in verify"; '
    'echo "(EngineCore_DP0 pid=7) ERROR 11-29 10:00:02 [core.py:1] ValueError: tensor_parallel_size 8 > 1 GPUs"; '
    "exit 3"
)


@pytest.fixture(scope="module")
def remote(testbed_up, docker_client):
    tb = testbed.paths()
    client = docker_client_for_host(tb)
    host = CommandHost(Target("127.0.0.1", testbed.SSH_USER, testbed.port_base()), tb.ssh())
    ship_image(testbed.BASE_IMAGE, CommandHost(), host)
    return client


def docker_client_for_host(tb):
    return docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base()}", (tb.known_hosts,), tb.key)


def start(remote, name: str, script: str):
    with contextlib.suppress(NotFound):
        remote.containers.get(name).remove(force=True)
    return remote.containers.run(testbed.BASE_IMAGE, ["sh", "-c", script], name=name, detach=True)


def watch_on_testbed(name: str, tmp_path) -> Verdict:
    """The watch as the serving action runs it: a HostConnection from the inventory's own hostvars."""
    hostvars = inventory_hostvars(testbed.paths().inventory)["testbed-1"]
    options = WatchOptions(url=None, stall_timeout_s=30, timeout_s=120, diagnostics=tmp_path, progress=False)
    return watch_container_on_host(HostConnection.from_hostvars(hostvars), name, None, options)


def test_watch_names_the_root_cause_of_a_crashed_container(remote, tmp_path):
    container = start(remote, "watch-crash", CRASH)
    try:
        verdict = watch_on_testbed("watch-crash", tmp_path)
    finally:
        container.remove(force=True)
    text = json.dumps(asdict(verdict))  # what the serving action reports
    assert verdict.status == "FAILED"
    assert "ValueError: tensor_parallel_size 8 > 1 GPUs at /opt/venv/vllm/config/parallel.py:42" in text
    assert "[EngineCore_DP0]" in text and "exit 3" in text


def test_watch_reports_a_sigkill_without_traceback_as_killed(remote, tmp_path):
    # SIGKILL from outside, as the OOM killer does (PID 1 cannot SIGKILL itself).
    container = start(remote, "watch-killed", "echo loading weights; sleep 60")
    killer = threading.Timer(4.0, container.kill)
    killer.start()
    try:
        verdict = watch_on_testbed("watch-killed", tmp_path)
    finally:
        killer.cancel()
        container.remove(force=True)
    assert verdict.status == "FAILED"
    assert "killed by SIGKILL with no traceback (likely the OOM killer)" in json.dumps(asdict(verdict))
    assert verdict.exit_code == 137


def test_unknown_host_key_is_refused_by_the_docker_ssh_transport(testbed_up, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SpecdeployError, match="not found in known_hosts"):
        docker_client(f"ssh://deploy@127.0.0.1:{testbed.port_base()}", (empty,), testbed.paths().key)


def test_port_forward_reaches_the_hosts_loopback(testbed_up):
    host = testbed.TestHost("testbed-1", testbed.port_base(), ())
    with (
        forward_port(host.target, testbed.paths().ssh(), 22) as local,
        socket.create_connection(("127.0.0.1", local)) as s,
    ):
        assert s.recv(64).startswith(b"SSH-2.0-OpenSSH")
