"""e2e: a real vLLM engine (CPU build) started by the tests and watched by `specdeploy watch`."""

from __future__ import annotations

import socket

import pytest

from . import engine


@pytest.fixture(scope="session")
def engine_ready():
    engine.ensure_engine_venv()
    engine.restore_pristine_engine()
    return engine.ensure_tiny_models()


@pytest.fixture
def port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
