"""The shapes issue 24 says still beat the watchdog: a C/CUDA check line printed before a generic
`RuntimeError: cancelled`, an exception quoted inside a wrapper's Python list, and a rank waiting for
its peers (named "resolving config" or "initialising distributed" before).

Real logs are read from tests/data/real_logs/ (manifest.yaml names their sources). Lines written
here to pin one shape are marked CONSTRUCTED.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from specdeploy.watch.loglines import parse_line
from specdeploy.watch.rootcause import root_cause_of
from specdeploy.watch.sources import Liveness
from specdeploy.watch.stages import recognise
from specdeploy.watch.watchdog import Watch, WatchOptions

REAL_LOGS = Path(__file__).parents[2] / "data" / "real_logs"
PEERS = "waiting for peer ranks"


def cause_of(text: str):
    return root_cause_of(parse_line(raw) for raw in text.strip("\n").splitlines())


def real_cause(name: str):
    return root_cause_of(parse_line(raw) for raw in (REAL_LOGS / name).read_text().splitlines())


@dataclass
class SilentAfterLog:
    """Hands out the log's lines in one poll, then stays alive and silent (a hang)."""

    lines: list[str]
    stacks: str = ""
    description: str = "fake"

    def read_new(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines

    def liveness(self) -> Liveness:
        return Liveness(True, state="running")

    def dump_stacks(self) -> str:
        return self.stacks

    def kernel_builds(self) -> list[str]:
        return []

    def gpu_memory_mib(self) -> int | None:
        return None


def stalled(tmp_path, lines: list[str], stacks: str = ""):
    opts = WatchOptions(url=None, interval_s=0.01, stall_timeout_s=0.3, diagnostics=tmp_path, progress=False)
    verdict = Watch(SilentAfterLog(lines, stacks), opts).run()
    assert verdict.status == "STALLED", verdict.first_line()
    return verdict


# ---------------------------------------------------------------- 1. a CUDA check before "cancelled"


def test_cuda_check_line_before_the_cancellation_is_the_cause():
    """vllm#50557: the custom all-reduce's CUDACHECK line, then the engine core's `RuntimeError: cancelled`."""
    cause = real_cause("vllm-v1-custom-allreduce-cuda-check-then-cancelled.log")
    assert cause is not None
    assert cause.headline() == "Cuda error: an illegal memory access was encountered"
    assert cause.where() == "/workspace/csrc/custom_all_reduce.cuh:455"


def test_cuda_check_printed_after_the_cancellation_still_wins():
    """CONSTRUCTED: a worker's stdout reaches the log late (block-buffered until its exit)."""
    cause = cause_of("""
(EngineCore pid=5) ERROR 01-01 00:00:03 [core.py:1] Traceback (most recent call last):
(EngineCore pid=5) ERROR 01-01 00:00:03 [core.py:1]   File "/x/vllm/distributed/device_communicators/shm_broadcast.py", line 701, in acquire_read
(EngineCore pid=5) ERROR 01-01 00:00:03 [core.py:1] RuntimeError: cancelled
Failed: Cuda error /path/to/some_kernel.cuh:123 'out of memory'
""")  # noqa: E501
    assert cause is not None and cause.headline() == "Cuda error: out of memory"
    assert cause.where() == "/path/to/some_kernel.cuh:123"


def test_cuda_check_inside_an_open_traceback_is_not_its_exception():
    """CONSTRUCTED: SGLang prints a rank's frames without its prefix; a worker's unprefixed CUDA check
    line lands between them and must not close that traceback as an exception named `Failed`."""
    cause = cause_of("""
[2025-01-01 00:00:01 TP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/lib/python3/sglang/srt/managers/scheduler.py", line 10, in run_scheduler_process
Failed: Cuda error /sgl-workspace/sgl-kernel/csrc/allreduce/custom_all_reduce.cuh:88 'out of memory'
  File "/usr/lib/python3/sglang/srt/distributed/parallel_state.py", line 20, in all_reduce
RuntimeError: cancelled
""")
    assert cause is not None and cause.type == "Cuda error" and cause.message == "out of memory"
    assert cause.where().endswith("custom_all_reduce.cuh:88")


def test_cuda_check_without_the_error_word():
    """vllm#5613's title: an older CUDACHECK printed `Failed: <file>:<line> '<message>'`."""
    cause = cause_of("Failed: /home/runner/work/vllm/vllm/csrc/custom_all_reduce.cuh:310 'invalid argument'")
    assert cause is not None and cause.message == "invalid argument"
    assert cause.where() == "/home/runner/work/vllm/vllm/csrc/custom_all_reduce.cuh:310"


# ---------------------------------------------------------------- 2. an exception inside a wrapper's list


def test_traceback_printed_as_a_python_list_is_read_back():
    """CONSTRUCTED: a launcher logs `traceback.format_exception(...)` as a list."""
    cause = cause_of("""
ERROR 01-01 00:00:01 [launcher.py:1] worker 0 failed: ['Traceback (most recent call last):\\n', '  File "/x/vllm/model_executor/models/deepseek_v2.py", line 7, in load\\n    self.rotary = get_rope(config)\\n', "KeyError: 'factor'\\n"]
ERROR 01-01 00:00:02 [launcher.py:1] subprocess.CalledProcessError: Command '['/usr/bin/gcc', '-O3']' returned non-zero exit status 1.
""")  # noqa: E501
    assert cause is not None and cause.headline() == "KeyError: 'factor'"
    assert cause.where() == "/x/vllm/model_executor/models/deepseek_v2.py:7"


def test_exception_quoted_in_a_wrapper_exception_is_the_cause():
    """CONSTRUCTED: the wrapper raises its own exception whose message is a list of the errors."""
    cause = cause_of("""
Traceback (most recent call last):
  File "/x/launcher.py", line 3, in main
    raise Exception(errors)
Exception: ["ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3)."]
""")
    assert cause is not None and cause.type == "ValueError"
    assert cause.message == "Total number of attention heads (32) must be divisible by tensor parallel size (3)."


# ---------------------------------------------------------------- 3. a rank waiting for its peers


@pytest.mark.parametrize(
    "name", ["h200-torch-rendezvous-client-no-master.log", "h200-torch-rendezvous-master-no-client.log"]
)
def test_real_rendezvous_hangs_are_stalled_waiting_for_peers(tmp_path, name):
    verdict = stalled(tmp_path, (REAL_LOGS / name).read_text().splitlines())
    assert verdict.stage == PEERS
    assert f"at stage '{PEERS}'" in verdict.headline


@pytest.mark.parametrize(
    "text",
    [
        # torch <= 2.x, by default (vllm#2427).
        "[W socket.cpp:663] [c10d] The client socket has failed to connect to xxx:48247 (errno: 110 - Connection "
        "timed out).",
        # torch 2.11 with TORCH_CPP_LOG_LEVEL=INFO (h200-torch-rendezvous-client-no-master.log).
        "[I1202 08:25:36.179060892 socket.cpp:931] [c10d - trace] The server socket on [localhost]:29522 is not yet "
        "listening (errno: 111 - Connection refused), will retry.",
        # CONSTRUCTED from vLLM's real heartbeat (Project-HAMi/HAMi-core#261) with one engine on another host.
        "(APIServer pid=1) DEBUG 08-09 20:55:10 [v1/engine/utils.py:1262] Waiting for 0 local, 1 remote core engine "
        "proc(s) to start.",
    ],
)
def test_lines_of_a_rank_waiting_for_peers(text):
    event = recognise(parse_line(text).text)
    assert event is not None and event.stage.label == PEERS
    local_only = "Waiting for 1 local, 0 remote core engine proc(s) to start."  # its own engine, not a peer
    assert recognise(local_only) is None or recognise(local_only).stage.label != PEERS


def test_stacks_in_the_rendezvous_name_the_wait_when_the_log_is_silent(tmp_path):
    """vLLM DP 2 with one local rank: the log stops at its config (torch prints nothing while it waits).
    The py-spy dump is CONSTRUCTED from the frames of the real h200-torch-nccl-rendezvous-no-peer.log."""
    log = ["(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] non-default args: {'data_parallel_size': 2, "
           "'data_parallel_size_local': 1}"]  # fmt: skip
    stacks = (
        "=== py-spy dump --pid 41\nProcess 41: VLLM::EngineCore_DP0\nPython v3.12.3\n\n"
        'Thread 0x7F (idle): "MainThread"\n'
        "    _create_c10d_store (torch/distributed/rendezvous.py:199)\n"
        "    _tcp_rendezvous_handler (torch/distributed/rendezvous.py:232)\n"
        "    init_process_group (torch/distributed/distributed_c10d.py:1831)\n"
        "    stateless_init_torch_distributed_process_group (vllm/distributed/utils.py:600)\n"
    )
    verdict = stalled(tmp_path, log, stacks)
    assert verdict.stage == PEERS and f"at stage '{PEERS}'" in verdict.headline
    quiet = stalled(tmp_path, log, 'Thread 0x7F (idle): "MainThread"\n    load_weights (vllm/model_loader.py:1)\n')
    assert quiet.stage == "resolving config"


def test_the_wait_ends_when_distributed_init_goes_on(tmp_path):
    """Once the peers are there, the next distributed line leaves the wait (the real client line, then a
    CONSTRUCTED NCCL line of the same run)."""
    verdict = stalled(tmp_path, [
        "[I1202 08:25:36.179060892 socket.cpp:931] [c10d - trace] The server socket on [localhost]:29522 is not yet "
        "listening (errno: 111 - Connection refused), will retry.",
        "h200:99:99 [0] NCCL INFO comm 0x5f0 rank 1 nranks 2 cudaDev 0 busId 18000 - Init START",
    ])  # fmt: skip
    assert [s["stage"] for s in verdict.stages][-1] == PEERS
    assert verdict.stage == "initialising distributed (NCCL/gloo)"
