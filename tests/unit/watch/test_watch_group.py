"""The watch over a multi-node engine's ranks (specdeploy.watch.group), on scripted sources: the first
rank to die gives the verdict with its own root cause and host, a headless rank's log is progress,
and every rank's log lands in the run's folder, one per host."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from specdeploy.names import DP_RANK_HEADER
from specdeploy.watch.group import GroupSource, GroupWatch, Rank
from specdeploy.watch.readiness import NotReady, ReadinessProbe
from specdeploy.watch.sources import Liveness
from specdeploy.watch.watchdog import WatchOptions

TRACEBACK = [
    "(EngineCore_DP1 pid=7) ERROR 12-03 08:00:00 [core.py:1] EngineCore failed to start.",
    "(EngineCore_DP1 pid=7) Traceback (most recent call last):",
    '(EngineCore_DP1 pid=7)   File "/opt/engine/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 9, in run',
    "(EngineCore_DP1 pid=7) RuntimeError: Did not receive response from front-end process within 5 minutes",
]


@dataclass
class Scripted:
    batches: list[list[str]]
    dies_after: int | None = None  # polls of liveness before it reports an exit
    exit_code: int = 1
    description: str = "scripted"
    polls: int = field(default=0)

    def read_new(self) -> list[str]:
        return self.batches.pop(0) if self.batches else []

    def liveness(self) -> Liveness:
        self.polls += 1
        if self.dies_after is not None and self.polls > self.dies_after:
            return Liveness(False, self.exit_code, "exited")
        return Liveness(True, state="running")

    def dump_stacks(self) -> str:
        return f"stacks of {self.description}"

    def kernel_builds(self) -> list[str]:
        return []

    def gpu_memory_mib(self) -> int | None:
        return None


def watch(tmp_path, head: Scripted, headless: Scripted, **options):
    opts = WatchOptions(url=None, interval_s=0.01, diagnostics=tmp_path, progress=False, **options)
    ranks = [Rank(0, "tb-1", head), Rank(1, "tb-2", headless)]
    return GroupWatch(GroupSource(ranks), opts).run()


def test_a_headless_rank_that_dies_is_the_verdict_with_its_own_cause_and_host(tmp_path):
    head = Scripted([["(APIServer pid=1) INFO vLLM API server version 0.32.0"]])
    headless = Scripted([["INFO Launching 1 data parallel engine(s) in headless mode"], TRACEBACK], dies_after=3)
    verdict = watch(tmp_path, head, headless)
    assert verdict.status == "FAILED"
    assert verdict.headline.startswith("rank 1 on tb-2 (headless): RuntimeError: Did not receive response")
    assert verdict.exit_code == 1
    folder = tmp_path / next(p.name for p in tmp_path.iterdir())
    assert "Did not receive response" in (folder / "rank1-tb-2.log").read_text()
    assert "API server version" in (folder / "rank0-tb-1.log").read_text()


def test_rank_0_dying_of_a_headless_ranks_failure_names_both(tmp_path):
    head = Scripted([["(APIServer pid=1) INFO vLLM API server version 0.32.0"]], dies_after=2, exit_code=137)
    headless = Scripted([TRACEBACK])
    verdict = watch(tmp_path, head, headless)
    assert verdict.headline.startswith("rank 0 on tb-1 (the API), cause in rank 1 on tb-2 (headless): RuntimeError")


def test_a_headless_ranks_news_is_progress_and_a_stall_dumps_every_ranks_stacks(tmp_path):
    head = Scripted([])  # rank 0 prints nothing new while it waits for the other rank
    headless = Scripted([[f"Loading shard {i}"] for i in range(30)])
    verdict = watch(tmp_path, head, headless, stall_timeout_s=0.2, timeout_s=30)
    assert verdict.status == "STALLED" and verdict.elapsed_s > 0.3  # not before rank 1 went quiet
    stacks = (tmp_path / next(p.name for p in tmp_path.iterdir()) / "stacks.txt").read_text()
    assert "##### rank 0 on tb-1 (the API)" in stacks and "##### rank 1 on tb-2 (headless)" in stacks


def test_readiness_asks_every_data_parallel_rank_for_a_completion():
    asked: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        asked.append(request.headers.get(DP_RANK_HEADER))
        if request.headers.get(DP_RANK_HEADER) == "2":
            raise httpx.ReadTimeout("no answer", request=request)
        return httpx.Response(200, json={"usage": {"completion_tokens": 1}, "choices": [{"text": "!"}]})

    probe = ReadinessProbe("http://engine", "m", 4, None, 5, data_parallel_ranks=2)
    probe.client = httpx.Client(base_url="http://engine", transport=httpx.MockTransport(answer))
    assert probe.prove(False).completion_tokens == 1 and asked == ["0", "1"]
    probe.data_parallel_ranks = 3
    try:
        probe.prove(False)
    except NotReady as exc:
        assert str(exc).startswith("data-parallel rank 2: ReadTimeout")
    else:
        raise AssertionError("a rank that does not answer is not READY")


class AnswersFiveHundred:
    """Rank 0's API: up, and its first completion answered 500 (the engine printed why)."""

    def health(self) -> int:
        return 200

    def prove(self, speculative: bool) -> None:
        raise NotReady("HTTP 500 from POST /v1/completions: 'EngineCore encountered an issue'")


def test_a_failed_proof_puts_the_root_cause_from_the_ranks_logs_first(tmp_path):
    worker_error = [
        "(Worker_DP0 pid=54) ERROR 12-03 08:11:57 [multiproc_executor.py:1063] Traceback (most recent call last):",
        '(Worker_DP0 pid=54) ERROR 12-03 08:11:57 [multiproc_executor.py:1063]   File "/opt/engine/lib/python3.11/'
        'site-packages/vllm/distributed/device_communicators/base_device_communicator.py", line 296, in all_gatherv',
        "(Worker_DP0 pid=54) ERROR 12-03 08:11:57 [multiproc_executor.py:1063]     raise NotImplementedError",
        "(Worker_DP0 pid=54) ERROR 12-03 08:11:57 [multiproc_executor.py:1063] NotImplementedError",
    ]
    head = Scripted([["(APIServer pid=1) INFO vLLM API server version 0.32.0"], [], worker_error])
    opts = WatchOptions(url=None, interval_s=0.01, diagnostics=tmp_path, progress=False)
    watch = GroupWatch(GroupSource([Rank(0, "tb-1", head), Rank(1, "tb-2", Scripted([]))]), opts)
    watch.probe = AnswersFiveHundred()  # type: ignore[assignment]
    verdict = watch.run()
    assert verdict.status == "FAILED"
    assert verdict.headline.startswith("rank 0 on tb-1 (the API): NotImplementedError at ")
    assert "base_device_communicator.py:296 [Worker_DP0]" in verdict.headline
    assert verdict.headline.endswith("(readiness check failed: HTTP 500 from POST /v1/completions: "
                                     "'EngineCore encountered an issue')")  # fmt: skip


def test_a_headless_ranks_known_noise_is_neither_progress_nor_a_cause(tmp_path):
    noise = ("Failed to import Triton kernels. Please make sure your triton version is compatible. Error: "
             "cannot import name 'SparseMatrix' from 'triton_kernels.tensor'")  # fmt: skip
    headless = Scripted([[f"(EngineCore pid={i}) {noise}"] for i in range(60)])  # each line new
    verdict = watch(tmp_path, Scripted([]), headless, stall_timeout_s=0.2, timeout_s=30)
    assert verdict.status == "STALLED" and verdict.elapsed_s < 0.5  # the noise kept nothing alive
