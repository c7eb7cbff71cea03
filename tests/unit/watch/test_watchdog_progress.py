"""The watch loop's progress lines and its honesty about exit status, on a fake source."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.watch.readiness import Readiness
from specdeploy.watch.sources import Liveness
from specdeploy.watch.watchdog import Watch, WatchOptions


@dataclass
class FakeSource:
    """Hands out scripted log lines, one batch a poll, then dies with `end`."""

    batches: list[list[str]]
    end: Liveness
    alive_after: bool = False  # stay alive (and silent) once the batches are out
    builds: list[list[str]] = field(default_factory=list)  # what each stall-bound check finds compiling
    description: str = "fake"
    polls: int = field(default=0)

    def read_new(self) -> list[str]:
        self.polls += 1
        return self.batches.pop(0) if self.batches else []

    def liveness(self) -> Liveness:
        return self.end if not self.batches and not self.alive_after else Liveness(True, state="running")

    def dump_stacks(self) -> str:
        return ""

    def gpu_memory_mib(self) -> int | None:
        return 1234

    def kernel_builds(self) -> list[str]:
        return self.builds.pop(0) if self.builds else []


def run(tmp_path, batches, end, alive_after=False, builds=(), **options):
    lines: list[str] = []
    opts = WatchOptions(url=None, interval_s=0.01, diagnostics=tmp_path, progress=False, on_progress=lines.append,
                        **options)  # fmt: skip
    verdict = Watch(FakeSource(batches, end, alive_after=alive_after, builds=list(builds)), opts).run()
    return verdict, lines


def test_progress_at_every_stage_change_with_shards_eta_and_gpu(tmp_path):
    batches = [
        ["(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] vLLM API server version 0.9.0"],
        ["Loading safetensors checkpoint shards:  25% Completed | 16/64 [00:10<00:30,  2.0s/it]"],
        ["Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:20<00:20,  2.0s/it]"],
    ]
    verdict, lines = run(tmp_path, batches, Liveness(False, 1, "exited"))
    assert verdict.status == "FAILED"
    assert lines[0].startswith("importing engine, ")
    assert lines[1].startswith("loading weights 16/64 shards, ")
    assert "s elapsed" in lines[1] and ", GPU 1234 MiB" in lines[1]
    assert ", ETA " not in lines[1]  # one shard count gives no rate yet
    # The same stage again within progress_every_s: no new line.
    assert len(lines) == 2
    assert (tmp_path.glob("*/progress.log").__next__()).read_text().splitlines() == lines
    assert [s["stage"] for s in verdict.stages] == ["launched", "importing engine", "loading weights"]


def test_eta_from_the_shard_rate(tmp_path):
    batches = [
        ["Loading safetensors checkpoint shards:  25% Completed | 16/64 [00:10<00:30,  2.0s/it]"],
        *[[] for _ in range(5)],
        ["Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:20<00:20,  2.0s/it]"],
        [],
    ]
    _, lines = run(tmp_path, batches, Liveness(False, 1, "exited"), progress_every_s=0.0)
    last = lines[-1]
    assert last.startswith("loading weights 32/64 shards, ") and ", ETA " in last, lines


def test_progress_repeats_after_the_interval(tmp_path):
    batches = [["Init torch distributed begin."]] + [[] for _ in range(30)]
    _, lines = run(tmp_path, batches, Liveness(False, 1, "exited"), progress_every_s=0.05)
    assert len(lines) >= 2 and all(line.startswith("initialising distributed (NCCL/gloo), ") for line in lines)


def test_unknown_exit_status_is_said_not_printed_as_none(tmp_path):
    note = "exit status unknown: pid 7 is not this watchdog's child"
    verdict, _ = run(
        tmp_path, [["RuntimeError: CUDA error: out of memory"]], Liveness(False, None, "exited", note=note)
    )
    assert verdict.status == "FAILED" and verdict.headline.endswith(f"({'last stage: launched'}, {note})")
    assert "None" not in verdict.headline


def test_a_heartbeat_is_not_progress(tmp_path):
    """vLLM 0.8.5 repeating "Waiting for 1 core engine proc(s) to start" while its core hangs
    (the real log tests/data/real_logs/hang-vllm-v085-waiting-core-engine.log, one line a poll)."""
    log = Path(__file__).parents[2] / "data" / "real_logs" / "hang-vllm-v085-waiting-core-engine.log"
    heartbeat = log.read_text().splitlines()
    batches = [[heartbeat[i % len(heartbeat)]] if i % 5 == 0 else [] for i in range(200)]
    verdict, _ = run(tmp_path, batches, Liveness(True), alive_after=True, stall_timeout_s=0.5)
    assert verdict.status == "STALLED", verdict.first_line()


def test_every_stage_gets_a_line_even_within_one_poll(tmp_path):
    burst = [
        "(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] vLLM API server version 0.9.0",
        "(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] Resolved architecture: DeepseekV3ForCausalLM",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  9.0it/s]",
        "(EngineCore_DP0 pid=2) INFO 01-01 00:00:01 [b.py:1] Dynamo bytecode transform time: 5.1 s",
    ]
    _, lines = run(tmp_path, [burst, []], Liveness(False, 1, "exited"))
    stages = [line.split(",")[0] for line in lines]
    assert stages == ["importing engine", "resolving config", "loading weights",
                      "compiling (torch.compile / autotune)"], lines  # fmt: skip


def test_a_quiet_log_while_kernels_build_is_progress_and_a_quiet_one_after_is_a_stall(tmp_path):
    """SGLang 0.5.23 compiled its Marlin MoE kernel (ninja, nvcc) for over 240 s without a line: the
    watch called it STALLED (H100, 2026-12-06). Two checks at the bound find compilers, the third none."""
    batches = [["(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] vLLM API server version 0.9.0"]]
    verdict, lines = run(tmp_path, batches, Liveness(True), alive_after=True, stall_timeout_s=0.3,
                         builds=[["ninja", "nvcc"], ["cicc", "ninja"]])  # fmt: skip
    assert verdict.status == "STALLED", verdict.first_line()
    assert verdict.elapsed_s >= 0.9  # three bounds: two of them were builds
    building = [n for n in verdict.notes if "while building kernels" in n]
    assert len(building) == 2 and "(ninja, nvcc)" in building[0] and "(cicc, ninja)" in building[1]
    assert all(note in lines for note in building)  # the operator sees why the bound did not fire


class AnswersAtOnce:
    """An engine whose API answers in the first poll: it printed its last lines after that poll's read."""

    def health(self) -> int:
        return 200

    def prove(self, speculative: bool) -> Readiness:
        return Readiness(model="m", completion_tokens=1, completion_text="x", acceptance=None)


def test_the_ready_verdict_holds_the_lines_printed_before_the_engine_answered(tmp_path):
    batches = [
        ["(EngineCore pid=1) INFO [model_runner.py:1163] Graph capturing finished in 12 secs, took 0.77 GiB"],
        ["(EngineCore pid=1) INFO [model_runner.py:1163] Graph capturing finished in 13 secs, took 0.52 GiB",
         "INFO:     Application startup complete."],
    ]  # fmt: skip
    opts = WatchOptions(url=None, interval_s=0.01, diagnostics=tmp_path, progress=False)
    watch = Watch(FakeSource(batches, Liveness(True, state="running"), alive_after=True), opts)
    watch.probe = AnswersAtOnce()  # type: ignore[assignment]
    verdict = watch.run()
    assert verdict.status == "READY" and verdict.memory["cuda_graph_gib"] == [0.77, 0.52]
