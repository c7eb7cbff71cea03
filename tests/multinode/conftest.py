"""One engine over two test-bed hosts (`make test-multinode`): vLLM's data-parallel launch, rolled out as one."""

from tests.integration.conftest import pytest_terminal_summary  # noqa: F401 (shared)
