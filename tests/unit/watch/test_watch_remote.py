"""The remote watch survives its transport (specdeploy.watch.remote.ReconnectingContainerSource)."""

from __future__ import annotations

import time

import requests
from docker.errors import APIError, NotFound

from specdeploy.transport import is_transport_error
from specdeploy.watch import remote
from specdeploy.watch.remote import ReconnectingContainerSource
from specdeploy.watch.watchdog import Watch, WatchOptions

DROP = requests.exceptions.ConnectionError("('Connection aborted.', OSError('Socket is closed'))")


class Engine:
    """One engine container's log and state, shared by every connection made to it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.running = True
        self.down = False  # the transport: every call through any connection fails while down


class Container:
    name = "specdeploy-engine"

    def __init__(self, engine: Engine) -> None:
        self.engine, self.attrs = engine, {}

    def _check(self) -> None:
        if self.engine.down:
            raise DROP

    def reload(self) -> None:
        self._check()
        running = self.engine.running
        state = {"Running": running, "ExitCode": 0 if running else 1, "Status": "running" if running else "exited"}
        self.attrs = {"State": state, "RestartCount": 0}

    def logs(self, since=None, **_):
        self._check()
        stamped = [f"2026-12-01T10:00:{i:02d}.000000000Z {line}" for i, line in enumerate(self.engine.lines)]
        if since is not None:
            stamped = [s for i, s in enumerate(stamped) if i >= since.second]
        return ("\n".join(stamped) + "\n").encode() if stamped else b""

    def exec_run(self, *_args, **_kw):
        self._check()
        return 127, b"executable file not found"


class Client:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.containers = self

    def get(self, name: str) -> Container:
        if self.engine.down:
            raise DROP
        return Container(self.engine)


def test_a_drop_shorter_than_the_grace_changes_nothing_and_the_log_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", (0.05,))
    engine = Engine()
    engine.lines = ["(APIServer pid=1) INFO 01-01 00:00:00 [a.py:1] vLLM API server version 0.9.0"]
    source = ReconnectingContainerSource(lambda: Client(engine), "specdeploy-engine", grace_s=5)
    assert source.read_new() == engine.lines
    engine.down = True
    assert source.liveness().unreachable
    engine.down = False
    engine.lines.append("RuntimeError: CUDA error: out of memory")
    engine.running = False
    time.sleep(0.1)  # the next reconnect attempt is due
    life = source.liveness()
    assert not life.alive and source.outages and source.lost_since is None
    assert source.read_new() == ["RuntimeError: CUDA error: out of memory"]  # not the first line again


def test_time_without_contact_is_not_a_stall_and_a_long_outage_is_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", (0.05,))
    engine = Engine()
    source = ReconnectingContainerSource(lambda: Client(engine), "specdeploy-engine", grace_s=1.0)
    engine.down = True
    options = WatchOptions(url=None, interval_s=0.05, stall_timeout_s=0.5, diagnostics=tmp_path, progress=False)
    verdict = Watch(source, options).run()
    assert verdict.status == "LOST", verdict.first_line()  # not STALLED after 0.5 s, not FAILED
    assert "Socket is closed" in verdict.headline and "state is unknown" in verdict.headline


def test_transport_errors_are_told_from_the_engines():
    assert is_transport_error(DROP)
    assert not is_transport_error(NotFound("No such container: x"))
    assert not is_transport_error(server_error("OCI runtime create failed: setrlimit: operation not permitted"))
    assert is_transport_error(server_error("connection reset while dockerd is shutting down"))


def server_error(explanation: str) -> APIError:
    response = requests.Response()
    response.status_code, response.url, response.reason = 500, "http+docker://ssh/containers/x/start", "Error"
    return APIError("500 Server Error", response=response, explanation=explanation)
