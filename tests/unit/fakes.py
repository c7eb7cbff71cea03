"""Fakes for Docker (the SDK's containers API as the rollout uses it) and the host's record store."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from docker.errors import APIError, NotFound

from specdeploy.records import RolloutRecord
from specdeploy.watch.watchdog import Verdict

_ids = itertools.count(1)


class FakeContainer:
    def __init__(self, engine: FakeDocker, name: str, image: str, labels: dict[str, str]) -> None:
        self.engine, self.name, self.labels = engine, name, labels
        self.id = f"c{next(_ids):04d}"
        self.status = "created"
        self.policy = "no"
        self.attrs: dict[str, Any] = {}
        self.image_id = image
        self.starts = 0
        self._sync()

    def _sync(self) -> None:
        self.attrs = {"Image": self.image_id, "State": {"Status": self.status, "StartedAt": f"start-{self.starts}"},
                      "HostConfig": {"RestartPolicy": {"Name": self.policy}}, "Name": f"/{self.name}"}  # fmt: skip

    def _call(self, what: str) -> None:
        self.engine.maybe_fail(what)

    def reload(self) -> None:
        self._call("reload")
        self._sync()

    def start(self) -> None:
        self._call("start")
        if self.status != "running":
            self.status, self.starts = "running", self.starts + 1
        self._sync()

    def stop(self, timeout: int = 10) -> None:
        self._call("stop")
        if self.status == "running":
            self.status = "exited"
        self._sync()

    def rename(self, name: str) -> None:
        self._call("rename")
        if any(c.name == name for c in self.engine.all if c is not self):
            raise APIError(f"Conflict. The container name {name!r} is already in use")
        self.name = name
        self._sync()

    def update(self, restart_policy: dict[str, str]) -> None:
        self._call("update")
        self.policy = restart_policy["Name"]
        self._sync()

    def remove(self, force: bool = False) -> None:
        self._call("remove")
        self.engine.all.remove(self)

    def logs(self, **_: Any) -> bytes:
        return b""


class FakeContainers:
    def __init__(self, engine: FakeDocker) -> None:
        self.engine = engine

    def get(self, name_or_id: str) -> FakeContainer:
        self.engine.maybe_fail("get")
        for c in self.engine.all:
            if name_or_id in (c.name, c.id):
                return c
        raise NotFound(f"No such container: {name_or_id}")

    def create(self, **kwargs: Any) -> FakeContainer:
        self.engine.maybe_fail("create")
        container = FakeContainer(self.engine, kwargs["name"], kwargs["image"], dict(kwargs.get("labels", {})))
        self.engine.all.append(container)
        self.engine.created.append(kwargs)
        return container


@dataclass
class FakeImage:
    labels: dict[str, str]


class FakeImages:
    """Every image the engine is asked about is there, labelled with the engine version the build sets."""

    def __init__(self, engine: FakeDocker) -> None:
        self.engine = engine

    def get(self, image_id: str) -> FakeImage:
        self.engine.maybe_fail("image")
        return FakeImage({"io.specdeploy.engine-version": "0.32.0"})


@dataclass
class FakeDocker:
    """One host's Docker engine; `fail` holds exceptions to raise at the next calls of a kind."""

    all: list[FakeContainer] = field(default_factory=list)
    fail: dict[str, list[Exception]] = field(default_factory=dict)
    calls: int = 0
    created: list[dict[str, Any]] = field(default_factory=list)  # each create's arguments

    def __post_init__(self) -> None:
        self.containers = FakeContainers(self)
        self.images = FakeImages(self)

    def maybe_fail(self, what: str) -> None:
        self.calls += 1
        queue = self.fail.get(what)
        if queue:
            raise queue.pop(0)

    def named(self, name: str) -> FakeContainer | None:
        return next((c for c in self.all if c.name == name), None)

    def crash_all(self) -> None:
        """dockerd killed without live-restore: every container stops."""
        for c in self.all:
            if c.status == "running":
                c.status = "exited"
                c._sync()


class Interrupted(BaseException):
    """The controller killed (SIGKILL) right after the record reached a phase."""


@dataclass
class MemoryStore:
    """The host's rollout.json; `interrupt_at` kills the 'controller' once that phase is recorded."""

    text: str = ""
    interrupt_at: str | None = None
    phases: list[str] = field(default_factory=list)

    def load(self) -> RolloutRecord:
        return RolloutRecord.from_json(self.text)

    def save(self, record: RolloutRecord) -> None:
        self.text = record.to_json()
        self.phases.append(record.phase)
        if record.phase == self.interrupt_at:
            self.interrupt_at = None
            raise Interrupted(record.phase)


class FakeWatch:
    """The watchdog: READY or FAILED by the container's image; `lost` makes it lose contact."""

    def __init__(self, engine: FakeDocker, outcomes: dict[str, str]) -> None:
        self.engine, self.outcomes, self.watched = engine, outcomes, []
        self.floors: list[float] = []
        self.diagnostics = "/tmp/specdeploy-fake-diagnostics"  # the run folder each verdict names

    def __call__(self, name: str, stall_floor_s: float = 0.0) -> Verdict:
        container = self.engine.named(name)
        assert container is not None, name
        self.watched.append((name, container.image_id))
        self.floors.append(stall_floor_s)
        status = self.outcomes.get(container.image_id, "READY") if container.status == "running" else "FAILED"
        # A READY start-up's stages as the watchdog times them (its longest: 37 s resolving config).
        stages = [{"stage": "launched", "began_s": 0.0, "seconds": 13.0},
                  {"stage": "resolving config", "began_s": 13.0, "seconds": 37.0}]  # fmt: skip
        startup = stages if status == "READY" else []
        return Verdict(status=status, elapsed_s=1.0, stage="API server up", headline=f"{status} {container.image_id}",
                       diagnostics=self.diagnostics, startup=startup)  # fmt: skip
