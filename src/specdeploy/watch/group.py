"""Watch the ranks of one engine over several hosts as one (serving_nnodes > 1).

Rank 0 serves the API, so readiness is its: /health, then a real completion, one per data-parallel
rank when the ranks are replicas. Every other rank is watched on its own host as well: its process
state (a dead rank ends the watch in the same poll, named with its host, even while rank 0 still
answers) and its log (its own root-cause collector, and news from it is progress: rank 0 prints
the same heartbeat while it waits for a rank that loads). The first rank found dead gives the
verdict, with its own root cause; each rank's log is kept in the run's folder, one per host.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specdeploy.watch.loglines import noise_match, parse_line
from specdeploy.watch.rootcause import RootCause, TracebackCollector
from specdeploy.watch.sources import Liveness, Source
from specdeploy.watch.watchdog import Verdict, Watch, WatchOptions


@dataclass
class Rank:
    """One rank's container on its host, and what its log said."""

    rank: int
    host: str
    source: Source
    collector: TracebackCollector = field(default_factory=TracebackCollector)
    raw: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        role = "the API" if self.rank == 0 else "headless"
        return f"rank {self.rank} on {self.host} ({role})"

    def read(self) -> list[str]:
        """New lines, each not noise fed to this rank's collector; returns those that count as progress
        (as Watch._ingest judges rank 0's: noise is never a cause, and progress only where it says so)."""
        progress = []
        for raw in self.source.read_new():
            self.raw.append(raw)
            line = parse_line(raw)
            noise = noise_match(line.text)
            if noise is None:
                self.collector.feed(line)
            if noise is None or noise.progress:
                progress.append(raw)
        return progress


class GroupSource:
    """The group as one Source: rank 0's log is the watch's own; the other ranks are read into their
    own collectors, and liveness is the group's (the first rank found dead or unreachable)."""

    def __init__(self, ranks: list[Rank]) -> None:
        self.ranks = sorted(ranks, key=lambda r: r.rank)
        self.head = self.ranks[0]
        self.others = self.ranks[1:]
        self.description = f"{len(self.ranks)} ranks: " + ", ".join(r.name for r in self.ranks)
        self.fallen: Rank | None = None  # the first rank found dead
        self.news: list[str] = []  # the other ranks' new lines, as `rank N: line`

    def read_new(self) -> list[str]:
        for rank in self.others:
            self.news += [f"rank {rank.rank}: {line}" for line in rank.read()]
        lines = self.head.source.read_new()
        self.head.raw += lines
        return lines

    def liveness(self) -> Liveness:
        for rank in [*self.others, self.head]:
            life = rank.source.liveness()
            if life.unreachable:
                return replace(life, note=f"{rank.name}: {life.note}")
            if not life.alive:
                if self.fallen is None:
                    self.fallen = rank
                    rank.read()  # its last lines: the traceback may land with the exit
                return replace(life, note=f"{rank.name}: {life.note}" if life.note else rank.name)
        return self.head.source.liveness()

    def dump_stacks(self) -> str:
        return "\n".join(f"##### {rank.name}\n{rank.source.dump_stacks()}" for rank in self.ranks)

    def kernel_builds(self) -> list[str]:
        return [f"{rank.name}: {name}" for rank in self.ranks for name in rank.source.kernel_builds()]

    def gpu_memory_mib(self) -> int | None:
        sizes = [m for rank in self.ranks if (m := rank.source.gpu_memory_mib()) is not None]
        return sum(sizes) if sizes else None


class GroupWatch(Watch):
    """The watch loop over a GroupSource: rank 0's readiness, every rank's liveness and log."""

    source: GroupSource

    def __init__(self, source: GroupSource, options: WatchOptions) -> None:
        super().__init__(source, options)
        self.source = source

    def _ingest(self) -> None:
        super()._ingest()
        news, self.source.news = self.source.news, []
        if any([self._is_news(line) for line in news]):  # (a list: each line is remembered)
            self._progress()

    def _failed(self, life: Liveness) -> Verdict:
        fallen = self.source.fallen or self.source.head
        # Rank 0 may print no traceback when it died of another rank's failure: that rank's is the cause.
        with_cause = [r for r in [fallen, *self.source.ranks] if self._collector(r).root_cause() is not None]
        cause_from = with_cause[0] if with_cause else fallen
        saved, self.collector = self.collector, self._collector(cause_from)
        self.prefix = f"{fallen.name}: " if cause_from is fallen else f"{fallen.name}, cause in {cause_from.name}: "
        try:
            return super()._failed(life)
        finally:
            self.collector = saved

    def _cause(self) -> RootCause | None:
        for rank in self.source.ranks:
            cause = self._collector(rank).root_cause()
            if cause is not None:
                self.prefix = f"{rank.name}: "
                return cause
        return None

    def _collector(self, rank: Rank) -> TracebackCollector:
        return self.collector if rank is self.source.head else rank.collector

    def _write_diagnostics(self, verdict: Verdict) -> None:
        super()._write_diagnostics(verdict)
        for rank in self.source.ranks:
            (self.diag_dir / f"rank{rank.rank}-{rank.host}.log").write_text("\n".join(rank.raw) + "\n")


def watch_group(ranks: list[Rank], options: WatchOptions) -> Verdict:
    verdict = GroupWatch(GroupSource(ranks), options).run()
    verdict.notes.append("ranks: " + ", ".join(r.name for r in sorted(ranks, key=lambda r: r.rank)))
    return verdict
