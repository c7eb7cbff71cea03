"""specdeploy.serve.prewarm: the engine's read order, the bound, the readers, the residency reader
(on real vmtouch output), and the report, with a fake host that runs nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from specdeploy.connection import CommandHost
from specdeploy.serve import prewarm
from specdeploy.serve.prewarm import CHUNK_BYTES, GIB, ModelFile, Prewarmer

DATA = Path(__file__).parents[2] / "data" / "vmtouch"
SHARD = 5 * GIB


def kimi(shards: int = 64) -> list[ModelFile]:
    """A folder as the hub lays out a sharded model, listed in find's (unsorted) order."""
    files = [ModelFile(f"/m/model-{i:05d}-of-{shards:05d}.safetensors", SHARD) for i in range(shards, 0, -1)]
    return [*files, ModelFile("/m/config.json", 3000), ModelFile("/m/model.safetensors.index.json", 90_000),
            ModelFile("/m/tiktoken.model", 2_500_000), ModelFile("/m/.gitattributes", 0)]  # fmt: skip


def test_the_read_order_is_the_engines_small_files_first_then_shards_in_natural_order():
    order = [f.path for f in prewarm.read_order(kimi(12))]
    assert order[:3] == ["/m/config.json", "/m/model.safetensors.index.json", "/m/tiktoken.model"]
    assert order[3:6] == [f"/m/model-0000{i}-of-00012.safetensors" for i in (1, 2, 3)]
    assert order[-1] == "/m/model-00012-of-00012.safetensors" and "/m/.gitattributes" not in order


def test_a_model_under_the_bound_is_planned_whole_in_chunks():
    files = kimi(4)
    todo = prewarm.plan(files, budget_bytes=100 * GIB, readers=8)
    assert not todo.partial and todo.planned_bytes == todo.model_bytes == sum(f.size for f in files)
    assert max(c.size for c in todo.chunks) == CHUNK_BYTES and todo.files_touched == 7
    per_file: dict[str, int] = {}
    for c in todo.chunks:
        assert c.start == per_file.get(c.path, 0), c  # contiguous, in order, no gap or overlap
        per_file[c.path] = c.end


def test_a_model_over_the_bound_is_planned_from_its_first_shard_up_to_the_bound():
    """A 320 GiB model (64 x 5 GiB) against a host that may spare 80 GiB: the small files, 15 shards
    whole, the 16th cut at the bound."""
    files = kimi(64)
    todo = prewarm.plan(files, budget_bytes=prewarm.budget(160 * GIB, 0.5, 0), readers=16)
    assert todo.partial and todo.planned_bytes == 80 * GIB
    shards = sorted({c.path for c in todo.chunks if c.path.endswith(".safetensors")})
    assert shards == [f"/m/model-{i:05d}-of-00064.safetensors" for i in range(1, 17)]
    last = [c for c in todo.chunks if c.path.endswith("00016-of-00064.safetensors")][-1]
    assert last.end < SHARD


@pytest.mark.parametrize(("available", "fraction", "cap", "expected"),
                         [(100, 0.5, 0, 50), (100, 0.5, 20, 20), (100, 0.1, 20, 10), (0, 0.5, 0, 0)])  # fmt: skip
def test_the_budget_is_a_fraction_of_memavailable_and_at_most_the_cap(available, fraction, cap, expected):
    assert prewarm.budget(available * GIB, fraction, cap * GIB) == expected * GIB


def test_nothing_spared_plans_nothing():
    assert prewarm.plan(kimi(2), budget_bytes=0, readers=4).chunks == ()


@pytest.mark.parametrize(("cpus", "readers"), [(1, 1), (2, 2), (16, 16), (128, 16)])
def test_readers_follow_the_cpus_up_to_sixteen(cpus, readers):
    assert prewarm.default_readers(cpus) == readers


@pytest.mark.parametrize(("name", "fraction"),
                         [("partial-1.3.1.txt", 6144 / 16384), ("folder-1.3.1.txt", 6656 / 16896),
                          ("missing-1.3.1.txt", None)])  # fmt: skip
def test_the_residency_is_read_from_real_vmtouch_output(name, fraction):
    assert prewarm.resident_fraction((DATA / name).read_text()) == fraction


class FakeHost(CommandHost):
    """Answers the prewarm's commands as a host would, and records the readers' stdin."""

    def __init__(self, listing: str, mem_kb: int, cpus: int, reader_out: str, vmtouch: bool = True) -> None:
        super().__init__()
        self.listing, self.mem_kb, self.cpus, self.reader_out, self.vmtouch = listing, mem_kb, cpus, reader_out, vmtouch
        self.fed: list[str] = []

    def command(self, *argv: str) -> list[str]:
        return list(argv)


@pytest.fixture
def fake(monkeypatch):
    def install(host: FakeHost) -> FakeHost:
        def run(argv, input=None, **_):
            script = " ".join(argv)
            if "command -v vmtouch" in script:
                return subprocess.CompletedProcess(argv, 0 if host.vmtouch else 1, "", "")
            if argv[0] == "find":
                return subprocess.CompletedProcess(argv, 0, host.listing, "")
            if "MemAvailable" in script:
                return subprocess.CompletedProcess(argv, 0, f"MemAvailable: {host.mem_kb} kB\n{host.cpus}\n", "")
            if "vmtouch -f" in script:
                return subprocess.CompletedProcess(argv, 0, (DATA / "partial-1.3.1.txt").read_text(), "")
            host.fed.append(input or "")
            assert argv[-1] == str(host.cpus if host.cpus <= 16 else 16)  # the readers, as $1
            return subprocess.CompletedProcess(argv, 0, host.reader_out, "")

        monkeypatch.setattr(prewarm.subprocess, "run", run)
        return host

    return install


LISTING = "".join(f"{f.size}\t{f.path}\n" for f in kimi(64))


def test_a_partial_prewarm_feeds_the_readers_in_read_order_and_reports_how_much(fake):
    host = fake(FakeHost(LISTING, mem_kb=160 * 1024**2, cpus=32, reader_out="prewarm 100.0 140.0 0\n"))
    report = Prewarmer(host, "/m").warm()
    assert report.warmed and report.partial and report.readers == 16 and report.seconds == 40.0
    assert report.planned_bytes == 80 * GIB and report.gb_per_s == round(80 * GIB / 40 / 1e9, 3)
    assert report.resident_fraction == 6144 / 16384
    assert report.message.startswith("page cache warmed partially: the first 19 of 67 files in the engine's read order")
    assert "the bound: 50% of MemAvailable (160.0 GiB)" in report.message and "16 readers" in report.message
    records = host.fed[0].split("\0")
    assert records[:2] == ["0-3000", "/m/config.json"]
    assert records[6:8] == ["0-268435456", "/m/model-00001-of-00064.safetensors"]


def test_the_cap_is_named_when_it_is_the_bound(fake):
    host = fake(FakeHost(LISTING, mem_kb=1024**3, cpus=4, reader_out="prewarm 1 2 0\n"))
    report = Prewarmer(host, "/m", max_bytes=10 * GIB).warm()
    assert report.partial and report.planned_bytes == 10 * GIB and "serving_prewarm_max_gb (10.0 GiB)" in report.message


@pytest.mark.parametrize(("host", "says"), [
    (FakeHost(LISTING, 1024, 4, "", vmtouch=False), "page cache not warmed: no vmtouch on the host"),
    (FakeHost("", 1024, 4, ""), "page cache not warmed: cannot list /m"),
    (FakeHost(LISTING, 0, 4, ""), "page cache not warmed: nothing may be spared"),
    (FakeHost(LISTING, 1024**2, 4, "vmtouch: FATAL: open: Permission denied\nprewarm 1 2 123\n"),
     "page cache warming failed"),
])  # fmt: skip
def test_what_stops_a_prewarm_is_said_and_nothing_is_claimed(fake, host, says):
    report = Prewarmer(fake(host), "/m").warm()
    assert not report.warmed and report.message.startswith(says), report.message
    assert report.resident_fraction is None and report.gb_per_s == 0


def test_the_role_values_make_the_prewarmer():
    made = prewarm.prewarmer(CommandHost(), "/m", {"readers": "4", "max_fraction": "0.25", "max_gb": "1.5"})
    assert (made.readers, made.max_fraction, made.max_bytes) == (4, 0.25, int(1.5 * GIB))
    default = prewarm.prewarmer(CommandHost(), "/m", {})
    assert (default.readers, default.max_fraction, default.max_bytes) == (0, 0.5, 0)
