"""`make test-images`: the engine image built on the controller and shipped to a test-bed host
(`engine_image_build_on: controller`). Out of `make test` because its cold build on this 2-core
machine takes ~10 minutes on top of the target-side build that `make test` already does."""

from __future__ import annotations

import re

import pytest

from specdeploy.docker_engine import ensure_engine
from specdeploy.paths import state_dir
from tests.integration.conftest import docker_client, pytest_terminal_summary, testbed_up
from tests.integration.helpers import record_timing
from tests.integration.test_engine_image import build, host_with_models, put_drafter, remote

__all__ = ["docker_client", "host_with_models", "pytest_terminal_summary", "testbed_up"]
pytestmark = pytest.mark.integration


def test_controller_build_ships_the_image_to_the_target_and_converges(host_with_models):
    """engine_image_build_on=controller: drafter fetched, built by this machine's engine, shipped."""
    container, drafter = host_with_models
    # Another drafter (one more file), so this image does not replace the target-built one.
    path = put_drafter(container, "drafter-shipped", {**drafter, "NOTES.txt": b"built on the controller\n"})
    run, seconds = build("-e", f"engine_image_drafter_path={path}", "-e", "engine_image_build_on=controller")
    assert run.returncode == 0, run.output[-3000:]
    record_timing("engine image build on the controller + ship (vllm-cpu, first in this session)", seconds)
    assert "shipped: true" in run.output
    tag = re.findall(r"tag: (specdeploy/vllm-cpu:\S+)", run.output)[-1]
    controller_image = ensure_engine(state_dir()).images.get(tag)
    target_image = remote().images.get(tag)
    assert target_image.id == controller_image.id
    assert target_image.labels["io.specdeploy.drafter-digest"][7:19] == tag.split(":")[1]
    baked = remote().containers.run(tag, ["cat", "/opt/drafter/NOTES.txt"], remove=True).decode()
    assert baked == "built on the controller\n"

    again, seconds = build("-e", f"engine_image_drafter_path={path}", "-e", "engine_image_build_on=controller")
    assert again.returncode == 0 and again.recap["testbed-1"]["changed"] == 0, again.output[-3000:]
    assert "shipped: false" in again.output
    record_timing("engine image build on the controller (converged rerun)", seconds)
