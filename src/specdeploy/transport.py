"""Faults of our own transport (SSH to the target, the Docker API over it, dockerd itself), told
apart from the engine's failures: a dropped connection is never a verdict on the engine, and never
a raw exception in the play's message."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import paramiko
import requests
from docker.errors import APIError, DockerException, NotFound

from specdeploy.errors import SpecdeployError

T = TypeVar("T")
RECONNECT_GRACE_S = 120.0  # serving_reconnect_grace: a drop shorter than this changes no verdict
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0)
_TRANSPORT_WORDS = ("connection", "eof", "broken pipe", "shutting down", "context canceled", "timeout")


def is_transport_error(exc: BaseException) -> bool:
    """SSH gone, the Docker API's connection aborted, dockerd restarting: not the engine's doing."""
    if isinstance(exc, NotFound):
        return False
    if isinstance(exc, APIError):  # a 500 is usually the engine's refusal (OCI runtime): only these are ours
        return bool(exc.is_server_error()) and any(w in str(exc).lower() for w in _TRANSPORT_WORDS)
    return isinstance(
        exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout | paramiko.SSHException | EOFError
    ) or (isinstance(exc, OSError | DockerException) and not isinstance(exc, FileNotFoundError))


def describe(exc: BaseException) -> str:
    """One line for a transport error (the first of its chained reasons)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def lost_contact(host: str, doing: str, exc: BaseException, state: str, hint: str) -> SpecdeployError:
    return SpecdeployError(
        f"lost contact with {host} while {doing} ({describe(exc)}); as far as the rollout record knows: {state}",
        hint=hint,
    )


def with_retries(call: Callable[[], T], reconnect: Callable[[], None], grace_s: float = RECONNECT_GRACE_S) -> T:
    """CALL, reconnecting with backoff on transport errors for up to GRACE_S; then the last error."""
    deadline = time.monotonic() + grace_s
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transport_error(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        attempt += 1
        try:
            reconnect()
        except Exception as exc:
            if not is_transport_error(exc) and not isinstance(exc, SpecdeployError):
                raise
