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


def test_verify_only_tags_run_the_verify_play(testbed_up):
    result = specdeploy("deploy", "--tags", "verify")
    assert result.returncode == 0, result.output
    assert "Verify | the host's services, GPU stack and engine, checked over SSH (testinfra)" in result.output
    assert "TASK [Run the host checks]" in result.output and "ok: [testbed-1]" in result.output
    assert "Check the platform against the supported matrix" not in result.output
