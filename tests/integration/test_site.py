"""The test bed itself and site.yml's phase tags (the full deploy is in test_serving.py)."""

from __future__ import annotations

import pytest

from specdeploy_testbed.testbed import container_name, host_name

from .helpers import record_timing, specdeploy

pytestmark = pytest.mark.integration


def test_testbed_up_again_changes_nothing(testbed_up, docker_client):
    container = docker_client.containers.get(container_name(host_name(1)))
    started = container.attrs["State"]["StartedAt"]
    again = specdeploy("testbed", "up")
    assert again.returncode == 0, again.output
    assert "Starting" not in again.output and "Building" not in again.output, again.output
    container.reload()
    assert container.attrs["State"]["StartedAt"] == started
    record_timing("testbed up (warm)", again.seconds)


def test_verify_only_tags_run_the_verify_play(testbed_up, docker_client):
    """Only the Verify play runs, and its verdict follows the host: the serving checks fail, each
    named, while no engine runs there (test_serving.py leaves it removed)."""
    result = specdeploy("deploy", "--tags", "verify")
    engine = docker_client.containers.get(container_name(host_name(1))).exec_run(
        ["docker", "inspect", "specdeploy-engine"]
    )
    if engine.exit_code == 0:
        assert result.returncode == 0, result.output
    else:
        assert result.returncode != 0, result.output
        message = " ".join(result.output.split())
        assert "failed: check_serving.py::test_engine_container_runs_the_recorded_image" in message, message[-3000:]
    assert "Verify | the host's services, GPU stack and engine, checked over SSH (testinfra)" in result.output
    assert "TASK [Run the host checks]" in result.output
    assert "Check the platform against the supported matrix" not in result.output
