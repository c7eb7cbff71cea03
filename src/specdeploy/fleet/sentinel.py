"""The runtime sentinel: after READY, it takes a sick engine out of the fleet's router and puts it
back once it serves again.

It runs on the router's host (systemd unit `specdeploy-sentinel`, roles/router), because the
router's add/remove_worker API needs no key and so stays on that host's loopback (see
specdeploy.fleet.router); from there it sees each engine as the router's clients do. Per worker,
in its own thread:
- every second, the engine's own `/metrics`: a refused or reset connection (the container is gone or
  restarting) or a 5xx takes the worker out at once. Its progress counters (tokens generated and
  prefilled) moving are proof that it serves; requests in flight with no token for `progress_stall`
  seconds mean a frozen engine (a core stopped behind an API process whose `/health` still says 200),
  out at once. A busy engine is never sent a probe of its own, so a saturating load cannot make a
  slow answer look like a frozen one;
- an idle engine (nothing moved, nothing in flight) gets a real one-token completion every `interval`:
  no answer within `completion_timeout` while its counters stay still takes it out at once; `failures`
  in a row that fail otherwise (an HTTP error, or no answer while tokens moved) take it out. At the
  defaults (1 s, 5 s stall; 3 s, 5 s timeout) a frozen engine is out within 10 s, busy or idle;
- an engine without Prometheus metrics is judged by `/health` and the completions alone;
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
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from specdeploy import names
from specdeploy.fleet.engine_probes import (
    Probe,
    Progress,
    Worker,
    http_request,
    of_group,
    probe_completion,
    probe_metrics,
)
from specdeploy.fleet.router_api import SENTINEL_PORT, members_url, membership_url
from specdeploy.fleet.sentinel_metrics import Tally

# Where roles/sentinel installs it and roles/serving registers each engine (one rule, two roles).
PATHS = {"workers": "/etc/specdeploy-sentinel/workers.d", "state": "/var/lib/specdeploy-sentinel/state.json"}
ROUTER_TIMEOUT_S = 30.0  # add_worker waits for /health; a worker that just answered one does at once
KEEP_TRANSITIONS = 200


@dataclass(frozen=True)
class Settings:
    router_port: int = names.ROUTER_PORT
    interval_s: float = 3.0
    failures: int = 3
    completion_timeout_s: float = 5.0
    health_every_s: float = 1.0
    control_port: int = SENTINEL_PORT
    progress_stall_s: float = 5.0


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
    if probe.kind == "busy":
        return Decision(replace(state, failures=0, last=last))
    if probe.kind == "ok":
        fresh = replace(state, failures=0, last=last)
        if state.member or state.held:
            return Decision(fresh)
        why = "serves again" if state.out_by_sentinel else "serves, and the router had lost it (restarted?)"
        return Decision(replace(fresh, since=now), "add", f"{why} ({probe.detail})")
    if probe.kind in ("down", "dead", "frozen"):
        failures, reason = failures_out, f"engine {'frozen' if probe.kind == 'frozen' else 'down'}: {probe.detail}"
    else:
        failures = state.failures + 1
        reason = f"{failures} failed completions in a row (last: {probe.kind}, {probe.detail})"
    worse = replace(state, failures=failures, last=last)
    if state.member and failures >= failures_out:
        return Decision(replace(worse, since=now), "remove", reason)
    return Decision(worse)


class Router:
    """The router's worker API on this host's loopback."""

    def __init__(self, port: int) -> None:
        self.port = port

    def members(self) -> set[str]:
        status, body = http_request(urllib.request.Request(members_url(self.port)), ROUTER_TIMEOUT_S)
        if status != 200:
            raise OSError(f"list_workers answered {status}")
        return {str(u) for u in json.loads(body).get("urls", [])}

    def change(self, action: str, worker: str) -> None:
        req = urllib.request.Request(membership_url(action, worker, self.port), b"", method="POST")
        status, body = http_request(req, ROUTER_TIMEOUT_S)
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
                 metrics: Callable[[Worker], Probe | Progress] = probe_metrics,
                 completion: Callable[[Worker, float], Probe] = probe_completion,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.settings, self.router, self.state_path, self.say = settings, router, state_path, say
        self.metrics, self.completion, self.clock = metrics, completion, clock
        self.lock = threading.Lock()
        self.states: dict[str, WorkerState] = {}
        self.transitions: list[dict[str, Any]] = []
        self.holds: set[str] = set()
        self.registered: dict[str, Worker] = {}  # by file name, re-read by run()
        self.tally = Tally()  # GET /metrics
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
                self.tally.moved(self.host_of(worker.url), decision.action, probe.kind)
                self.say(f"sentinel: {verb} {worker.url}: {decision.reason}")
                self.transitions.append({"time": now, "worker": worker.url, "to": verb.lower(),
                                         "reason": decision.reason})  # fmt: skip
                del self.transitions[:-KEEP_TRANSITIONS]
            changed = new != self.states.get(worker.url) or decision.action is not None
            self.states[worker.url] = new
            self.tally.state(self.host_of(worker.url), new.member, new.held)
            if changed:  # not on every probe: a steady engine writes nothing
                self._save()
            return replace(decision, state=new)

    def host_of(self, url: str) -> str:
        """The registration's name (its inventory host) of the worker at URL: the metrics' `host` label."""
        return next((name for name, w in self.registered.items() if w.url == url), url)

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
        pace = Pace(self.settings, self.clock())
        while not stop.is_set():
            worker = current()
            if worker is None:
                return
            began = self.clock()
            probe = self.look(worker, pace)
            self.tally.probed(self.host_of(worker.url), probe.kind, self.clock() - began)
            self.step(worker, probe)
            stop.wait(self.settings.health_every_s)

    def look(self, worker: Worker, pace: Pace) -> Probe:
        """This second's probe of WORKER: its progress, or (idle) a completion when one is due."""
        reading = self.metrics(worker)
        now = self.clock()
        if isinstance(reading, Progress):
            verdict = pace.read(reading, now)
            if verdict is not None:
                return verdict
            waiting = reading.in_flight > 0
            seen = Probe("alive", f"{reading.in_flight:.0f} request(s) in flight, within the stall bound" if waiting
                         else "idle: no token moved, nothing in flight")  # fmt: skip
        elif reading.kind in ("down", "dead"):
            return reading
        else:
            waiting, seen = False, reading
        state = self.states.get(worker.url, WorkerState())
        out_and_answering = not state.member and not state.held and seen.kind == "alive"
        # Requests in flight are judged by their own tokens and the stall bound, never by a probe of ours:
        # it would queue behind them, and its timeout would make a busy engine's slow answer a freeze.
        if (waiting or not pace.completion_due(now)) and not out_and_answering:
            return seen
        probe = self.completion(worker, self.settings.completion_timeout_s)
        pace.completed(self.clock())
        if probe.kind == "stalled" and isinstance(reading, Progress):
            after = self.metrics(worker)  # did anything move while the completion waited?
            if isinstance(after, Progress) and after.tokens == reading.tokens:
                return Probe("frozen", f"{probe.detail}, and no token moved meanwhile")
        return probe

    def run(self, folder: Path, stop: threading.Event, rescan_s: float = 3.0) -> None:
        threads: dict[str, threading.Thread] = {}
        rules = self.settings
        every = (f"progress every {rules.health_every_s:g} s, frozen after {rules.progress_stall_s:g} s; "
                 f"idle: a completion every {rules.interval_s:g} s")  # fmt: skip
        self.say(f"sentinel: watching the workers registered under {folder} (router 127.0.0.1:{self.router.port}, "
                 f"{every})")  # fmt: skip
        while not stop.is_set():
            before, self.registered = self.registered, read_workers(folder) if folder.is_dir() else {}
            for gone in before.keys() - self.registered.keys():
                self.tally.forget(gone)
            for name, worker in self.registered.items():
                if name not in threads or not threads[name].is_alive():
                    current = functools.partial(self.worker, name)
                    threads[name] = threading.Thread(target=self.watch, args=(current, stop), name=f"sentinel-{name}",
                                                     daemon=True)  # fmt: skip
                    threads[name].start()
                    self.say(f"sentinel: watching {name} ({worker.url}, model {worker.model})")
            stop.wait(rescan_s)


class Pace:
    """One worker's clock: when its counters last moved, and when its next idle completion is due."""

    def __init__(self, settings: Settings, now: float) -> None:
        self.settings = settings
        self.last: Progress | None = None
        self.moved_at = now
        self.next_completion = now  # the first look proves it
        self.absorb = False

    def read(self, progress: Progress, now: float) -> Probe | None:
        """busy when the counters moved, frozen when requests wait and nothing moved for the stall
        bound; None otherwise (requests within the bound wait; an idle engine gets a completion when due)."""
        before, self.last = self.last, progress
        was_in_flight = bool(before and before.in_flight)
        if self.absorb:  # the tokens of our own completion are not the engine's traffic
            self.absorb, before = False, None
        if before is not None and progress.tokens != before.tokens:  # (a restarted engine counts from 0)
            self.moved_at = now
            self.next_completion = now + self.settings.interval_s  # progress is proof: no probe of our own
            return Probe("busy", f"{progress.tokens - before.tokens:+.0f} tokens, {progress.in_flight:.0f} in flight")
        if progress.in_flight > 0 and not was_in_flight:
            # The stall counts from when requests came in flight, not from the last traffic: an engine
            # idle for minutes meets a request whose prefill (seconds on a CPU) has no token yet
            # (the fleet's false removal of 2026-12-06, "no token for 11 s").
            self.moved_at = max(self.moved_at, now)
        still = now - self.moved_at
        if progress.in_flight > 0 and still >= self.settings.progress_stall_s:
            return Probe("frozen", f"{progress.in_flight:.0f} request(s) in flight and no token for {still:.0f} s")
        return None

    def completion_due(self, now: float) -> bool:
        return now >= self.next_completion

    def completed(self, now: float) -> None:
        self.next_completion, self.absorb = now + self.settings.interval_s, True


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
    """The hold API on loopback: POST /hold or /release ?worker=URL, GET /state (no keys in it), and
    GET /metrics (specdeploy.fleet.sentinel_metrics) for Prometheus."""

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
            if urlsplit(self.path).path == "/metrics":
                body = sentinel.tally.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if urlsplit(self.path).path != "/state":
                self._reply(404, {"error": "GET /state or /metrics"})
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
                      control_port=int(settings.get("control_port", SENTINEL_PORT)),
                      progress_stall_s=float(settings.get("progress_stall", Settings.progress_stall_s)))  # fmt: skip
    return [python, "-m", "specdeploy.fleet.sentinel", "--workers-dir", PATHS["workers"], "--state", PATHS["state"],
            "--router-port", str(parsed.router_port), "--interval", f"{parsed.interval_s:g}",
            "--failures", str(parsed.failures), "--completion-timeout", f"{parsed.completion_timeout_s:g}",
            "--control-port", str(parsed.control_port), "--progress-stall", f"{parsed.progress_stall_s:g}"]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.fleet.sentinel", description=__doc__.split("\n")[0])
    parser.add_argument("--workers-dir", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--router-port", type=int, default=Settings.router_port)
    parser.add_argument("--interval", type=float, default=Settings.interval_s)
    parser.add_argument("--failures", type=int, default=Settings.failures)
    parser.add_argument("--completion-timeout", type=float, default=Settings.completion_timeout_s)
    parser.add_argument("--control-port", type=int, default=SENTINEL_PORT)
    parser.add_argument("--progress-stall", type=float, default=Settings.progress_stall_s)
    args = parser.parse_args(argv)
    if min(args.interval, args.completion_timeout, args.progress_stall) <= 0 or args.failures < 1:
        parser.error("--interval, --completion-timeout and --progress-stall must be > 0, --failures ≥ 1")
    settings = Settings(args.router_port, args.interval, args.failures, args.completion_timeout,
                        control_port=args.control_port, progress_stall_s=args.progress_stall)  # fmt: skip
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
