"""The benchmark gate on the test bed (`make test-gate`): its own target, because a drafter swap and
two real rollouts cost ~10 minutes, and `make test` must stay within 45 (it measured 46.5 with it).
Every deploy in `make test` still passes through the gate."""

from tests.integration.conftest import docker_client, pytest_terminal_summary, testbed_up  # noqa: F401 (shared)
