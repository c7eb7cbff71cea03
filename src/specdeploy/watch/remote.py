"""Watch an engine container on a remote host: Docker SDK over SSH for state and logs, an SSH
port forward for readiness (the API binds the host's loopback by default).

Both survive transport faults: while the host cannot be reached (SSH dropped, dockerd restarting)
the source reports "unreachable", which is neither a death nor a stall; it reconnects with backoff
and carries on where the log left off. Only an outage longer than the grace is a verdict: LOST.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import TypeVar

from docker.client import DockerClient
from docker.errors import NotFound

from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.targets import Forward
from specdeploy.transport import BACKOFF_S, RECONNECT_GRACE_S, describe, is_transport_error
from specdeploy.watch.group import Rank as GroupRank
from specdeploy.watch.group import watch_group
from specdeploy.watch.sources import ContainerSource, Liveness
from specdeploy.watch.watchdog import Verdict, Watch, WatchOptions

T = TypeVar("T")


class ReconnectingContainerSource:
    """A ContainerSource that outlives its connection."""

    def __init__(self, connect: Callable[[], DockerClient], name: str, forward: Forward | None = None,
                 grace_s: float = RECONNECT_GRACE_S) -> None:  # fmt: skip
        self.connect, self.name, self.forward, self.grace_s = connect, name, forward, grace_s
        self.description = f"container {name}"
        self.inner = self._attach()
        self.lost_since: float | None = None
        self.lost_why = ""
        self.outages: list[float] = []  # seconds of each outage survived
        self._next_try = 0.0
        self._attempt = 0

    def _attach(self) -> ContainerSource:
        try:
            return ContainerSource(self.connect().containers.get(self.name))
        except NotFound as exc:
            raise SpecdeployError(f"no container {self.name!r} on the target") from exc

    def _lost(self, exc: BaseException) -> None:
        if not is_transport_error(exc):
            raise exc
        if self.lost_since is None:
            self.lost_since, self.lost_why, self._attempt = time.monotonic(), describe(exc), 0
            self._next_try = self.lost_since + BACKOFF_S[0]

    def _try_reconnect(self) -> None:
        now = time.monotonic()
        assert self.lost_since is not None
        if now < self._next_try:
            return
        self._attempt += 1
        self._next_try = now + BACKOFF_S[min(self._attempt, len(BACKOFF_S) - 1)]
        try:
            fresh = self._attach()
        except Exception as exc:
            if is_transport_error(exc) or isinstance(exc, SpecdeployError):
                return
            raise
        if self.forward is not None and not self.forward.ensure():
            return
        # The log goes on where it stopped: the new source starts at the old one's position.
        fresh.adopt_position(self.inner)
        self.inner = fresh
        self.outages.append(round(now - self.lost_since, 1))
        self.lost_since = None

    def _while_reachable(self, ask: Callable[[ContainerSource], T], otherwise: T) -> T:
        """ASK of the inner source, or OTHERWISE while contact is lost (a failure marks it lost)."""
        if self.lost_since is not None:
            return otherwise
        try:
            return ask(self.inner)
        except Exception as exc:
            self._lost(exc)
            return otherwise

    def read_new(self) -> list[str]:
        return self._while_reachable(lambda inner: inner.read_new(), [])

    def liveness(self) -> Liveness:
        if self.lost_since is None and self.forward is not None and not self.forward.alive():
            self._lost(ConnectionError("the SSH port forward's session ended"))
        if self.lost_since is None:
            try:
                return self.inner.liveness()
            except Exception as exc:
                self._lost(exc)
        self._try_reconnect()
        if self.lost_since is None:
            return self.liveness()
        down = time.monotonic() - self.lost_since
        if down > self.grace_s:
            return Liveness(True, state=f"unreachable for {down:.0f}s", unreachable=True, lost=True,
                            note=f"no contact for {down:.0f}s ({self.lost_why})")  # fmt: skip
        return Liveness(True, state=f"unreachable for {down:.0f}s", unreachable=True, note=self.lost_why)

    def dump_stacks(self) -> str:
        try:
            return self.inner.dump_stacks()
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            return f"no stack dump: the host could not be reached ({describe(exc)})"

    def kernel_builds(self) -> list[str]:
        return self._while_reachable(lambda inner: inner.kernel_builds(), [])

    def gpu_memory_mib(self) -> int | None:
        return self._while_reachable(lambda inner: inner.gpu_memory_mib(), None)


def watch_container_on_host(
    conn: HostConnection, container: str, api_port: int | None, options: WatchOptions,
    grace_s: float = RECONNECT_GRACE_S,
) -> Verdict:  # fmt: skip
    """Watch CONTAINER on the host; readiness through a forward to API_PORT when one is given."""
    with ExitStack() as stack:
        forward = None
        if api_port is not None:
            forward = conn.forward(api_port)
            forward.start()
            stack.callback(forward.stop)
            options = replace(options, url=f"http://127.0.0.1:{forward.local}")
        source = ReconnectingContainerSource(conn.reconnect_docker, container, forward, grace_s)
        verdict = Watch(source, options).run()
        if source.outages:
            verdict.notes.append(f"survived {len(source.outages)} loss(es) of contact: {source.outages} s")
        return verdict


def watch_group_on_hosts(
    ranks: list[tuple[int, str, HostConnection]], container: str, api_port: int, options: WatchOptions,
    grace_s: float = RECONNECT_GRACE_S,
) -> Verdict:  # fmt: skip
    """Watch CONTAINER on every rank's host (rank, host name, connection) as one engine: readiness
    through a forward to rank 0's API_PORT, liveness and logs of every rank (specdeploy.watch.group)."""
    with ExitStack() as stack:
        members, outages = [], []
        for rank, host, conn in sorted(ranks, key=lambda r: r[0]):
            forward = None
            if rank == 0:
                forward = conn.forward(api_port)
                forward.start()
                stack.callback(forward.stop)
                options = replace(options, url=f"http://127.0.0.1:{forward.local}")
            source = ReconnectingContainerSource(conn.reconnect_docker, container, forward, grace_s)
            outages.append((host, source))
            members.append(GroupRank(rank, host, source))
        verdict = watch_group(members, options)
        lost = [f"{host}: {len(s.outages)} ({s.outages} s)" for host, s in outages if s.outages]
        if lost:
            verdict.notes.append(f"survived loss(es) of contact: {', '.join(lost)}")
        return verdict
