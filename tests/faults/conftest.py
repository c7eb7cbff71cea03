"""Fault injection on the test bed (`make test-faults`): real engine, real sshd, real dockerd."""

from tests.integration.conftest import docker_client, pytest_terminal_summary, testbed_up  # noqa: F401 (shared)
