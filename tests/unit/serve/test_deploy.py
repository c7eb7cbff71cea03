"""The serve task's deploy (specdeploy.serve.deploy) on fake hosts: what runs in what order, what is said,
recorded and returned, for one host, a fleet host and a multi-node group's ranks; and the role's knobs,
read from the task's variables as the schema declares them (roles/serving lists none of them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import yaml
from docker.errors import ImageNotFound

from specdeploy.errors import SpecdeployError
from specdeploy.gate.benchmark import GateResult
from specdeploy.gate.rules import GateSettings
from specdeploy.proof import Proof
from specdeploy.record_types import PrewarmReport
from specdeploy.records import Serving
from specdeploy.serve import deploy
from specdeploy.serve.config import CONTAINER, ServingConfig
from specdeploy.serve.engine_cache import CACHE_MOUNT, Prepared
from specdeploy.serve.engine_host import FAILED, PREVIOUS
from specdeploy.serve.schema import BY_VARIABLE, KNOBS
from specdeploy.watch.watchdog import Verdict

from ..fakes import FakeDocker, FakeWatch, MemoryStore

ROOT = Path(__file__).parents[3]
KEY = "sk-test-0123456789"  # a secret: in no result, no line said
WARMED = "/srv/models/target {'readers': 0, 'max_fraction': 0.5, 'max_gb': 0}"  # the model, the prewarm's values
READY = f"{CONTAINER}: READY 1.0s READY sha256:v1"


def config(tag: str, **more: Any) -> dict[str, Any]:
    """A serving_config as roles/serving composes it."""
    return {"engine": "vllm", "image": tag, "model_path": "/srv/models/target", "served_model_name": "m", **more}


def group_config(tag: str, rank: int) -> dict[str, Any]:
    return config(tag, nnodes=2, node_rank=rank, master_addr="10.0.0.1", multi_node="data_parallel")


def args(action: str = "deploy", image: str | None = "v1", cfg: dict[str, Any] | None = None, **more: Any):
    """The action's arguments as its argument spec gives them (its defaults filled in)."""
    return {"action": action, "image": image, "config": cfg or config(image or "v1"),
            "engine_image_profile": "vllm-cpu", "engine_image_drafter_path": "", "router_host": "",
            "router_port": 8080, "sentinel_port": 8081, **more}  # fmt: skip


class Images:
    """The images built on a host, found by tag or by id (sha256:<tag>)."""

    def __init__(self, engine: FakeDocker, tags: set[str]) -> None:
        self.engine, self.tags = engine, tags

    def get(self, name: str) -> SimpleNamespace:
        self.engine.maybe_fail("image")
        tag = name.removeprefix("sha256:")
        if tag not in self.tags:
            raise ImageNotFound(f"No such image: {name}")
        return SimpleNamespace(id=f"sha256:{tag}", labels={"io.specdeploy.engine-version": "0.32.0"})


@dataclass
class Store(MemoryStore):
    """The host's records: rollout.json (MemoryStore) and each current.json written."""

    served: list[Serving] = field(default_factory=list)

    def record_serving(self, serving: Serving) -> None:
        self.served.append(serving)


class Commands:
    """A host's commands: the gate's hardware probe prints a fixed CPU here."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def command(self, *argv: str) -> list[str]:
        return ["printf", "model name\t: Test CPU\\n4\\n"]

    def prove_serving(self, state_dir: str = "", **_: object) -> Proof:
        """The host's proof of serving (specdeploy.proof): what the test sets, counted."""
        self.host.proofs.append(state_dir)
        return self.host.proof


class Host:
    """One host as the deploy reaches it: its Docker engine, images, records and watchdog."""

    def __init__(self, name: str, diagnostics: Path, tags: set[str]) -> None:
        self.name, self.docker, self.store = name, FakeDocker(), Store()
        self.docker.images = Images(self.docker, tags)  # type: ignore[assignment]
        self.watch = FakeWatch(self.docker, {})
        self.watch.diagnostics = str(diagnostics)
        self.commands, self.target = Commands(self), SimpleNamespace(host=name)
        self.state_dirs: list[str] = []
        self.proof, self.proofs = Proof(True, "a 4-token completion answered in 0.05 s"), []

    def reconnect_docker(self) -> FakeDocker:
        return self.docker

    def __str__(self) -> str:
        return f"ssh://{self.name}"

    def serving(self) -> tuple[str, str] | None:
        c = self.docker.named(CONTAINER)
        return (c.image_id, c.status) if c else None


class Play:
    """The play as Ansible has it (deploy.Inventory), with fakes for every part the deploy builds on a
    host; `log` is every step in the order it happened, across hosts, the router and the gate."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosts: tuple[str, ...] = ("tb-1",)) -> None:
        self.run_folder = tmp_path / "run"
        self.hosts = {h: Host(h, self.run_folder, {"v1", "v2", "bad", "slow"}) for h in (*hosts, "router")}
        self.configs: dict[str, dict[str, Any] | None] = {h: config("v1") for h in hosts}
        self.keys: dict[str, str] = {}
        self.host_name, self.address = hosts[0], "10.1.0.1"
        self.log: list[str] = []
        self.lines: list[str] = []
        self.gates: list[FakeGate] = []
        self.refuses: set[str] = set()
        self.options: list[Any] = []
        self.caches: list[str] = []
        monkeypatch.setenv("SPECDEPLOY_STATE", str(tmp_path / "state"))
        monkeypatch.setattr(deploy, "HostRecords", self.records)
        monkeypatch.setattr(deploy, "prewarmer", self.prewarmer)
        monkeypatch.setattr(deploy, "watch_container_on_host", self.watch_one)
        monkeypatch.setattr(deploy, "watch_group_on_hosts", self.watch_group)
        monkeypatch.setattr(deploy, "RouterMembership", lambda *a: Membership(self, *a))
        monkeypatch.setattr(deploy, "BenchmarkGate", SimpleNamespace(for_engine=self.gate))
        monkeypatch.setattr(deploy.engine_cache, "prepare", self.engine_cache)

    # deploy.Inventory
    @property
    def play_hosts(self) -> list[str]:
        return list(self.configs)

    @property
    def connection(self) -> Host:
        return self.hosts[self.host_name]

    def connection_of(self, host: str) -> Host:
        self.log.append(f"connect {host}")
        return self.hosts[host]

    def serving_config(self, host: str) -> dict[str, Any] | None:
        return self.configs.get(host)

    def api_key(self, host: str) -> str | None:
        return self.keys.get(host)

    def say(self, line: str) -> None:
        self.lines.append(line)

    # the parts
    def records(self, commands: Commands, state_dir: str) -> Store:
        commands.host.state_dirs.append(state_dir)
        return commands.host.store

    def prewarmer(self, commands: Commands, model_path: str, values: dict[str, Any]) -> Any:
        def warm() -> PrewarmReport:
            self.log.append(f"warm {commands.host.name} {model_path} {values}")
            return PrewarmReport(True, f"page cache warmed on {commands.host.name}", model_bytes=10)

        return SimpleNamespace(warm=warm)

    def engine_cache(self, commands: Commands, state_dir: str, engine: str, image: str, *, keep: int,
                     max_gb: float) -> Prepared:  # fmt: skip
        """The host's cache folder (engine_cache.prepare runs shell there: tests/unit/serve/test_engine_cache.py)."""
        self.caches.append(f"{commands.host.name} {image} keep={keep} max_gb={max_gb}")
        name = f"{engine}-{image.removeprefix('sha256:')[:12]}-cpu"
        return Prepared(name, f"{state_dir}/engine-cache/{name}", 0, ())

    def watch_one(self, conn: Host, container: str, port: int, options: Any, grace: float) -> Verdict:
        self.options.append((options, grace))
        self.log.append(f"watch {conn.name} {container}")
        options.on_progress("loading weights, 12 s")
        return conn.watch(container)

    def watch_group(self, conns: list[tuple[int, str, Host]], container: str, port: int, options: Any,
                    grace: float) -> Verdict:  # fmt: skip
        self.options.append((options, grace))
        self.log.append(f"watch {[h for _, h, _ in conns]} {container}")
        head = conns[0][2].watch(container)
        dead = [h for _, h, c in conns if c.docker.named(container).status != "running"]  # type: ignore[union-attr]
        return Verdict(status="FAILED" if dead else head.status, elapsed_s=1.0, stage="API server up",
                       headline=head.headline, diagnostics=str(self.run_folder))  # fmt: skip

    def gate(self, settings: GateSettings, cfg: ServingConfig, hardware: str) -> FakeGate:
        gate = FakeGate(self, settings, cfg.engine, hardware)
        self.gates.append(gate)
        return gate

    def run(self, action_args: dict[str, Any], **values: Any) -> dict[str, Any]:
        return deploy.run(self, action_args, {f"serving_{k}": v for k, v in values.items()})  # type: ignore[arg-type]


class Membership:
    def __init__(self, play: Play, *made: Any) -> None:  # router, its port, worker URL, say, sentinel port
        router, port, worker, _, sentinel_port = made
        self.play = play
        play.log.append(f"router {router.name}:{port} worker {worker} sentinel {sentinel_port}")

    def hold(self) -> None:
        self.play.log.append("hold")

    def leave(self) -> None:
        self.play.log.append("leave")

    def join(self) -> bool:
        self.play.log.append("join")
        return True


class FakeGate:
    """The benchmark gate: refuses the play's `refuses` images."""

    def __init__(self, play: Play, settings: GateSettings, engine: str, hardware: str) -> None:
        self.play, self.settings, self.engine, self.hardware = play, settings, engine, hardware

    def wants_baseline(self) -> bool:
        return False

    def baseline_key(self, config_digest: str, engine_version: str) -> str:
        return config_digest

    def outgoing(self, container: Any, kept: dict[str, Any] | None) -> dict[str, Any]:
        self.play.log.append(f"measure outgoing {container.image_id}")
        return {"figures": None, "note": "no figures kept"}

    def __call__(self, container: Any, verdict: dict[str, Any], kept: Any, outgoing: Any, baseline: Any, *,
                 schedule: Any = None) -> GateResult:  # fmt: skip
        self.play.log.append(f"gate {container.image_id}")
        passed = container.image_id.removeprefix("sha256:") not in self.play.refuses
        message = "benchmark gate passed" if passed else "benchmark gate refused: mean acceptance length fell"
        return GateResult(passed, message, {"figures": {}}, {"gate": {"passed": passed}})


@pytest.fixture
def play(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Play:
    return Play(tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------- one host


def test_every_rank_mounts_its_hosts_cache_and_the_cache_can_be_switched_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 36: the role's knobs reach the cache's preparation; each rank of a group starts from its own
    host's cache; serving_engine_cache: false mounts none. (The baseline's container is the same config
    with speculation off: tests/unit/serve/test_engine_cache.py.)"""
    play = Play(tmp_path, monkeypatch)
    play.run(args(), bench=False, state_dir="/srv/state", engine_cache_keep=2, engine_cache_max_gb=7.5)
    made = play.hosts["tb-1"].docker.created
    assert made[0]["volumes"]["/srv/state/engine-cache/vllm-v1-cpu"] == {"bind": CACHE_MOUNT, "mode": "rw"}
    assert play.caches == ["tb-1 sha256:v1 keep=2 max_gb=7.5"]
    play.run(args(image="v2"), bench=False, state_dir="/srv/state", engine_cache=False)
    assert not any(CACHE_MOUNT in str(v) for v in made[-1]["volumes"].values()) and "VLLM_CACHE_ROOT" not in made[
        -1]["environment"]  # fmt: skip

    group = Play(tmp_path / "group", monkeypatch, hosts=("tb-1", "tb-2"))
    group.configs = {"tb-1": group_config("v1", 0), "tb-2": group_config("v1", 1)}
    group.run(args(cfg=group.configs["tb-1"]), bench=False, state_dir="/srv/state")
    assert sorted(group.caches) == ["tb-1 sha256:v1 keep=3 max_gb=50.0", "tb-2 sha256:v1 keep=3 max_gb=50.0"]
    for host in ("tb-1", "tb-2"):
        (rank,) = group.hosts[host].docker.created
        assert rank["volumes"]["/srv/state/engine-cache/vllm-v1-cpu"]["mode"] == "rw"


def test_a_first_deploy_warms_watches_and_records_what_serves_then_a_rerun_changes_nothing(play: Play) -> None:
    host = play.hosts["tb-1"]
    out = play.run(args(), bench=False, stall_timeout="45", state_dir="/srv/state", prewarm_readers=4)
    assert (out["status"], out["changed"], out["failed"]) == ("deployed", True, False)
    assert out["msg"] == "READY 1.0s READY sha256:v1" and out["joined_router"] is False
    assert out["prewarm"]["message"] == "page cache warmed on tb-1"
    assert [line.split()[0] for line in out["startup_table"]] == ["launched", "resolving", "to"]  # its stages
    assert play.log == ["warm tb-1 /srv/models/target {'readers': 4, 'max_fraction': 0.5, 'max_gb': 0}",
                        f"watch tb-1 {CONTAINER}"]  # fmt: skip
    assert play.lines == ["engine cache vllm-v1-cpu: cold: the first start of this image here",
                          "page cache warmed on tb-1", f"watching {CONTAINER} (stall timeout 45 s)",
                          f"{CONTAINER}: loading weights, 12 s", READY]  # fmt: skip
    assert play.caches == ["tb-1 sha256:v1 keep=3 max_gb=50.0"]
    (made,) = host.docker.created  # the engine's container mounts its image's cache, read-write
    assert made["volumes"]["/srv/state/engine-cache/vllm-v1-cpu"] == {"bind": CACHE_MOUNT, "mode": "rw"}
    assert made["environment"]["VLLM_CACHE_ROOT"] == f"{CACHE_MOUNT}/vllm"
    options, grace = play.options[0]
    assert (options.stall_timeout_s, options.timeout_s, options.speculative, grace) == (45.0, 3600.0, True, 120.0)
    assert host.state_dirs == ["/srv/state"] and host.serving() == ("sha256:v1", "running")
    (current,) = host.store.served
    assert (current.image, current.image_id, current.previous_image_id) == ("v1", "sha256:v1", None)
    assert current.config == {**config("v1"), "api_key_set": False}
    assert json.loads((play.run_folder / "prewarm.json").read_text())["message"] == "page cache warmed on tb-1"
    again = play.run(args(), bench=False)
    assert (again["status"], again["changed"], again["prewarm"]) == ("unchanged", False, None)
    assert len(host.store.served) == 1 and len(play.log) == 2  # neither warmed nor watched again


def test_a_proven_engine_that_does_not_answer_is_restarted_and_watched_never_called_unchanged(play: Play) -> None:
    """issue 35: /health 200 over a frozen engine core. The rerun asks the host's proof of serving; a
    proven version that does not answer is restarted as it is and watched to READY, or the task fails
    with a sentence naming what did not answer."""
    host = play.hosts["tb-1"]
    play.run(args(), bench=False, state_dir="/srv/state")
    engine = host.docker.named(CONTAINER)
    assert engine is not None and engine.starts == 1
    host.proof = Proof(False, "engine process(es) stopped (state T): 41 VLLM::EngineCore; no answer to a "
                       "4-token completion in 15 s", 15.0, ["41 VLLM::EngineCore"])  # fmt: skip
    again = play.run(args(), bench=False, state_dir="/srv/state")
    assert (again["status"], again["changed"], again["failed"]) == ("restarted", True, False)
    assert again["msg"].startswith("the proven engine did not answer (engine process(es) stopped (state T): "
                                   "41 VLLM::EngineCore; ")  # fmt: skip
    assert "restarted the same version, READY" in again["msg"]
    assert host.docker.named(CONTAINER) is engine and engine.starts == 2 and engine.policy == "unless-stopped"
    assert host.proofs == ["/srv/state"]  # asked of the host's own records (a first deploy watches READY)
    # Restarting brings nothing back: the task fails, naming what did not answer and the watch's verdict.
    host.watch.outcomes = {"sha256:v1": "STALLED"}
    failed = play.run(args(), bench=False, state_dir="/srv/state")
    assert failed["failed"] is True
    assert failed["msg"].startswith("the engine did not answer (engine process(es) stopped (state T)")
    assert "restarting the same proven version did not bring it back: STALLED" in failed["msg"]
    # Answering again: unchanged, and the proof's sentence says how it was proven.
    host.watch.outcomes, host.proof = {}, Proof(True, "a 4-token completion answered in 0.05 s")
    play.run(args(), bench=False, state_dir="/srv/state")
    fine = play.run(args(), bench=False, state_dir="/srv/state")
    assert (fine["status"], fine["changed"]) == ("unchanged", False)
    assert fine["msg"].endswith("not restarted; a 4-token completion answered in 0.05 s")


def test_a_version_that_fails_is_rolled_back_and_the_task_fails_with_both_verdicts(play: Play) -> None:
    play.hosts["tb-1"].watch.outcomes = {"sha256:bad": "FAILED"}
    play.run(args(), bench=False)
    out = play.run(args(image="bad", cfg=config("bad")), bench=False, warm_page_cache=False)
    assert (out["status"], out["failed"], out["changed"]) == ("rolled-back", True, True)
    assert out["msg"].startswith("FAILED 1.0s FAILED sha256:bad | rolled back to the previous engine (sha256:v1)")
    assert out["warm"] == "page cache not warmed (serving_warm_page_cache: false)" and out["prewarm"] is None
    # The restored version's floor (twice its proven 37 s stage: 74 s) is under the stall timeout: unsaid.
    assert play.lines[-3] == f"watching {CONTAINER} (stall timeout 300 s)"
    assert "(the proven version's" not in " ".join(play.lines)
    assert play.hosts["tb-1"].docker.named(FAILED).image_id == "sha256:bad"  # type: ignore[union-attr]
    assert len(play.hosts["tb-1"].store.served) == 1  # current.json: only what was promoted


def test_the_proven_versions_floor_is_said_when_it_raises_the_stall_timeout(play: Play) -> None:
    play.hosts["tb-1"].watch.outcomes = {"sha256:bad": "FAILED"}
    play.run(args(), bench=False, stall_timeout=20)
    play.run(args(image="bad", cfg=config("bad")), bench=False, stall_timeout=20)
    assert play.lines[-3] == (f"watching {CONTAINER} (stall timeout 74 s (the proven version's: twice its "
                              "longest recorded stage))")  # fmt: skip
    assert [o.stall_timeout_s for o, _ in play.options] == [20.0, 20.0, 74.0]


def test_the_benchmark_gate_is_said_kept_beside_the_verdict_and_a_refusal_rolls_back(play: Play) -> None:
    play.refuses = {"slow"}
    out = play.run(args(), bench_budget_s="90", bench_concurrency=8)
    (gate,) = play.gates
    assert (gate.settings.budget_s, gate.settings.concurrency, gate.hardware) == (90.0, 8, "CPU Test CPU, 4 threads")
    assert out["status"] == "deployed" and out["gate"] == {"gate": {"passed": True}}
    assert out["msg"].endswith("| benchmark gate passed")
    assert "benchmark gate: vllm bench serve in specdeploy-engine (budget 90 s, on CPU Test CPU, 4 threads)" in (
        play.lines
    )
    bench = json.loads((play.run_folder / "bench.json").read_text())
    assert (bench["host"], bench["image"], bench["image_id"]) == ("tb-1", "v1", "sha256:v1")
    assert bench["config_digest"] == ServingConfig.from_vars(config("v1")).digest()
    refused = play.run(args(image="slow", cfg=config("slow")))
    assert (refused["status"], refused["failed"]) == ("rolled-back", True)
    assert "benchmark gate refused" in refused["msg"]
    # The outgoing v1 was measured before it stopped, then slow judged, then v1 brought back.
    assert play.log[-4:] == ["measure outgoing sha256:v1", f"watch tb-1 {CONTAINER}", "gate sha256:slow",
                             f"watch tb-1 {CONTAINER}"]  # fmt: skip
    assert "benchmark gate: outgoing" not in " ".join(play.lines) and "benchmark gate: no figures kept" in play.lines


def test_no_gate_runs_when_serving_bench_is_false_nor_on_a_rollback(play: Play) -> None:
    play.run(args(), bench=False)
    play.run(args(image="v2", cfg=config("v2")), bench=False)
    assert play.gates == []
    out = play.run(args(action="rollback", image=None, cfg=config("v2")))
    assert out["status"] == "deployed" and play.gates == []
    assert play.hosts["tb-1"].serving() == ("sha256:v1", "running")
    assert play.hosts["tb-1"].docker.named(PREVIOUS).image_id == "sha256:v2"  # type: ignore[union-attr]
    assert play.hosts["tb-1"].store.served[-1].image == "sha256:v1"  # a rollback names the image by its id


def test_bad_gate_settings_refuse_a_deploy_before_anything_is_touched_but_not_a_rollback(play: Play) -> None:
    bad = {"bench_baseline": "once", "bench_sweep": []}
    out = play.run(args(), **bad)
    assert out == {"failed": True, "msg": "serving_bench_baseline: once compares a sweep: set serving_bench_sweep, "
                   "e.g. [1, 4, 16, 64]"}  # fmt: skip
    assert play.log == [] and play.hosts["tb-1"].docker.calls == 0
    play.run(args(), bench=False)
    play.run(args(image="v2", cfg=config("v2")), bench=False)
    assert play.run(args(action="rollback", image=None), **bad)["status"] == "deployed"


def test_a_deploy_needs_an_image_that_is_on_the_host(play: Play) -> None:
    out = play.run(args(image=None), bench=False)
    assert out == {"failed": True, "changed": False, "msg": "specdeploy_serve: action=deploy needs image"}
    out = play.run(args(image="v9", cfg=config("v9")), bench=False)
    assert out["failed"] and out["msg"] == "image v9 is not on ssh://tb-1: run the build phase first"
    assert play.log == []


def test_a_lost_watch_stops_the_rollout_where_it_is(play: Play, monkeypatch: pytest.MonkeyPatch) -> None:
    def lost(conn: Host, container: str, port: int, options: Any, grace: float) -> Verdict:
        return Verdict(status="LOST", elapsed_s=130.0, stage="loading", headline="no contact with tb-1 for 130 s")

    monkeypatch.setattr(deploy, "watch_container_on_host", lost)
    out = play.run(args(), bench=False)
    assert out == {"failed": True, "changed": True, "msg": "no contact with tb-1 for 130 s"}
    assert play.hosts["tb-1"].store.load().phase == "watching"  # the next deploy resumes from here


def test_a_dropped_connection_says_where_the_rollout_stood_and_what_to_run(play: Play) -> None:
    play.hosts["tb-1"].docker.fail["create"] = [requests.exceptions.ConnectionError("connection reset")] * 30
    out = play.run(args(), bench=False, reconnect_grace=0)
    assert out["failed"] and out["changed"]
    assert out["msg"].startswith("lost contact with ssh://tb-1 while rolling the engine out (ConnectionError: "
                                 "connection reset); as far as the rollout record knows:")  # fmt: skip
    assert (
        "contact lost for more than 0 s (serving_reconnect_grace); when tb-1 answers again: make status" in (out["msg"])
    )


def test_a_fleet_host_is_held_leaves_before_the_old_engine_stops_and_joins_once_ready(play: Play) -> None:
    fleet = {"router_host": "router", "router_port": 8090, "sentinel_port": 8091}
    first = play.run(args(**fleet), bench=False)
    assert first["joined_router"] is True and first["changed"] is True
    assert play.log == ["connect router", "router router:8090 worker http://10.1.0.1:8000 sentinel 8091", "hold",
                        f"warm tb-1 {WARMED}",
                        f"watch tb-1 {CONTAINER}", "join"]  # fmt: skip
    play.log.clear()
    play.run(args(image="v2", cfg=config("v2"), **fleet), bench=False, fleet_worker="http://[fd00::1]:8000")
    assert play.log[1:] == ["router router:8090 worker http://[fd00::1]:8000 sentinel 8091", "hold",
                            f"warm tb-1 {WARMED}", "leave",
                            f"watch tb-1 {CONTAINER}", "join"]  # fmt: skip
    play.hosts["tb-1"].watch.outcomes = {"sha256:bad": "FAILED", "sha256:v2": "FAILED"}
    play.log.clear()
    failed = play.run(args(image="bad", cfg=config("bad"), **fleet), bench=False)
    assert failed["status"] == "failed" and failed["joined_router"] is False and "join" not in play.log


def test_the_api_key_reaches_the_engine_and_the_watch_but_no_result_or_line(play: Play) -> None:
    play.keys = {"tb-1": KEY}
    out = play.run(args())
    options, _ = play.options[0]
    assert options.api_key == KEY and play.hosts["tb-1"].store.served[0].config["api_key_set"] is True
    assert KEY not in json.dumps(out, default=str) and not [line for line in play.lines if KEY in line]
    assert KEY not in (play.run_folder / "bench.json").read_text()


# ---------------------------------------------------------------------------------------------- a group


@pytest.fixture
def group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Play:
    play = Play(tmp_path, monkeypatch, hosts=("tb-1", "tb-2"))
    play.configs = {"tb-1": group_config("v1", 0), "tb-2": group_config("v1", 1)}
    play.keys = {"tb-1": KEY, "tb-2": KEY}
    return play


def test_rank_0s_task_rolls_every_rank_out_and_records_each_hosts_own_version(group: Play) -> None:
    out = group.run(args(cfg=group.configs["tb-1"]), bench=True)
    assert (out["status"], out["changed"], out["data_parallel"]) == ("deployed", True, True)
    assert out["ranks"] == {"tb-1": 0, "tb-2": 1}
    assert out["prewarm"] is None and out["warm"] == "tb-1: page cache warmed on tb-1; tb-2: page cache warmed on tb-2"
    assert group.gates == [] and "benchmark gate: not run on a multi-node group (it measures one host's engine)" in (
        group.lines
    )
    assert group.log == ["connect tb-2", f"warm tb-1 {WARMED}", f"warm tb-2 {WARMED}",
                         f"watch ['tb-1', 'tb-2'] {CONTAINER}"]  # fmt: skip
    assert f"watching the 2 ranks of {CONTAINER} on tb-1, tb-2 (stall timeout 300 s)" in group.lines
    assert group.lines[-1] == "group: READY 1.0s READY sha256:v1"
    options, _ = group.options[0]
    assert (options.data_parallel_ranks, options.api_key) == (2, KEY)
    for name, rank in (("tb-1", 0), ("tb-2", 1)):
        (current,) = group.hosts[name].store.served
        assert current.config == {**group_config("v1", rank), "api_key_set": True}, name
        assert group.hosts[name].serving() == ("sha256:v1", "running")
    assert json.loads((group.run_folder / "prewarm.json").read_text())["message"] == "page cache warmed on tb-1"


def test_the_other_ranks_tasks_change_nothing_and_a_group_is_never_rolled_back_by_hand(group: Play) -> None:
    group.host_name = "tb-2"
    out = group.run(args(cfg=group.configs["tb-2"]), bench=False)
    assert (out["status"], out["changed"], out["failed"]) == ("unchanged", False, False)
    assert out["msg"] == "rank 1 of 2: rolled out, watched and rolled back with its group by tb-1"
    assert group.log == [] and all(h.docker.calls == 0 for h in group.hosts.values())
    group.host_name = "tb-1"
    with pytest.raises(SpecdeployError, match="a multi-node group rolls back as one") as raised:
        group.run(args(action="rollback", image=None, cfg=group.configs["tb-1"]), bench=False)
    assert raised.value.hint == "make deploy with the previous image (-e serving_image=...)"


def test_a_group_missing_a_rank_is_refused_naming_the_host_that_failed_before(group: Play) -> None:
    group.configs["tb-2"] = None  # its serving variables were never composed
    out = group.run(args(cfg=group.configs["tb-1"]), bench=False)
    assert out["failed"] and "no host in this play has serving_node_rank 1" in out["msg"]
    assert out["msg"].endswith("; tb-2 failed before the rollout: see its error above")
    assert group.log == []


def test_a_failed_group_is_rolled_back_together_and_leaves_and_never_rejoins_the_router(group: Play) -> None:
    fleet = {"router_host": "router"}
    group.run(args(cfg=group.configs["tb-1"], **fleet), bench=False)
    group.hosts["tb-1"].watch.outcomes = {"sha256:bad": "FAILED"}
    group.configs = {"tb-1": group_config("bad", 0), "tb-2": group_config("bad", 1)}
    group.log.clear()
    out = group.run(args(image="bad", cfg=group.configs["tb-1"], **fleet), bench=False)
    assert (out["status"], out["failed"], out["joined_router"]) == ("rolled-back", True, True)
    assert group.log.index("leave") < group.log.index(f"watch ['tb-1', 'tb-2'] {CONTAINER}")
    assert all(len(h.store.served) == 1 for h in (group.hosts["tb-1"], group.hosts["tb-2"]))  # v1's, only


# ---------------------------------------------------------------------------------------------- the knobs


def test_the_deploy_reads_the_roles_own_knobs_and_never_a_secret_or_an_engine_field() -> None:
    for variable in deploy.VARIABLES:
        knob = BY_VARIABLE[variable]
        assert not knob.no_log, variable
        assert knob.field in (None, "page_cache_warmed"), variable  # the engine's own: in serving_config
    gate_knobs = [k.variable for k in KNOBS if k.name.startswith("bench")]
    assert gate_knobs and set(gate_knobs) <= set(deploy.VARIABLES)


def test_every_gate_knob_reaches_its_gate_setting() -> None:
    """A serving_bench_* knob the gate would not read is one the user sets in vain."""
    changed = {"serving_bench": False, "serving_bench_gate": False, "serving_bench_budget_s": 91,
               "serving_bench_concurrency": 9, "serving_bench_max_tokens": 99,
               "serving_bench_min_acceptance_length": 1.5, "serving_bench_max_regression": 0.3,
               "serving_bench_sweep": [1, 2], "serving_bench_baseline": "once",
               "serving_bench_expected_concurrency": 2, "serving_bench_prompts": "/srv/prompts.jsonl"}  # fmt: skip
    assert sorted(changed) == sorted(k.variable for k in KNOBS if k.name.startswith("bench"))
    settings = deploy.Settings.from_values(changed)
    assert settings.bench["enabled"] is False
    default, read = GateSettings(), GateSettings.from_vars(settings.bench)
    assert [f for f in GateSettings.__dataclass_fields__ if getattr(read, f) == getattr(default, f)] == []


def test_a_knob_the_task_does_not_have_is_the_roles_default_and_values_are_typed() -> None:
    settings = deploy.Settings.from_values({"serving_timeout": "600", "serving_warm_page_cache": "no",
                                            "serving_api_key": KEY, "serving_port": 9000})  # fmt: skip
    assert (settings.timeout, settings.warm_page_cache, settings.stall_timeout) == (600.0, False, 300.0)
    assert settings.state_dir == "/var/lib/specdeploy/serving" and settings.fleet_worker == ""
    assert settings.prewarm == {"readers": 0, "max_fraction": 0.5, "max_gb": 0}
    assert KEY not in repr(settings) and "9000" not in repr(settings)


@pytest.mark.parametrize("tasks", ["main.yml", "rollback.yml"])
def test_the_role_hands_the_action_its_arguments_and_lists_none_of_the_knobs_it_reads(tasks: str) -> None:
    from tests.support import action_docs  # noqa: PLC0415

    spec = action_docs.load_plugin(ROOT, "specdeploy_serve").ActionModule.ARGUMENTS

    def serve_tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found = [t["specdeploy_serve"] for t in items if "specdeploy_serve" in t]
        return found + [s for t in items for s in serve_tasks(t.get("block", []) + t.get("always", []))]

    (task,) = serve_tasks(yaml.safe_load((ROOT / "roles/serving/tasks" / tasks).read_text()))
    assert set(task) <= set(spec)
    assert not [v for v in deploy.VARIABLES if v in json.dumps(task)]


def test_the_engines_own_kv_tokens_are_set_beside_preflights_prediction_with_the_error(play: Play) -> None:
    """issue 36: after READY the rollout's result holds the engine's KV figure (the watch reads it from the
    log: SGLang 0.5.23's "#tokens: 281803" on the H100) beside what preflight predicted before the load."""
    host = play.hosts["tb-1"]
    ready = host.watch

    def with_figures(container: str, stall_floor_s: float = 0.0) -> Verdict:
        verdict = ready(container, stall_floor_s)
        verdict.memory = {"kv_tokens": [281_803], "kv_gib": [18.44]}
        return verdict

    host.watch = with_figures  # type: ignore[assignment]
    out = play.run(args(predicted_kv_capacity=288_585), bench=False)
    assert out["kv_cache"] == {"engine_tokens": 281_803, "predicted_tokens": 288_585, "error_pct": 2.4}
    assert out["msg"].endswith("| KV cache: the engine's 281,803 tokens, predicted 288,585 (+2.4 %)")
    again = play.run(args(), bench=False)  # no prediction (preflight did not run): nothing set beside
    assert again["kv_cache"] is None and "KV cache" not in again["msg"]


def test_a_groups_kv_figure_is_rank_0s_set_beside_the_prediction(group: Play, monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node group's verdict is rank 0's (its log: the engine's KV figure), set beside preflight's."""
    ranks = group.watch_group

    def with_figures(*a: Any, **k: Any) -> Verdict:
        verdict = ranks(*a, **k)
        verdict.memory = {"kv_tokens": [1_000_000]}
        return verdict

    monkeypatch.setattr(deploy, "watch_group_on_hosts", with_figures)
    out = group.run(args(cfg=group.configs["tb-1"], predicted_kv_capacity=950_000), bench=False)
    assert out["kv_cache"] == {"engine_tokens": 1_000_000, "predicted_tokens": 950_000, "error_pct": -5.0}
