"""The runtime sentinel: after READY, it takes a sick engine out of the fleet's router and puts it
back once it serves again.

It runs on the router's host (systemd unit `specdeploy-sentinel`, roles/router), because the
router's add/remove_worker API needs no key and so stays on that host's loopback (see
specdeploy.fleet.router); from there it sees each engine as the router's clients do. Per worker,
in its own thread:
- every second, `/health`: a refused or reset connection (the container is gone or restarting) or
  a 5xx (the API server reports its engine dead) takes the worker out at once;
- every `interval`, a real one-token completion: `failures` in a row that fail or get no answer
  within `completion_timeout` (a frozen engine core behind an API process whose `/health` still
  says 200) take it out;
- a registered worker that is not a member rejoins once a completion answers (its READY proof):
  after the sentinel took it out, and after the router lost it (a restarted router forgets every
  worker added through its API, so without this a router crash would empty the fleet until the
  next deploy).
Docker's restart policy (`unless-stopped`, set after the rollout's READY) brings a dead engine back;
the sentinel only steers the router. A rollout holds its host first (`POST /hold?worker=URL` on this
host's loopback, `control_port`) and releases it after its own join: a held worker is never added,
so the sentinel cannot put back an engine that is draining, loading, or refused by the rollout.
Holds are kept in the state file, so they outlive a restart of the sentinel; a rollout that died
midway leaves its host held (out of the router) until the next deploy joins it.

Workers register as files in the workers folder (one JSON per host: url, model, api_key; written by
the serving role, mode 0600), re-read every few seconds. Every transition is printed (the journal)
and kept, with the current state, in the state file. Standard library only: it runs from the
router's venv with the specdeploy wheel installed without dependencies.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from specdeploy import names
from specdeploy.fleet.router_api import SENTINEL_PORT, members_url, membership_url
from specdeploy.names import DP_RANK_HEADER

# Where roles/sentinel installs it and roles/serving registers each engine (one rule, two roles).
PATHS = {"workers": "/etc/specdeploy-sentinel/workers.d", "state": "/var/lib/specdeploy-sentinel/state.json"}
HEALTH_TIMEOUT_S = 2.0
ROUTER_TIMEOUT_S = 30.0  # add_worker waits for /health; a worker that just answered one does at once
KEEP_TRANSITIONS = 200


@dataclass(frozen=True)
class Settings:
    router_port: int = names.ROUTER_PORT
    interval_s: float = 15.0
    failures: int = 3
    completion_timeout_s: float = 10.0
    health_every_s: float = 1.0
    control_port: int = SENTINEL_PORT


@dataclass(frozen=True)
class Worker:
    url: str
    model: str
    api_key: str = field(default="", repr=False)
    # A multi-node engine (specdeploy.serve.group) is one worker, rank 0's URL: its hosts by rank, and
    # whether each is a data-parallel replica (then each is sent a completion of its own: a rank that
    # died leaves only the requests sent to it hanging, and rank 0 never notices).
    ranks: tuple[str, ...] = ()
    data_parallel: bool = False


@dataclass(frozen=True)
class Probe:
    """ok: a completion answered; alive: /health 200 (not trusted as proof); quiet: /health gave no
    answer in time (no verdict: completions decide); down: the connection was refused or cut; dead:
    the API says its engine is dead; failed: a completion got an error; stalled: a completion got
    no answer in time while the port accepts."""

    kind: str
    detail: str = ""


@dataclass(frozen=True)
class WorkerState:
    member: bool = False
    out_by_sentinel: bool = False
    held: bool = False  # a rollout owns its membership now
    failures: int = 0
    last: str = ""
    since: float = 0.0


@dataclass(frozen=True)
class Decision:
    state: WorkerState
    action: str | None = None  # "remove" or "add"
    reason: str = ""


def judge(state: WorkerState, probe: Probe, failures_out: int, now: float) -> Decision:
    """The one rule: what a probe means for a worker's place in the router."""
    last = f"{probe.kind}: {probe.detail}" if probe.detail else probe.kind
    if probe.kind in ("alive", "quiet"):
        return Decision(state)
    if probe.kind == "ok":
        fresh = replace(state, failures=0, last=last)
        if state.member or state.held:
            return Decision(fresh)
        why = "serves again" if state.out_by_sentinel else "serves, and the router had lost it (restarted?)"
        return Decision(replace(fresh, since=now), "add", f"{why} ({probe.detail})")
    if probe.kind in ("down", "dead"):
        failures, reason = failures_out, f"engine down: {probe.detail}"
    else:
        failures = state.failures + 1
        reason = f"{failures} failed completions in a row (last: {probe.kind}, {probe.detail})"
    worse = replace(state, failures=failures, last=last)
    if state.member and failures >= failures_out:
        return Decision(replace(worse, since=now), "remove", reason)
    return Decision(worse)


def _request(req: urllib.request.Request, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1024).decode(errors="replace")


def _connection_problem(exc: BaseException) -> str | None:
    """A refused/reset/cut connection, named; None for a timeout (no answer is not a refusal)."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError | socket.timeout):
        return None
    if isinstance(reason, ConnectionError | http.client.HTTPException | OSError):
        return f"{type(reason).__name__}: {reason}"
    return None


def probe_health(worker: Worker) -> Probe:
    req = urllib.request.Request(f"{worker.url}/health")
    try:
        status, body = _request(req, HEALTH_TIMEOUT_S)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        problem = _connection_problem(exc)
        return Probe("down", f"/health: {problem}") if problem else Probe("quiet", "/health: no answer in time")
    if status >= 500:
        return Probe("dead", f"/health answered {status}: {body.strip()[:200]}")
    return Probe("alive", f"/health {status}")


def probe_completion(worker: Worker, timeout_s: float) -> Probe:
    """A real one-token completion, the only proof that the engine serves: one to each data-parallel
    rank of a multi-node engine, the first that fails named with its host."""
    if len(worker.ranks) < 2 or not worker.data_parallel:  # (a model-parallel group: see of_group)
        return _completion(worker, timeout_s)
    for rank, host in enumerate(worker.ranks):
        probe = _completion(worker, timeout_s, rank)
        if probe.kind != "ok":
            return replace(probe, detail=f"data-parallel rank {rank} on {host}: {probe.detail}")
    return Probe("ok", f"every rank answered a completion ({', '.join(worker.ranks)})")


def of_group(worker: Worker, probe: Probe) -> Probe:
    """A sick model-parallel group's probe names its hosts: every forward needs every rank, and the one
    that died may be any of them (rank 0's API is all the sentinel sees)."""
    if len(worker.ranks) < 2 or worker.data_parallel or probe.kind in ("ok", "alive", "quiet"):
        return probe
    return replace(probe, detail=f"{probe.detail} (one engine over {', '.join(worker.ranks)})")


def _completion(worker: Worker, timeout_s: float, rank: int | None = None) -> Probe:
    payload = {"model": worker.model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    headers = {"Content-Type": "application/json"}
    if worker.api_key:
        headers["Authorization"] = f"Bearer {worker.api_key}"
    if rank is not None:
        headers[DP_RANK_HEADER] = str(rank)
    req = urllib.request.Request(f"{worker.url}/v1/completions", json.dumps(payload).encode(), headers)
    start = time.monotonic()
    try:
        status, body = _request(req, timeout_s)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        problem = _connection_problem(exc)
        if problem:
            return Probe("down", f"completion: {problem}")
        return Probe("stalled", f"no answer to a one-token completion in {timeout_s:.0f} s")
    took = time.monotonic() - start
    if status != 200:
        return Probe("failed", f"completion answered {status}: {body.strip()[:200]}")
    try:
        choices = json.loads(body).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return Probe("failed", f"completion answered 200 without choices: {body.strip()[:200]}")
    return Probe("ok", f"a completion answered in {took:.1f} s")


class Router:
    """The router's worker API on this host's loopback."""

    def __init__(self, port: int) -> None:
        self.port = port

    def members(self) -> set[str]:
        status, body = _request(urllib.request.Request(members_url(self.port)), ROUTER_TIMEOUT_S)
        if status != 200:
            raise OSError(f"list_workers answered {status}")
        return {str(u) for u in json.loads(body).get("urls", [])}

    def change(self, action: str, worker: str) -> None:
        req = urllib.request.Request(membership_url(action, worker, self.port), b"", method="POST")
        status, body = _request(req, ROUTER_TIMEOUT_S)
        if status != 200:
            raise OSError(f"{action}_worker answered {status}: {body.strip()[:200]}")


def read_workers(folder: Path) -> dict[str, Worker]:
    """The registered workers, by file name; an unreadable file is reported and skipped."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            out[path.stem] = Worker(
                str(data["url"]).rstrip("/"),
                str(data["model"]),
                str(data.get("api_key", "")),
                tuple(str(h) for h in data.get("ranks") or ()),
                bool(data.get("data_parallel")),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"sentinel: skipping {path.name}: {exc}", file=sys.stderr, flush=True)
    return out


class Sentinel:
    def __init__(self, settings: Settings, router: Router, state_path: Path | None, *,
                 say: Callable[[str], None] = lambda line: print(line, flush=True),
                 health: Callable[[Worker], Probe] = probe_health,
                 completion: Callable[[Worker, float], Probe] = probe_completion) -> None:  # fmt: skip
        self.settings, self.router, self.state_path, self.say = settings, router, state_path, say
        self.health, self.completion = health, completion
        self.lock = threading.Lock()
        self.states: dict[str, WorkerState] = {}
        self.transitions: list[dict[str, Any]] = []
        self.holds: set[str] = set()
        self.registered: dict[str, Worker] = {}  # by file name, re-read by run()
        self._load()

    def step(self, worker: Worker, probe: Probe, now: float | None = None) -> Decision:
        """Judge one probe against the router's current membership, and act on it."""
        now = time.time() if now is None else now
        probe = of_group(worker, probe)
        with self.lock:
            try:
                member = worker.url in self.router.members()
            except (OSError, ValueError) as exc:
                self.say(f"sentinel: the router on 127.0.0.1:{self.router.port} did not answer ({exc}); no change")
                return Decision(self.states.get(worker.url, WorkerState()))
            state = self.states.get(worker.url, WorkerState(since=now))
            if member and state.out_by_sentinel:  # someone (a rollout) added it back
                state = replace(state, out_by_sentinel=False)
            state = replace(state, member=member, held=worker.url in self.holds)
            decision = judge(state, probe, self.settings.failures, now)
            new = decision.state
            if decision.action:
                try:
                    self.router.change(decision.action, worker.url)
                except (OSError, ValueError) as exc:
                    self.say(f"sentinel: {decision.action} {worker.url} failed ({exc}); retried on the next probe")
                    return Decision(state)
                new = replace(new, member=decision.action == "add", out_by_sentinel=decision.action == "remove")
                verb = "OUT" if decision.action == "remove" else "BACK"
                self.say(f"sentinel: {verb} {worker.url}: {decision.reason}")
                self.transitions.append({"time": now, "worker": worker.url, "to": verb.lower(),
                                         "reason": decision.reason})  # fmt: skip
                del self.transitions[:-KEEP_TRANSITIONS]
            changed = new != self.states.get(worker.url) or decision.action is not None
            self.states[worker.url] = new
            if changed:  # not on every probe: a steady engine writes nothing
                self._save()
            return replace(decision, state=new)

    def worker(self, name: str) -> Worker | None:
        """NAME's registration as last read (run() replaces the dict: re-read on every call)."""
        return self.registered.get(name)

    def hold(self, worker: str, held: bool) -> None:
        """A rollout takes WORKER's membership (held) or gives it back."""
        with self.lock:
            if (worker in self.holds) == held:
                return
            (self.holds.add if held else self.holds.discard)(worker)
            if worker in self.states:
                self.states[worker] = replace(self.states[worker], held=held, out_by_sentinel=False)
            self.say(f"sentinel: {'HELD' if held else 'RELEASED'} {worker} "
                     f"({'a rollout owns it' if held else 'watched again'})")  # fmt: skip
            self._save()

    def _load(self) -> None:
        """Holds and transitions from the last run (a hold outlives a restart of the sentinel)."""
        if self.state_path is None or not self.state_path.is_file():
            return
        try:
            doc = json.loads(self.state_path.read_text())
            self.holds = {str(w) for w in doc.get("holds", [])}
            self.transitions = list(doc.get("transitions", []))[-KEEP_TRANSITIONS:]
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            self.say(f"sentinel: ignoring the unreadable state file {self.state_path} ({exc})")

    def _save(self) -> None:
        if self.state_path is None:
            return
        doc = {"workers": {url: asdict(s) for url, s in self.states.items()}, "holds": sorted(self.holds),
               "transitions": self.transitions}  # fmt: skip
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)

    def watch(self, current: Callable[[], Worker | None], stop: threading.Event) -> None:
        """One worker's loop, until STOP or until CURRENT says it is no longer registered."""
        next_completion = 0.0
        while not stop.is_set():
            worker = current()
            if worker is None:
                return
            now = time.monotonic()
            if now >= next_completion:
                next_completion = now + self.settings.interval_s
                probe = self.completion(worker, self.settings.completion_timeout_s)
            else:
                probe = self.health(worker)
                state = self.states.get(worker.url, WorkerState())
                if probe.kind == "alive" and not state.member and not state.held:
                    next_completion = now  # out, not held, and answering: prove it with a completion now
            self.step(worker, probe)
            stop.wait(self.settings.health_every_s)

    def run(self, folder: Path, stop: threading.Event, rescan_s: float = 3.0) -> None:
        threads: dict[str, threading.Thread] = {}
        every = f"a completion every {self.settings.interval_s:.0f} s, out after {self.settings.failures} failures"
        self.say(f"sentinel: watching the workers registered under {folder} (router 127.0.0.1:{self.router.port}, "
                 f"{every})")  # fmt: skip
        while not stop.is_set():
            self.registered = read_workers(folder) if folder.is_dir() else {}
            for name, worker in self.registered.items():
                if name not in threads or not threads[name].is_alive():
                    current = functools.partial(self.worker, name)
                    threads[name] = threading.Thread(target=self.watch, args=(current, stop), name=f"sentinel-{name}",
                                                     daemon=True)  # fmt: skip
                    threads[name].start()
                    self.say(f"sentinel: watching {name} ({worker.url}, model {worker.model})")
            stop.wait(rescan_s)


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP handler that answers JSON (the hold API; the tests' fake engines and router)."""

    def log_message(self, *args: object) -> None:
        pass  # the journal gets transitions, not one line per request

    def _reply(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def control_server(sentinel: Sentinel, port: int) -> ThreadingHTTPServer:
    """The hold API on loopback: POST /hold or /release ?worker=URL, GET /state (no keys in it)."""

    class Control(JsonHandler):
        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            workers = parse_qs(parts.query).get("worker", [])
            if parts.path not in ("/hold", "/release") or len(workers) != 1:
                self._reply(400, {"error": "POST /hold?worker=URL or /release?worker=URL"})
                return
            sentinel.hold(workers[0].rstrip("/"), parts.path == "/hold")
            self._reply(200, {"held": sorted(sentinel.holds)})

        def do_GET(self) -> None:
            if urlsplit(self.path).path != "/state":
                self._reply(404, {"error": "GET /state"})
                return
            with sentinel.lock:
                doc = {"workers": {u: asdict(s) for u, s in sentinel.states.items()}, "held": sorted(sentinel.holds)}
            self._reply(200, doc)

    server = ThreadingHTTPServer(("127.0.0.1", port), Control)
    server.daemon_threads = True
    return server


def command(python: str, settings: dict[str, Any]) -> list[str]:
    """The unit's ExecStart, from the sentinel role's variables (no secret: keys are in the files)."""
    parsed = Settings(int(settings["router_port"]), float(settings["interval"]), int(settings["failures"]),
                      float(settings["completion_timeout"]),
                      control_port=int(settings.get("control_port", SENTINEL_PORT)))  # fmt: skip
    return [python, "-m", "specdeploy.fleet.sentinel", "--workers-dir", PATHS["workers"], "--state", PATHS["state"],
            "--router-port", str(parsed.router_port), "--interval", f"{parsed.interval_s:g}",
            "--failures", str(parsed.failures), "--completion-timeout", f"{parsed.completion_timeout_s:g}",
            "--control-port", str(parsed.control_port)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.fleet.sentinel", description=__doc__.split("\n")[0])
    parser.add_argument("--workers-dir", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--router-port", type=int, default=Settings.router_port)
    parser.add_argument("--interval", type=float, default=Settings.interval_s)
    parser.add_argument("--failures", type=int, default=Settings.failures)
    parser.add_argument("--completion-timeout", type=float, default=Settings.completion_timeout_s)
    parser.add_argument("--control-port", type=int, default=SENTINEL_PORT)
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.failures < 1 or args.completion_timeout <= 0:
        parser.error("--interval and --completion-timeout must be > 0, --failures ≥ 1")
    settings = Settings(args.router_port, args.interval, args.failures, args.completion_timeout,
                        control_port=args.control_port)  # fmt: skip
    stop = threading.Event()
    sentinel = Sentinel(settings, Router(args.router_port), args.state)
    # Bound first: a rollout that cannot hold its host refuses to start, rather than race the sentinel.
    control = control_server(sentinel, settings.control_port)
    threading.Thread(target=control.serve_forever, name="sentinel-control", daemon=True).start()
    try:
        sentinel.run(args.workers_dir, stop)
    except KeyboardInterrupt:
        stop.set()
    finally:
        control.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
