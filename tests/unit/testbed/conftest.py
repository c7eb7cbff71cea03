"""Fixtures of the test-bed model makers' tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def rope_warnings() -> Iterator[list[str]]:
    """What transformers' RoPE validation logs (unknown keys, a factor other than the lengths imply)."""
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("transformers.modeling_rope_utils")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)
