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
