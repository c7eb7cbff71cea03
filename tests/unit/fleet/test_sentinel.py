from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from specdeploy.fleet.engine_probes import (
    Probe,
    Progress,
    Worker,
    of_group,
    probe_completion,
    probe_health,
    probe_metrics,
    read_progress,
)
from specdeploy.fleet.router_api import hold_url
from specdeploy.fleet.sentinel import (
    PATHS,
    JsonHandler,
    Pace,
    Sentinel,
    Settings,
    WorkerState,
    command,
    control_server,
    judge,
    main,
    read_workers,
)
from specdeploy.names import DP_RANK_HEADER


class FakeEngine(JsonHandler):
    """An OpenAI-shaped HTTP server whose behaviour the test switches (mode on the server)."""

    def do_GET(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        self._reply(503 if mode == "dead" else 200, {})

    def do_POST(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        self.server.ranks.append(self.headers.get(DP_RANK_HEADER))  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "frozen" or mode == f"rank {self.headers.get(DP_RANK_HEADER)} frozen":
            time.sleep(1.5)
            return
        if mode in ("error", "dead"):
            self._reply(500, {"error": "EngineCore encountered an issue"})
            return
        self._reply(200, {"choices": [{"text": "!"}]})


@pytest.fixture
def engine() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeEngine)
    server.mode, server.seen, server.ranks = "ok", [], []  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeRouter:
    def __init__(self, members: set[str]) -> None:
        self.port, self.urls, self.calls = 8080, set(members), []

    def members(self) -> set[str]:
        return set(self.urls)

    def change(self, action: str, worker: str) -> None:
        self.calls.append((action, worker))
        (self.urls.add if action == "add" else self.urls.discard)(worker)


def test_a_death_takes_a_member_out_at_once_and_a_completion_brings_it_back():
    member = WorkerState(member=True)
    out = judge(member, Probe("down", "refused"), 3, now=10.0)
    assert out.action == "remove" and "engine down: refused" in out.reason and out.state.since == 10.0
    gone = WorkerState(member=False, out_by_sentinel=True, failures=3)
    assert judge(gone, Probe("down", "refused"), 3, 11.0).action is None  # already out: no flapping
    back = judge(gone, Probe("ok", "a completion answered in 0.1 s"), 3, 12.0)
    assert back.action == "add" and back.state.failures == 0 and "serves again" in back.reason


def test_failed_completions_count_and_health_200_proves_nothing():
    state = WorkerState(member=True)
    for _ in range(2):
        state = judge(state, Probe("stalled", "no answer"), 3, 1.0).state
        state = judge(state, Probe("alive", "/health 200"), 3, 1.0).state  # does not reset the count
    assert state.failures == 2
    third = judge(state, Probe("failed", "answered 500"), 3, 2.0)
    assert third.action == "remove" and "3 failed completions in a row (last: failed, answered 500)" in third.reason
    assert judge(state, Probe("ok"), 3, 2.0).state.failures == 0


def test_a_held_worker_is_left_to_its_rollout_and_one_the_router_lost_is_added_back():
    # Held: a rollout owns it (it leaves before the stop, joins after READY and releases it).
    held = WorkerState(member=False, held=True)
    assert judge(held, Probe("ok"), 3, 1.0).action is None
    assert judge(held, Probe("down", "refused"), 3, 1.0).action is None
    # Not held, serving, yet not a member: the router forgot it (a restart empties its worker list).
    lost = judge(WorkerState(member=False), Probe("ok", "a completion answered in 0.1 s"), 3, 1.0)
    assert lost.action == "add" and "the router had lost it" in lost.reason
    assert judge(WorkerState(member=False), Probe("alive", "/health 200"), 3, 1.0).action is None  # no proof


def test_probes_against_a_real_http_server(engine):
    worker = Worker(url(engine), "m", api_key="k-secret")
    assert probe_completion(worker, 5).kind == "ok" and engine.seen == ["Bearer k-secret"]
    assert probe_health(worker).kind == "alive"
    engine.mode = "error"
    failed = probe_completion(worker, 5)
    assert failed.kind == "failed" and "500" in failed.detail and "EngineCore" in failed.detail
    engine.mode = "frozen"
    assert probe_completion(worker, 0.5).kind == "stalled"
    engine.mode = "dead"
    assert probe_health(worker).kind == "dead"
    refused = Worker(f"http://127.0.0.1:{closed_port()}", "m")
    assert probe_health(refused).kind == "down" and probe_completion(refused, 1).kind == "down"
    assert "k-secret" not in repr(worker)


def test_a_data_parallel_group_is_one_worker_whose_every_rank_must_answer(engine, tmp_path):
    group = Worker(url(engine), "m", ranks=("tb-1", "tb-2"), data_parallel=True)
    ok = probe_completion(group, 5)
    assert ok.kind == "ok" and engine.ranks == ["0", "1"] and "tb-1, tb-2" in ok.detail
    engine.mode = "rank 1 frozen"  # a dead replica: rank 0 never notices, the requests sent to it hang
    hung = probe_completion(group, 0.5)
    assert hung.kind == "stalled" and hung.detail.startswith("data-parallel rank 1 on tb-2: no answer")
    (tmp_path / "g.json").write_text(json.dumps({"url": url(engine), "model": "m", "ranks": ["tb-1", "tb-2"],
                                                 "data_parallel": True}))  # fmt: skip
    assert read_workers(tmp_path)["g"] == group
    tensor_parallel = Worker(url(engine), "m", ranks=("tb-1", "tb-2"))
    assert of_group(tensor_parallel, Probe("down", "/health: refused")).detail == (
        "/health: refused (one engine over tb-1, tb-2)")  # fmt: skip
    assert of_group(tensor_parallel, Probe("ok", "fine")).detail == "fine" and of_group(group, hung) == hung


def test_the_sentinel_keeps_state_and_transitions_and_rejoins_when_someone_else_did_not(tmp_path):
    router = FakeRouter({"http://w1:8000"})
    lines: list[str] = []
    sentinel = Sentinel(Settings(failures=2), router, tmp_path / "state.json", say=lines.append)  # type: ignore[arg-type]
    worker = Worker("http://w1:8000", "m")
    sentinel.step(worker, Probe("stalled", "no answer"), now=1.0)
    assert router.calls == []
    sentinel.step(worker, Probe("stalled", "no answer"), now=2.0)
    assert router.calls == [("remove", "http://w1:8000")] and lines[-1].startswith("sentinel: OUT http://w1:8000: 2 ")
    sentinel.step(worker, Probe("ok", "a completion answered in 0.2 s"), now=3.0)
    assert router.calls[-1] == ("add", "http://w1:8000") and "BACK" in lines[-1]
    doc = json.loads((tmp_path / "state.json").read_text())
    assert [t["to"] for t in doc["transitions"]] == ["out", "back"]
    assert doc["workers"]["http://w1:8000"]["member"] is True
    # A rollout holds it, takes it out and back by itself: the sentinel does not interfere.
    sentinel.hold("http://w1:8000", True)
    router.urls.clear()
    sentinel.step(worker, Probe("down", "refused"), now=4.0)
    sentinel.step(worker, Probe("ok", "a completion answered in 0.2 s"), now=5.0)  # READY, not joined yet
    assert len(router.calls) == 2 and "HELD http://w1:8000" in lines[-1]
    # The hold outlives a restart of the sentinel (it is in the state file).
    again = Sentinel(Settings(failures=2), router, tmp_path / "state.json", say=lines.append)  # type: ignore[arg-type]
    assert again.holds == {"http://w1:8000"} and [t["to"] for t in again.transitions] == ["out", "back"]
    again.hold("http://w1:8000", False)
    again.step(worker, Probe("ok", "a completion answered in 0.2 s"), now=6.0)
    assert router.calls[-1] == ("add", "http://w1:8000") and len(router.calls) == 3
    assert json.loads((tmp_path / "state.json").read_text())["holds"] == []


def test_the_hold_api_on_loopback(tmp_path):
    sentinel = Sentinel(Settings(), FakeRouter(set()), tmp_path / "state.json", say=lambda line: None)  # type: ignore[arg-type]
    sentinel.registered = {"h1": Worker("http://w1:8000", "m", api_key="k-secret")}
    sentinel.step(sentinel.registered["h1"], Probe("down", "refused"), now=1.0)
    server = control_server(sentinel, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        post = urllib.request.Request(hold_url("hold", "http://w1:8000", port), b"", method="POST")
        with urllib.request.urlopen(post, timeout=5) as resp:
            assert json.loads(resp.read())["held"] == ["http://w1:8000"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=5) as resp:
            state = resp.read().decode()
        assert json.loads(state)["workers"]["http://w1:8000"]["held"] is True and "k-secret" not in state
        release = urllib.request.Request(hold_url("release", "http://w1:8000", port), b"", method="POST")
        with urllib.request.urlopen(release, timeout=5) as resp:
            assert json.loads(resp.read())["held"] == []
        bad = urllib.request.Request(f"http://127.0.0.1:{port}/hold", b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=5)
        assert refused.value.code == 400
    finally:
        server.shutdown()
        server.server_close()


def test_the_sentinel_loop_against_a_real_engine_server(engine, tmp_path):
    """Registered by file; frozen: out after its failed completions; answering again: back."""
    (tmp_path / "workers").mkdir()
    worker_url = url(engine)
    (tmp_path / "workers" / "host-1.json").write_text(json.dumps({"url": worker_url, "model": "m", "api_key": "k"}))
    assert read_workers(tmp_path / "workers")["host-1"].url == worker_url
    router = FakeRouter({worker_url})
    lines: list[str] = []
    settings = Settings(interval_s=0.3, failures=2, completion_timeout_s=0.4, health_every_s=0.1)
    sentinel = Sentinel(settings, router, tmp_path / "state.json", say=lines.append)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=sentinel.run, args=(tmp_path / "workers", stop, 0.1), daemon=True)
    thread.start()
    try:
        engine.mode = "frozen"
        deadline = time.monotonic() + 10
        while ("remove", worker_url) not in router.calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("remove", worker_url) in router.calls, lines
        engine.mode = "ok"
        while router.calls[-1] != ("add", worker_url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert router.calls[-1] == ("add", worker_url), lines
        # The router restarts and forgets its workers: the sentinel adds this one back.
        router.urls.clear()
        deadline = time.monotonic() + 10
        while worker_url not in router.urls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker_url in router.urls and "the router had lost it" in lines[-1], lines
    finally:
        stop.set()
        thread.join(5)
    assert any("OUT" in line and "stalled" in line for line in lines)


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--workers-dir", str(tmp_path), "--state", str(tmp_path / "s"), "--failures", "0"])
    assert "--failures" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert read_workers(tmp_path) == {}


def test_the_unit_command_carries_the_settings_and_no_secret():
    cmd = command(
        "/opt/s/bin/python", {"router_port": "8080", "interval": "15", "failures": 3, "completion_timeout": 10}
    )
    assert cmd[:3] == ["/opt/s/bin/python", "-m", "specdeploy.fleet.sentinel"]
    assert cmd[cmd.index("--interval") + 1] == "15" and cmd[cmd.index("--workers-dir") + 1] == PATHS["workers"]
    assert cmd[cmd.index("--control-port") + 1] == "8081"
    assert not any("key" in part for part in cmd)
    with pytest.raises(ValueError):
        command("/p", {"router_port": "x", "interval": 1, "failures": 1, "completion_timeout": 1})


# ---------------------------------------------------------------- the engine's own progress (issue 35)


class Script:
    """A worker's engine over simulated seconds: its /metrics counters and what a completion meets."""

    def __init__(self) -> None:
        self.now, self.tokens, self.in_flight, self.frozen, self.completions = 0.0, 0.0, 0.0, False, 0

    def clock(self) -> float:
        return self.now

    def metrics(self, worker: Worker) -> Progress:
        return Progress(self.tokens, self.in_flight)

    def completion(self, worker: Worker, timeout_s: float) -> Probe:
        self.completions += 1
        if self.frozen:
            self.now += timeout_s  # the probe waits its whole bound
            return Probe("stalled", f"no answer to a one-token completion in {timeout_s:.0f} s")
        self.tokens += 1
        return Probe("ok", "a completion answered in 0.1 s")


class Ticks:
    """One sentinel watching one worker over simulated seconds (one look a second), its pace kept
    across the calls of `run`; a serving, busy engine adds tokens each second."""

    def __init__(self, script: Script) -> None:
        self.script, self.router = script, FakeRouter({"http://w"})
        self.said: list[str] = []
        self.sentinel = Sentinel(Settings(), self.router, None, say=self.said.append,  # type: ignore[arg-type]
                                 metrics=script.metrics, completion=script.completion, clock=script.clock)  # fmt: skip
        self.worker, self.pace = Worker("http://w", "m"), Pace(self.sentinel.settings, script.now)

    def run(self, until_s: float, *, serve: bool = True) -> tuple[list[tuple[str, str]], list[float]]:
        script, removed_at, seen = self.script, [], len(self.router.calls)
        while script.now < until_s:
            if script.in_flight and not script.frozen and serve:
                script.tokens += 40
            decision = self.sentinel.step(self.worker, self.sentinel.look(self.worker, self.pace), script.now)
            if decision.action == "remove":
                removed_at.append(script.now)
            script.now += self.sentinel.settings.health_every_s
        return self.router.calls[seen:], removed_at


def run_ticks(script: Script, until_s: float, *, serve: bool = True) -> tuple[list[tuple[str, str]], list[float]]:
    """A sentinel started afresh, watching SCRIPT's engine until UNTIL_S."""
    return Ticks(script).run(until_s, serve=serve)


def test_a_busy_engine_proves_itself_by_its_counters_and_is_never_probed_or_removed():
    script = Script()
    script.in_flight = 64  # saturated: a probe of ours would wait behind 64 requests
    calls, _ = run_ticks(script, 600)
    assert calls == [] and script.completions == 1  # only the first look, before anything moved


def test_a_frozen_engine_under_load_is_out_within_ten_seconds_at_the_defaults():
    script = Script()
    script.in_flight = 16
    ticks = Ticks(script)
    ticks.run(30)
    script.frozen, frozen_at, probes = True, script.now, script.completions  # the gauges keep their last values
    calls, removed_at = ticks.run(60)
    assert calls == [("remove", "http://w")] and removed_at[0] - frozen_at <= 10, removed_at
    # judged by its requests' missing tokens, never by a probe of ours queued behind them (the fleet's
    # 2026-12-06 run took it out by a probe's timeout, 8 s after the freeze instead of 5)
    assert script.completions == probes and "16 request(s) in flight and no token" in ticks.said[-1], ticks.said


def test_a_frozen_idle_engine_is_out_within_ten_seconds_and_an_idle_one_that_answers_stays():
    script = Script()
    calls, _ = run_ticks(script, 120)
    assert calls == [] and script.completions >= 120 // Settings().interval_s - 1  # idle: proven by completions
    script.frozen, frozen_at = True, script.now
    calls, removed_at = run_ticks(script, 180)
    assert calls == [("remove", "http://w")] and removed_at[0] - frozen_at <= 10, removed_at


def test_a_request_that_reaches_a_long_idle_engine_is_not_a_freeze_until_it_waits_the_stall_bound():
    """The fleet's false removal (2026-12-06: `1 request(s) in flight and no token for 11 s`, an engine
    idle since the test before): the stall is counted from when requests came in flight, not from the
    engine's last traffic. A first request whose prefill takes 3 s is no freeze; one that waits the
    whole stall bound is."""
    script = Script()
    ticks = Ticks(script)
    assert ticks.run(60) == ([], [])  # idle: only our own completions moved its counters
    script.in_flight = 1
    assert ticks.run(63, serve=False) == ([], [])  # a CPU engine's prefill: no token for 3 s
    assert ticks.run(90) == ([], [])  # then it generates
    script.in_flight = 0
    assert ticks.run(120) == ([], [])
    script.in_flight, waiting_from = 1, script.now
    calls, removed_at = ticks.run(140, serve=False)  # a request that never gets a token
    assert calls == [("remove", "http://w")] and 5 <= removed_at[0] - waiting_from <= 10, removed_at


def test_a_slow_completion_while_tokens_move_is_a_failure_not_a_freeze():
    state = WorkerState(member=True)
    slow = judge(state, Probe("stalled", "no answer in 5 s"), 3, 1.0)
    assert slow.action is None and slow.state.failures == 1
    frozen = judge(state, Probe("frozen", "8 request(s) in flight and no token for 5 s"), 3, 1.0)
    assert frozen.action == "remove" and frozen.reason.startswith("engine frozen: 8 request(s)")
    assert judge(WorkerState(member=False), Probe("busy", "+40 tokens"), 3, 1.0).action is None  # a completion rejoins


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="tiny"} 120.0
vllm:prompt_tokens_created{engine="0",model_name="tiny"} 1.7e9
vllm:generation_tokens_total{engine="0",model_name="tiny"} 480.0
"""


def test_progress_is_read_from_the_engines_metrics_and_a_server_without_counters_falls_back(engine):
    assert read_progress(VLLM_METRICS) == Progress(600.0, 4.0)
    assert read_progress("# nothing\nprocess_cpu_seconds_total 3.0\n") is None
    assert probe_metrics(Worker(url(engine), "m")) == Probe("alive", "/health 200")  # 200 without counters
    engine.mode = "dead"
    assert probe_metrics(Worker(url(engine), "m")).kind == "dead"  # type: ignore[union-attr]
    assert probe_metrics(Worker(f"http://127.0.0.1:{closed_port()}", "m")).kind == "down"  # type: ignore[union-attr]


def test_the_roles_defaults_are_the_sentinels_own():
    """roles/sentinel's defaults are what Settings() says (the fleet tests measure at them)."""
    defaults = yaml.safe_load((Path(__file__).resolve().parents[3] / "roles/sentinel/defaults/main.yml").read_text())
    ours = Settings()
    assert (defaults["sentinel_interval"], defaults["sentinel_failures"], defaults["sentinel_completion_timeout"],
            defaults["sentinel_progress_stall"]) == (ours.interval_s, ours.failures, ours.completion_timeout_s,
                                                     ours.progress_stall_s)  # fmt: skip
