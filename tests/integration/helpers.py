"""Helpers for the integration tests: run the real CLI and judge its output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from specdeploy.paths import project_root
from specdeploy_testbed import testbed

ROOT = project_root()
CLI = [sys.executable, "-m", "specdeploy.cli"]


TIMINGS: list[str] = []  # printed in pytest's terminal summary (see conftest)


def record_timing(label: str, seconds: float) -> None:
    TIMINGS.append(f"{label}: {seconds:.1f} s")


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


def specdeploy(*args: str, env: dict[str, str] | None = None, timeout: int = 900) -> Result:
    start = time.monotonic()
    proc = subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def tb_args() -> list[str]:
    tb = testbed.paths()
    return ["--ssh-key", str(tb.key), "--known-hosts", str(tb.known_hosts)]


def assert_clear_error(result: Result, *needles: str) -> None:
    assert result.returncode != 0, result.output
    assert "Traceback" not in result.output, result.output
    for needle in needles:
        assert needle in result.output, result.output


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
