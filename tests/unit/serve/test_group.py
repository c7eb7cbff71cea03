"""A multi-node engine's rollout (specdeploy.serve.group) on fake Docker engines, one per rank's host:
the ranks are started headless-first and proven together, a failure rolls every rank back together,
and nothing is left running headless when nothing can serve."""

from __future__ import annotations

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.serve.config import CONTAINER, ServingConfig
from specdeploy.serve.engine_host import FAILED, PREVIOUS
from specdeploy.serve.group import GroupRollout, Member
from specdeploy.serve.ranks import problems, ranks_of
from specdeploy.serve.rollout import Rollout
from specdeploy.watch.watchdog import Verdict

from ..fakes import FakeDocker, MemoryStore

HOSTS = ("tb-1", "tb-2")


class Host(FakeDocker):
    """A rank's host; every container start is logged, in order, with the fleet's other hosts."""

    def __init__(self, name: str, starts: list[str]) -> None:
        super().__init__()
        self.name, self.starts = name, starts

    def maybe_fail(self, what: str) -> None:
        super().maybe_fail(what)
        if what == "start":
            self.starts.append(self.name)


class Group:
    """Two hosts, one engine over both; the watcher judges the group by rank 0's image and by
    whether every rank runs (`kill` stops a rank's container while it is watched)."""

    def __init__(self, tmp_path, outcomes: dict[str, str] | None = None) -> None:
        self.starts: list[str] = []
        self.hosts = [Host(name, self.starts) for name in HOSTS]
        self.stores = [MemoryStore() for _ in HOSTS]
        self.outcomes, self.tmp_path = outcomes or {}, tmp_path
        self.kill: int | None = None
        self.watched: list[list[tuple[str, str]]] = []
        self.left = 0
        self.replicas: list[int] = []  # the data-parallel replicas each watch was told to prove

    def cfg(self, tag: str, rank: int) -> ServingConfig:
        mode = "model_parallel" if tag.startswith("tp") else "data_parallel"
        return ServingConfig(engine="vllm", image=tag, model_path="/srv/models/target", served_model_name=tag,
                             nnodes=2, node_rank=rank, master_addr="10.0.0.1", multi_node=mode,
                             tensor_parallel_size=2 if mode == "model_parallel" else 1)  # fmt: skip

    def watch(self, stall_floor_s: float, replicas: int) -> Verdict:
        engines = [h.named(CONTAINER) for h in self.hosts]
        self.replicas.append(replicas)
        assert all(e is not None for e in engines)
        if self.kill is not None:
            engines[self.kill].stop()  # type: ignore[union-attr]
            self.kill = None
        self.watched.append([(e.image_id, e.status) for e in engines])  # type: ignore[union-attr]
        dead = [i for i, e in enumerate(engines) if e.status != "running"]  # type: ignore[union-attr]
        status = "FAILED" if dead else self.outcomes.get(engines[0].image_id, "READY")  # type: ignore[union-attr]
        headline = f"rank {dead[0]} on {HOSTS[dead[0]]} (headless): killed" if dead else status
        return Verdict(status=status, elapsed_s=1.0, stage="API server up", headline=headline,
                       diagnostics=str(self.tmp_path))  # fmt: skip

    def rollout(self, tag: str) -> GroupRollout:
        members = [
            Member(rank, HOSTS[rank], Rollout(lambda h=host: h, store, _never, self.tmp_path, grace_s=5),  # type: ignore[misc]
                   self.cfg(tag, rank), f"sha256:{tag}")
            for rank, (host, store) in enumerate(zip(self.hosts, self.stores, strict=True))
        ]  # fmt: skip
        return GroupRollout(members, self.watch, before_stop=self._leave)

    def _leave(self) -> None:
        self.left += 1

    def deploy(self, tag: str):
        return self.rollout(tag).deploy(lambda m: f"warmed {m.host}")

    def serving(self) -> list[tuple[str, str, str] | None]:
        return [(c.image_id, c.status, c.policy) if (c := h.named(CONTAINER)) else None for h in self.hosts]

    def running(self) -> list[tuple[str, str]]:
        return [(h.name, c.name) for h in self.hosts for c in h.all if c.status == "running"]


def _never(name: str, stall_floor_s: float = 0.0) -> Verdict:
    raise AssertionError(f"a rank was watched alone: {name}")


def proven(group: Group, tag: str) -> None:
    assert group.serving() == [(f"sha256:{tag}", "running", "unless-stopped")] * 2
    for host, store in zip(group.hosts, group.stores, strict=True):
        record = store.load()
        engine = host.named(CONTAINER)
        assert engine is not None and record.proves(engine.id) and record.phase == "done"
        assert record.last_ready is not None and record.last_ready.started_at == engine.attrs["State"]["StartedAt"]


def test_the_headless_rank_starts_first_and_the_group_is_proven_as_one(tmp_path):
    group = Group(tmp_path)
    first = group.deploy("v1")
    assert (first.status, first.changed) == ("deployed", True)
    assert group.starts == ["tb-2", "tb-1"]  # rank 1 (headless) waits for rank 0, which starts last
    proven(group, "v1")
    assert first.warm == "tb-1: warmed tb-1; tb-2: warmed tb-2"
    again = group.deploy("v1")
    assert (again.status, again.changed) == ("unchanged", False) and group.starts == ["tb-2", "tb-1"]


def test_a_failed_version_rolls_every_rank_back_together(tmp_path):
    group = Group(tmp_path, {"sha256:bad": "FAILED"})
    group.deploy("v1")
    out = group.deploy("bad")
    assert out.status == "rolled-back" and "rolled every rank back" in out.notes[0]
    proven(group, "v1")
    assert [h.named(FAILED).image_id for h in group.hosts] == ["sha256:bad"] * 2  # type: ignore[union-attr]
    assert all(h.named(FAILED).status == "exited" for h in group.hosts)  # type: ignore[union-attr]
    assert group.left == 1  # the group left the router once, as one worker


def test_a_headless_rank_killed_during_the_load_is_named_and_both_go_back(tmp_path):
    group = Group(tmp_path)
    group.deploy("v1")
    group.kill = 1
    out = group.deploy("v2")
    assert out.status == "rolled-back"
    assert out.verdict is not None and out.verdict["headline"].startswith("rank 1 on tb-2 (headless)")
    proven(group, "v1")
    assert [h.named(FAILED).image_id for h in group.hosts] == ["sha256:v2"] * 2  # type: ignore[union-attr]


def test_nothing_is_left_running_headless_when_nothing_can_serve(tmp_path):
    group = Group(tmp_path, {"sha256:bad": "FAILED"})
    out = group.deploy("bad")
    assert out.status == "failed" and "no version proven READY" in out.notes[0]
    assert group.running() == []
    group2 = Group(tmp_path, {"sha256:v1": "READY"})
    group2.deploy("v1")
    group2.outcomes = {"sha256:v2": "FAILED", "sha256:v1": "FAILED"}  # the previous version fails too
    out = group2.deploy("v2")
    assert out.status == "failed" and "every rank stopped" in out.notes[-1]
    assert group2.running() == []


def test_a_rank_that_restarted_alone_makes_the_group_restart_as_one(tmp_path):
    group = Group(tmp_path)
    group.deploy("v1")
    headless = group.hosts[1].named(CONTAINER)
    assert headless is not None
    headless.stop()
    headless.start()  # its restart policy brought it back, outside its group
    out = group.deploy("v1")
    assert out.status == "deployed" and out.notes[0] == "rank 1 on tb-2 restarted since its proof"
    proven(group, "v1")
    assert group.hosts[1].named(PREVIOUS) is None  # the same version, proven again: nothing retired


def test_a_version_brought_back_is_proven_by_its_own_replica_count(tmp_path):
    """Found on the test bed: the data-parallel attempt failed, and the tensor-parallel version it
    replaced was then asked for a completion on a second replica it never had (HTTP 400)."""
    group = Group(tmp_path, {"sha256:dp": "FAILED"})
    group.deploy("tp1")
    out = group.deploy("dp")
    assert out.status == "rolled-back" and group.replicas == [1, 2, 1]
    proven(group, "tp1")
    assert group.rollout("dp").serves_replicas() is False  # the sentinel is told what serves, not what failed


def test_a_new_version_keeps_the_proven_one_as_previous_on_every_rank(tmp_path):
    group = Group(tmp_path)
    group.deploy("v1")
    group.deploy("v2")
    proven(group, "v2")
    assert [h.named(PREVIOUS).image_id for h in group.hosts] == ["sha256:v1"] * 2  # type: ignore[union-attr]


def test_the_group_is_found_by_its_rank_0_and_must_have_every_rank_once():
    dp = {"nnodes": 2, "master_addr": "10.0.0.1", "master_port": 29550}
    configs = {"a": {**dp, "node_rank": 0}, "b": {**dp, "node_rank": 1}, "c": {**dp, "master_addr": "10.0.0.9"},
               "d": {"nnodes": 1}, "e": None}  # fmt: skip
    assert ranks_of(configs, configs["a"]) == {"a": 0, "b": 1}
    assert ranks_of(configs, {"nnodes": 1}) == {}
    assert problems({"a": 0, "b": 1}, 2) == [] and problems({}, 1) == []
    (missing,) = problems({"a": 0}, 2)
    assert "no host in this play has serving_node_rank 1" in missing and "--limit" in missing
    (failed,) = problems({"b": 1}, 2, ["a"])
    assert failed.endswith("; a failed before the rollout: see its error above")
    (twice,) = problems({"a": 0, "b": 0}, 2)[:1]
    assert "serving_node_rank=0 is given to a, b" in twice
    with pytest.raises(SpecdeployError, match=r"ranks 0\.\.1"):
        GroupRollout([Member(1, "b", None, None, "x"), Member(2, "c", None, None, "x")], _never)  # type: ignore[arg-type]
