"""Integration tests: the real CLI, a real Docker engine, real sshd, the real ansible-playbook."""

from __future__ import annotations

import pytest

from specdeploy.docker_engine import ensure_engine
from specdeploy.paths import state_dir
from specdeploy_testbed import testbed

from .helpers import TIMINGS, Result, record_timing, specdeploy


@pytest.fixture(scope="session")
def testbed_up() -> Result:
    """`specdeploy testbed up`, once per session; its duration shows cold vs warm."""
    result = specdeploy("testbed", "up")
    assert result.returncode == 0, result.output
    record_timing("testbed up (first in this session)", result.seconds)
    return result


@pytest.fixture(scope="session")
def docker_client(testbed_up):
    return ensure_engine(state_dir())


@pytest.fixture
def throwaway_host(docker_client, request):
    """An extra test host on its own port, removed afterwards; its keys go into known_hosts."""
    name = f"throwaway-{request.node.name[:20].replace('_', '-').strip('-')}"
    port = testbed.port_base() + 15
    host = testbed.start_host(docker_client, name, port)
    testbed.add_known_host(host)
    yield host
    testbed.remove_host(docker_client, name, purge=True)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("specdeploy timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)
