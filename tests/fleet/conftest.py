"""The fleet on the test bed (`make test-fleet`): 3 hosts with real engines behind vllm-router."""

from tests.integration.conftest import pytest_terminal_summary  # noqa: F401 (shared)
