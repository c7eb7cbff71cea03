from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.fleet.membership import RouterMembership
from specdeploy.fleet.sentinel import JsonHandler

WORKER = "http://172.17.0.3:8000"


class RouterHost(JsonHandler):
    """The router's worker API and the sentinel's hold API, as the router host serves them."""

    def do_GET(self) -> None:
        self._reply(200, {"urls": sorted(self.server.members)})  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        self.server.calls.append((parts.path, (query.get("url") or query.get("worker"))[0]))  # type: ignore[attr-defined]
        if parts.path == "/add_worker":
            self.server.members.add(query["url"][0])  # type: ignore[attr-defined]
        elif parts.path == "/remove_worker":
            self.server.members.discard(query["url"][0])  # type: ignore[attr-defined]
        self._reply(200, {})


class Forward:
    def __init__(self, local: int) -> None:
        self.local = local

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class FakeConnection:
    """A HostConnection whose SSH forwards lead to local servers, by remote port."""

    def __init__(self, ports: dict[int, int]) -> None:
        self.ports, self.forwarded = ports, []

    def forward(self, remote_port: int) -> Forward:
        self.forwarded.append(remote_port)
        return Forward(self.ports.get(remote_port, 1))  # port 1: refused

    def __str__(self) -> str:
        return "router-host"


@pytest.fixture
def router_host() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), RouterHost)
    server.members, server.calls = set(), []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_rollout_holds_leaves_joins_and_releases_through_the_two_apis(router_host):
    port = router_host.server_address[1]
    conn = FakeConnection({8080: port, 8081: port})
    said: list[str] = []
    fleet = RouterMembership(conn, 8080, WORKER, said.append, sentinel_port=8081)  # type: ignore[arg-type]
    fleet.hold()
    assert fleet.join() is True  # not a member yet: added, then released
    assert fleet.join() is False  # a converged run: no change, released again
    fleet.leave()
    paths = [path for path, _ in router_host.calls]
    assert paths == ["/hold", "/add_worker", "/release", "/release", "/remove_worker"]
    assert conn.forwarded[0] == 8081 and 8080 in conn.forwarded and router_host.members == set()
    assert "joined the router" in said[0] and "left the router" in said[-1]


def test_a_sentinel_that_does_not_answer_stops_the_rollout_before_it_begins(router_host):
    conn = FakeConnection({8080: router_host.server_address[1]})  # nothing on the sentinel's port
    fleet = RouterMembership(conn, 8080, WORKER, lambda line: None, sentinel_port=8081)  # type: ignore[arg-type]
    with pytest.raises(SpecdeployError, match="the sentinel on router-host did not answer") as refused:
        fleet.hold()
    assert "systemctl status specdeploy-sentinel" in refused.value.hint
    assert router_host.calls == []


class RestartingRouter(FakeConnection):
    """The router's port refuses for its first DOWN forwards (a crashed router, back under systemd)."""

    def __init__(self, ports: dict[int, int], down: int) -> None:
        super().__init__(ports)
        self.down = down

    def forward(self, remote_port: int) -> Forward:
        if remote_port == 8080 and self.down > 0:
            self.down -= 1
            self.forwarded.append(remote_port)
            return Forward(1)
        return super().forward(remote_port)


def test_a_router_that_restarts_under_a_rollout_is_waited_for(router_host):
    port = router_host.server_address[1]
    said: list[str] = []
    fleet = RouterMembership(RestartingRouter({8080: port, 8081: port}, down=2), 8080, WORKER, said.append,  # type: ignore[arg-type]
                             sentinel_port=8081, patience_s=30)  # fmt: skip
    assert fleet.join() is True
    assert [p for p, _ in router_host.calls] == ["/add_worker", "/release"]
    assert said[0].startswith("the router on router-host did not answer (ConnectError); waiting for it (up to 30 s")


@pytest.mark.parametrize("step", ["leave", "join"])
def test_a_router_that_stays_down_gives_the_host_back_to_the_sentinel(router_host, step):
    """The rollout stops with a sentence, and the host is released: the sentinel adds the proven engine back
    once the router answers (never left out, held, by a rollout that could not reach the router)."""
    port = router_host.server_address[1]
    fleet = RouterMembership(FakeConnection({8081: port}), 8080, WORKER, lambda line: None,  # type: ignore[arg-type]
                             sentinel_port=8081, patience_s=1.5)  # fmt: skip
    fleet.hold()
    with pytest.raises(SpecdeployError, match=r"the router on router-host did not answer for 2 s"):
        getattr(fleet, step)()
    assert [p for p, _ in router_host.calls] == ["/hold", "/release"]
