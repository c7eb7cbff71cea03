"""`specdeploy watch` as a command: the output contract (first line, exit codes, --json)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.integration

CRASHER = """
import sys, time
print("(APIServer pid=1) INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.0.0", flush=True)
time.sleep(1)
print("Failed to import Triton kernels. cannot import name 'SparseMatrix'", flush=True)
def load_weights():
    raise RuntimeError("Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested")
try:
    load_weights()
except RuntimeError as exc:
    raise RuntimeError("Engine core initialization failed. See root cause above.") from exc
"""


def watch(*args: str, timeout: int = 60) -> tuple[int, list[str]]:
    proc = subprocess.run([sys.executable, "-m", "specdeploy.cli", "watch", "--no-progress", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
    return proc.returncode, proc.stdout.splitlines()


def test_failed_start_prints_the_cause_first_and_exits_1(tmp_path):
    log, verdict_file = tmp_path / "engine.log", tmp_path / "verdict.json"
    code, out = watch("--log-file", str(log), "--json", str(verdict_file), "--diagnostics", str(tmp_path / "d"),
                      "--", sys.executable, "-c", CRASHER)  # fmt: skip
    assert code == 1, out
    assert out[0].startswith("FAILED ")
    assert "RuntimeError: Model does not support EAGLE3 interface" in out[0]
    assert "Engine core initialization failed" not in out[0]
    verdict = json.loads(verdict_file.read_text())
    assert verdict["status"] == "FAILED" and verdict["exit_code"] == 1
    assert verdict["noise"] == {"triton-kernels-sparsematrix": 1}
    assert verdict["root_cause"]["line"] == 7  # the raise inside load_weights in CRASHER


def test_silent_process_stalls_and_exits_2(tmp_path):
    start = time.monotonic()
    code, out = watch("--log-file", str(tmp_path / "e.log"), "--stall-timeout", "2", "--diagnostics",
                      str(tmp_path / "d"), "--", sys.executable, "-c", "import time; time.sleep(60)")  # fmt: skip
    assert code == 2, out
    assert out[0].startswith("STALLED ") and "no progress for" in out[0]
    assert time.monotonic() - start < 30


def test_overall_timeout_exits_3_while_progress_continues(tmp_path):
    chatty = (
        "import time\nfor i in range(100):\n"
        "    print('Loading safetensors checkpoint shards: 1% Completed | 1/62', flush=True)\n    time.sleep(0.2)"
    )
    code, out = watch("--log-file", str(tmp_path / "e.log"), "--timeout", "2", "--stall-timeout", "60",
                      "--diagnostics", str(tmp_path / "d"), "--", sys.executable, "-c", chatty)  # fmt: skip
    assert code == 3, out
    assert out[0].startswith("TIMEOUT ") and "loading weights" in out[0]


def test_bad_input_is_exit_4_not_a_verdict(tmp_path):
    code, _ = watch("--pid", "999999", "--log-file", str(tmp_path / "x.log"))
    assert code == 4
    code, _ = watch("--log-file", str(tmp_path / "x.log"), "--interval", "2", "--", "true")
    assert code == 4
