"""One host's engine containers and its rollout record: the steps a rollout takes there, each one
transport-safe (fetched afresh by id through `with_retries`: a dropped SSH connection or a restarting
dockerd is reconnected with backoff for up to `grace_s`) and idempotent (a retry after a lost reply
does no harm). The public interface both orchestrators drive: `serve.rollout.Rollout` (one host) and
`serve.group.GroupRollout` (one engine over several hosts), as community.docker's modules drive its
public engine driver."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from docker.client import DockerClient
from docker.errors import NotFound
from docker.models.containers import Container

from specdeploy.records import EngineRef, RecordStore, utc_now, write_container
from specdeploy.serve.config import CONFIG_LABEL, CONTAINER, ServingConfig
from specdeploy.transport import RECONNECT_GRACE_S, with_retries
from specdeploy.watch.watchdog import Verdict

PREVIOUS = f"{CONTAINER}-previous"
FAILED = f"{CONTAINER}-failed"
# The version before -previous, kept while a rollout is unproven: a failure puts it back as -previous.
OLDER = f"{CONTAINER}-older"
RUNNING_POLICY = {"Name": "unless-stopped"}

T = TypeVar("T")


def get_container(client: DockerClient, name: str) -> Container | None:
    try:
        return client.containers.get(name)
    except NotFound:
        return None


def remove_container(client: DockerClient, name: str) -> None:
    container = get_container(client, name)
    if container is not None:
        # Gone between the lookup and the removal (found by make test-faults): gone is what was asked.
        with contextlib.suppress(NotFound):
            container.remove(force=True)


def save_diagnostics(verdict: Verdict, container: Container) -> None:
    container.reload()
    write_container(Path(verdict.diagnostics), container.attrs)


def engine_ref(container: Container, proven: bool = False) -> EngineRef:
    proven_at = utc_now() if proven else None
    return EngineRef(
        str(container.id), str(container.attrs["Image"]), str(container.labels.get(CONFIG_LABEL, "")), proven_at
    )


def matches(container: Container, cfg: ServingConfig, image_id: str) -> bool:
    return bool(container.labels.get(CONFIG_LABEL) == cfg.digest() and container.attrs["Image"] == image_id)


class EngineHost:
    """The engine's containers on one host and the host's rollout record (every step recorded before it
    is taken: records.PHASES)."""

    def __init__(self, connect: Callable[[], DockerClient], store: RecordStore,
                 grace_s: float = RECONNECT_GRACE_S) -> None:  # fmt: skip
        self.connect, self.store, self.grace_s = connect, store, grace_s
        self.client = connect()
        self.record = store.load()
        self.began = False  # a step was taken: never report changed=false after that

    def reconnect(self) -> None:
        self.client = self.connect()

    def retry(self, call: Callable[[], T]) -> T:
        return with_retries(call, self.reconnect, self.grace_s)

    def get(self, name_or_id: str) -> Container | None:
        return self.retry(lambda: get_container(self.client, name_or_id))

    def rename(self, container_id: str, name: str) -> None:
        def rename() -> None:
            container = self.client.containers.get(container_id)
            if container.name != name:
                remove_container(self.client, name)
                container.rename(name)

        self.retry(rename)

    def stop(self, container_id: str, timeout: int) -> None:
        self.retry(lambda: self.client.containers.get(container_id).stop(timeout=timeout))

    def remove(self, name: str) -> None:
        self.retry(lambda: remove_container(self.client, name))

    def create(self, cfg: ServingConfig, image_id: str) -> Container:
        def create() -> Container:
            existing = get_container(self.client, CONTAINER)  # a create whose reply was lost
            if existing is not None and matches(existing, cfg, image_id):
                return existing
            return self.client.containers.create(**cfg.container_kwargs(image_id))

        return self.retry(create)

    def step(self, phase: str) -> None:
        self.began = True
        self.store.save(self.record.stamp(phase))

    def retire(self, container_id: str) -> None:
        """The old engine becomes `-previous` only if it was proven READY (the one before it waits as
        `-older` until the new one is proven); else `-failed`, for its logs."""
        if not self.record.proves(container_id):
            self.rename(container_id, FAILED)
            return
        before = self.get(PREVIOUS)
        if before is not None:
            self.rename(str(before.id), OLDER)
        self.rename(container_id, PREVIOUS)

    def promote(self, container_id: str, bench: dict[str, Any] | None = None,
                 startup: list[dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.step("promoting")
        self.retry(lambda: self.client.containers.get(container_id).update(restart_policy=RUNNING_POLICY))
        container = self.get(container_id)
        assert container is not None
        if bench is None and self.record.last_ready and self.record.last_ready.container_id == container_id:
            bench = self.record.last_ready.bench  # restored or re-proven: its figures stay
        proven = replace(engine_ref(container, proven=True), bench=bench, startup=startup)
        self.record.last_ready, self.record.new = proven, None
        self.step("done")
