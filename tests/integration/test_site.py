"""site.yml against the local test bed over real SSH: success, convergence, verification."""

from __future__ import annotations

import pytest

from specdeploy.playbook import parse_recap
from specdeploy.testbed import container_name, host_name

from .helpers import record_timing, specdeploy

pytestmark = pytest.mark.integration


def test_site_yml_succeeds_then_converges_then_verifies(testbed_up, docker_client):
    first = specdeploy("deploy")
    assert first.returncode == 0, first.output
    recap = parse_recap(first.output)
    assert set(recap) == {"testbed-1"}, first.output
    assert recap["testbed-1"]["failed"] == 0 and recap["testbed-1"]["unreachable"] == 0
    assert "Debian 12" in first.output and "(supported)" in first.output

    second = specdeploy("deploy")
    assert second.returncode == 0, second.output
    assert parse_recap(second.output)["testbed-1"]["changed"] == 0, second.output
    record_timing("site.yml first run", first.seconds)
    record_timing("site.yml second run (converged)", second.seconds)

    verify = specdeploy("verify")
    assert verify.returncode == 0, verify.output
    assert "5 passed" in verify.output, verify.output


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
    assert "Verify | the host's base services answer" in result.output
    assert "Check the platform against the supported matrix" not in result.output
