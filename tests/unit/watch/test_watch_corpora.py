"""The classifier on logs of real vLLM starts (tests/data/vllm_logs/README.md says how each was made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy.watch.loglines import noise_id, parse_line
from specdeploy.watch.readiness import Acceptance, spec_counters
from specdeploy.watch.rootcause import root_cause_of
from specdeploy.watch.stacks import summarise_stacks
from specdeploy.watch.stages import Stage, recognise

CORPORA = Path(__file__).parents[2] / "data" / "vllm_logs"


def lines(name: str):
    return [parse_line(raw) for raw in (CORPORA / name).read_text().splitlines()]


def test_syntax_error_is_the_root_cause_not_its_wrappers():
    cause = root_cause_of(lines("syntax-error.log"))
    assert cause is not None
    assert cause.headline() == (
        "SyntaxError: trailing comma not allowed without surrounding parentheses (deepseek_v2.py, line 115)"
    )
    assert cause.where().endswith("vllm/model_executor/models/deepseek_v2.py:115")
    assert cause.process == "APIServer"


def test_pydantic_validation_error_is_unwrapped_to_its_value_error():
    cause = root_cause_of(lines("bad-config-max-model-len.log"))
    assert cause is not None and cause.type == "ValueError"
    assert cause.message.startswith("User-specified max_model_len (100000) is greater than the derived")
    assert cause.where().endswith("vllm/engine/arg_utils.py:1955")


def test_chained_cause_is_named_before_its_consequence():
    cause = root_cause_of(lines("bad-drafter-config.log"))
    assert cause is not None and cause.type == "TypeError"
    assert "n_routed_experts" in cause.message


def test_healthy_start_passes_every_stage_to_the_api_server():
    stages = {event.stage for line in lines("healthy-eagle3.log") if (event := recognise(line.text))}
    assert {Stage.CONFIG, Stage.WEIGHTS, Stage.KV_CACHE, Stage.API_SERVER} <= stages


def test_process_prefixes_and_logger_headers_are_split_off():
    line = parse_line("(EngineCore_DP0 pid=4242) ERROR 11-29 22:09:48 [core.py:700] EngineCore failed to start.")
    assert (line.process, line.pid, line.level, line.text) == (
        "EngineCore_DP0",
        4242,
        "ERROR",
        "EngineCore failed to start.",
    )
    worker = parse_line("\x1b[1;36m(Worker_TP0 pid=7)\x1b[0;0m INFO 11-29 22:09:48 [gpu.py:1] hi")
    assert (worker.process, worker.pid, worker.text) == ("Worker_TP0", 7, "hi")
    sglang = parse_line("[2026-03-02 10:00:00 DP0 TP3] Load weight begin. avail mem=70.1 GB")
    assert sglang.process == "DP0_TP3" and recognise(sglang.text).stage == Stage.WEIGHTS


@pytest.mark.parametrize(
    "text",
    [
        "Failed to import Triton kernels. Please make sure your triton version is compatible. Error: "
        "cannot import name 'SparseMatrix' from 'triton_kernels.tensor'",
        "/x/y.py:12: FutureWarning: `foo` is deprecated",
        '  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load',
    ],
)
def test_known_noise_is_recognised(text):
    assert noise_id(text) is not None


def test_noise_is_never_the_cause():
    log = [
        parse_line(
            "(APIServer pid=1) ERROR 11-29 10:00:00 [x.py:1] Failed to import Triton kernels. cannot import "
            "name 'SparseMatrix'"
        ),
        parse_line("(EngineCore_DP0 pid=2) ERROR 11-29 10:00:01 [core.py:1] Traceback (most recent call last):"),
        parse_line('(EngineCore_DP0 pid=2) ERROR 11-29 10:00:01 [core.py:1]   File "/v/vllm/worker.py", line 9, in f'),
        parse_line(
            "(EngineCore_DP0 pid=2) ERROR 11-29 10:00:01 [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
        ),
    ]
    cause = root_cause_of(log)
    assert cause is not None and cause.type == "torch.OutOfMemoryError" and cause.where() == "/v/vllm/worker.py:9"


def test_shard_progress_is_read():
    event = recognise("Loading safetensors checkpoint shards:  50% Completed | 31/62 [01:02<01:02,  2.0s/it]")
    assert event is not None and (event.stage, event.shards_done, event.shards_total) == (Stage.WEIGHTS, 31, 62)


def test_spec_counters_and_acceptance_from_real_metrics():
    # The exposition lines vLLM 0.32 served after the healthy run's 16-token completion.
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 4.0\n'
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.79e+09\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 12.0\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 12.0\n'
    )
    counters = spec_counters(text)
    names = ("drafts", "draft_tokens", "accepted_tokens")
    acc = Acceptance(*(counters[f"vllm:spec_decode_num_{n}"] for n in names))
    assert acc.rate == 1.0 and acc.mean_length == 4.0


def test_stack_summary_prefers_engine_frames():
    dump = (
        "Process 41: python -m vllm.entrypoints.openai.api_server\nPython v3.11.7\n\n"
        'Thread 0x7F (idle): "MainThread"\n'
        "    wait (threading.py:327)\n"
        "    init_process_group (torch/distributed/distributed_c10d.py:1593)\n"
        "    init_worker_distributed_environment (vllm/v1/worker/gpu_worker.py:512)\n"
        'Thread 0x80 (idle): "Thread-1"\n    run (threading.py:1)\n'
    )
    (summary,) = summarise_stacks(dump)
    assert summary.startswith("pid 41")
    assert "init_process_group (torch/distributed/distributed_c10d.py:1593)" in summary
    assert "run (threading.py:1)" not in summary
