"""The rollout's state machine (specdeploy.serve.rollout) on a fake Docker engine: every phase
interrupted and resumed, transport faults retried, and `-previous` only ever a proven version."""

from __future__ import annotations

import dataclasses
import json

import pytest
import requests

from specdeploy.errors import SpecdeployError
from specdeploy.gate.benchmark import GateResult
from specdeploy.records import PHASES
from specdeploy.serve.config import CONFIG_LABEL, CONTAINER, ServingConfig
from specdeploy.serve.engine_host import FAILED, PREVIOUS
from specdeploy.serve.rollout import BASELINE, DRAFT_LENGTH, Rollout

from ..fakes import FakeDocker, FakeWatch, Interrupted, MemoryStore

RESUMABLE = [p for p in PHASES if p != "done"]


def config(tag: str) -> ServingConfig:
    return ServingConfig(engine="vllm", image=tag, model_path="/srv/models/target", served_model_name=tag)


class FakeGate:
    """The benchmark gate: refuses the images it is told to; records what it was compared with."""

    def __init__(self, refuses: set[str], baseline: bool = False) -> None:
        self.refuses, self.seen, self.measured, self.baselines = refuses, [], [], []
        self.events: list[str] = []  # shared with the host's router hook: the order things happened in
        self.wants = baseline
        self.speeds: dict[int, dict[int, float]] = {}  # draft length -> concurrency -> tokens/s
        self.base = {1: 10.0}  # the baseline's tokens/s at each concurrency

    def wants_baseline(self):
        return self.wants

    def baseline_key(self, config_digest, engine_version):
        return f"{config_digest[7:15]}/{engine_version}"

    def baseline(self, container, kept):
        self.baselines.append((container.name, container.image_id, container.status))
        self.events.append(f"baseline {container.name}")
        return {"sweep": [{"concurrency": c, "output_tokens_per_s": v} for c, v in self.base.items()], "max_tokens": 32}

    def outgoing(self, container, kept):
        self.measured.append((container.image_id, container.status, kept))
        self.events.append(f"measured {container.image_id}")
        return {"figures": {"image": container.image_id}}

    def draft_length(self, container, length, tokens):
        """serving_speculative_schedule: auto: the speed each length is told to have (self.speeds)."""
        self.events.append(f"draft length {length} {container.name} {tokens}")
        row = self.speeds[length]
        return {"length": length, "max_tokens": tokens,
                "sweep": [{"concurrency": c, "output_tokens_per_s": s} for c, s in row.items()]}  # fmt: skip

    def __call__(self, container, verdict, kept, outgoing, baseline, *, schedule=None):
        self.seen.append((container.image_id, kept))
        self.schedules = [*getattr(self, "schedules", []), schedule]
        self.outgoings = [*getattr(self, "outgoings", []), outgoing]
        self.judged_with = [*getattr(self, "judged_with", []), baseline]
        figures = {"acceptance_length": 1.1 if container.image_id in self.refuses else 3.0}
        if container.image_id in self.refuses:
            return GateResult(False, "benchmark gate refused: mean acceptance length fell from 3.00 to 1.10",
                              {"figures": figures}, {"gate": {"passed": False}})  # fmt: skip
        return GateResult(True, "benchmark gate passed", {"figures": figures, "image": container.image_id},
                          {"gate": {"passed": True}})  # fmt: skip


class Host:
    """One host: its engine, its record, what the watchdog will say of each image, and its gate."""

    def __init__(self, tmp_path, outcomes: dict[str, str] | None = None, refuses: set[str] = frozenset(),
                 baseline: bool = False, auto: bool = False) -> None:  # fmt: skip
        self.docker, self.store = FakeDocker(), MemoryStore()
        self.auto = auto  # serving_speculative_schedule: auto (with its baseline)
        self.watch = FakeWatch(self.docker, outcomes or {})
        self.diagnostics = tmp_path
        self.gate = FakeGate(set(refuses), baseline or auto)
        self.gate.speeds = {length: {1: 10.0 + length} for length in (1, 2, 3)}

    def rollout(self) -> Rollout:
        return Rollout(lambda: self.docker, self.store, self.watch, self.diagnostics, grace_s=5, gate=self.gate,  # type: ignore[arg-type]
                       before_stop=lambda: self.gate.events.append("left the router"))  # fmt: skip

    def deploy(self, tag: str):
        cfg = dataclasses.replace(config(tag), speculative_schedule="auto") if self.auto else config(tag)
        return self.rollout().deploy(cfg, f"sha256:{tag}", lambda: "warmed")

    def serving(self) -> tuple[str, str, str] | None:
        c = self.docker.named(CONTAINER)
        return (c.image_id, c.status, c.policy) if c else None

    def record(self):
        return self.store.load()

    def watch_raises(self, exc: BaseException) -> None:
        def watch(name: str, stall_floor_s: float = 0.0):
            raise exc

        self.watch = watch  # type: ignore[assignment]


def proven(host: Host, tag: str) -> None:
    """`tag` serves, is recorded as the last READY version, and has its restart policy."""
    assert host.serving() == (f"sha256:{tag}", "running", "unless-stopped")
    engine = host.docker.named(CONTAINER)
    assert engine is not None and host.record().proves(engine.id) and host.record().phase == "done"


def test_first_deploy_is_proven_then_a_rerun_changes_nothing(tmp_path):
    host = Host(tmp_path)
    first = host.deploy("v1")
    assert (first.status, first.changed) == ("deployed", True)
    proven(host, "v1")
    again = host.deploy("v1")
    assert (again.status, again.changed) == ("unchanged", False)
    assert host.docker.named(CONTAINER).starts == 1


def test_a_new_version_keeps_the_proven_one_as_previous(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    host.deploy("v2")
    proven(host, "v2")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v1"


def test_a_failed_version_is_kept_as_failed_and_the_last_ready_one_comes_back(tmp_path):
    host = Host(tmp_path, {"sha256:bad": "FAILED"})
    host.deploy("v1")
    outcome = host.deploy("bad")
    assert outcome.status == "rolled-back", outcome
    proven(host, "v1")
    assert host.docker.named(FAILED).image_id == "sha256:bad" and host.docker.named(FAILED).status == "exited"


def test_previous_is_never_a_version_that_was_not_ready(tmp_path):
    host = Host(tmp_path, {"sha256:bad1": "FAILED", "sha256:bad2": "FAILED"})
    host.deploy("v1")
    host.deploy("bad1")
    host.deploy("bad2")
    proven(host, "v1")
    previous = host.docker.named(PREVIOUS)
    assert previous is None or previous.image_id == "sha256:v1"
    assert host.docker.named(FAILED).image_id == "sha256:bad2"


def test_the_restored_version_is_watched_with_at_least_twice_its_longest_proven_stage(tmp_path):
    """A tight stall timeout must not judge the known-good version STALLED while it imports: the
    rollback's watch gets a floor from the start-up recorded when that version was proven."""
    host = Host(tmp_path, {"sha256:bad": "FAILED"})
    host.deploy("v1")
    host.deploy("bad")
    assert host.watch.floors == [0.0, 0.0, 74.0], host.watch.watched  # v1, bad, then v1 restored
    proven(host, "v1")


def test_two_failed_versions_then_rollback_brings_back_the_ready_one_before(tmp_path):
    host = Host(tmp_path, {"sha256:bad1": "FAILED", "sha256:bad2": "FAILED"})
    host.deploy("v1")
    host.deploy("v2")
    host.deploy("bad1")
    host.deploy("bad2")
    proven(host, "v2")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v1"
    assert host.rollout().rollback().status == "deployed"
    proven(host, "v1")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v2"


def test_a_version_refused_by_its_benchmark_is_rolled_back_and_the_figures_follow_the_promoted_one(tmp_path):
    host = Host(tmp_path, refuses={"sha256:slow"})
    host.deploy("v1")
    assert host.record().last_ready.bench == {"figures": {"acceptance_length": 3.0}, "image": "sha256:v1"}
    refused = host.deploy("slow")
    assert refused.status == "rolled-back" and refused.changed
    assert refused.verdict["status"] == "FAILED" and refused.verdict["stage"] == "benchmark gate"
    assert "mean acceptance length fell from 3.00 to 1.10" in refused.message
    assert refused.gate["gate"]["passed"] is False
    assert host.gate.seen[-1] == ("sha256:slow", {"figures": {"acceptance_length": 3.0}, "image": "sha256:v1"})
    proven(host, "v1")
    assert host.docker.named(FAILED).image_id == "sha256:slow"
    # Restored, v1 keeps its figures: the next version is compared with them, not with nothing.
    assert host.record().last_ready.bench["image"] == "sha256:v1"
    assert host.deploy("v2").status == "deployed" and host.gate.seen[-1][1]["image"] == "sha256:v1"
    assert host.record().last_ready.bench["image"] == "sha256:v2"


def test_the_outgoing_version_is_measured_out_of_the_router_before_it_stops_and_the_new_one_judged_against_it(
    tmp_path,
):
    host = Host(tmp_path)
    host.deploy("v1")
    assert host.gate.measured == [] and host.gate.outgoings == [None]  # nothing ran before: nothing to measure
    host.deploy("v2")
    # v1, proven and still running, measured after it left the router; v2 judged against those figures.
    assert host.gate.measured == [
        ("sha256:v1", "running", {"figures": {"acceptance_length": 3.0}, "image": "sha256:v1"})
    ]
    assert host.gate.events == ["left the router", "measured sha256:v1"]
    assert host.gate.outgoings[-1] == {"figures": {"image": "sha256:v1"}}
    assert host.record().last_ready.bench["image"] == "sha256:v2"  # the record keeps the new one's own figures


def test_the_baseline_runs_the_new_image_without_speculation_once_between_the_old_and_the_new_engine(tmp_path):
    host = Host(tmp_path, baseline=True)
    host.watch.diagnostics = str(tmp_path / "run")
    host.deploy("v1")
    # Its start-up's run folder holds the sweep, so the report does not count it as a rollout.
    assert json.loads((tmp_path / "run" / "baseline.json").read_text())["sweep"][0]["output_tokens_per_s"] == 10.0
    # Measured with the old engine gone and the new not yet created: one engine on the GPUs at a time.
    assert host.gate.baselines == [(BASELINE, "sha256:v1", "running")] and host.docker.named(BASELINE) is None
    assert host.gate.judged_with[-1]["sweep"][0]["output_tokens_per_s"] == 10.0
    assert "measuring-baseline" in host.store.phases and len(host.record().baselines) == 1
    assert host.watch.watched[0] == (BASELINE, "sha256:v1")  # watched as a start-up like any other
    # A new image (a new drafter) of the same configuration, engine version and hardware: the kept baseline.
    same = host.rollout().deploy(dataclasses.replace(config("v1"), image="v2"), "sha256:v2", lambda: "warmed")
    assert same.status == "deployed"
    assert len(host.gate.baselines) == 1 and host.gate.judged_with[-1] == host.gate.judged_with[0]
    host.deploy("v3")  # another served model name: other flags, so another baseline
    assert [b[1] for b in host.gate.baselines] == ["sha256:v1", "sha256:v3"]
    events = host.gate.events
    assert events.index("left the router") < events.index("measured sha256:v1")


def test_auto_sweeps_each_draft_length_once_beside_the_baseline_and_starts_the_fastest_per_level(tmp_path):
    """issue 37: serving_speculative_schedule: auto. Length 0 is the baseline; lengths 1 and 2 are swept in
    their own containers (with the baseline's tokens per request), kept in the record; the new engine runs
    the fastest length at each level, its label the declared config's (a rerun is converged)."""
    host = Host(tmp_path, baseline=True)
    host.gate.base = {1: 10.0, 4: 32.0}
    host.gate.speeds = {1: {1: 13.0, 4: 30.0}, 2: {1: 15.0, 4: 25.0}}
    declared = dataclasses.replace(config("v1"), speculative_schedule="auto", num_speculative_tokens=2)
    outcome = host.rollout().deploy(declared, "sha256:v1", lambda: "warmed")
    assert outcome.status == "deployed"
    assert [e for e in host.gate.events if e.startswith("draft length")] == [
        f"draft length 1 {DRAFT_LENGTH} 32", f"draft length 2 {DRAFT_LENGTH} 32"]  # fmt: skip
    assert host.docker.named(DRAFT_LENGTH) is None and "measuring-draft-lengths" in host.store.phases
    made = {kwargs["name"]: kwargs for kwargs in host.docker.created}
    for name, length in ((DRAFT_LENGTH, 2),):  # the last length's container: that length at every batch size
        spec = json.loads(made[name]["command"][made[name]["command"].index("--speculative-config") + 1])
        assert spec["num_speculative_tokens"] == length and "num_speculative_tokens_per_batch_size" not in spec
    command = made[CONTAINER]["command"]
    spec = json.loads(command[command.index("--speculative-config") + 1])
    # 15 > 13 > 10 at 1 request: 2 drafts; 32 (speculation off) > 30 > 25 at 4: none.
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 4, 0]]
    assert made[CONTAINER]["labels"][CONFIG_LABEL] == declared.digest()
    chosen = host.gate.schedules[-1]
    assert chosen["schedule"] == "1-3:2,4-4:0" and chosen["drafts"] and chosen["speeds"]["0"] == {"1": 10.0, "4": 32.0}
    assert len(host.record().baselines) == 3  # the baseline and each length, each under its own key
    again = host.rollout().deploy(declared, "sha256:v1", lambda: "warmed")
    assert again.status == "unchanged"
    # A new image (a new drafter) measures its lengths again; the speculation-off baseline is kept.
    host.rollout().deploy(dataclasses.replace(declared, image="v2"), "sha256:v2", lambda: "warmed")
    assert len(host.gate.baselines) == 1 and len([e for e in host.gate.events if e.startswith("draft")]) == 4


def test_auto_where_no_length_pays_runs_no_drafter_at_all(tmp_path):
    """A 0 entry is not speculation off (docs/engine-facts.md): where 0 wins everywhere, no speculative config."""
    host = Host(tmp_path, baseline=True)
    host.gate.speeds = {1: {1: 9.0}}
    declared = dataclasses.replace(config("v1"), speculative_schedule="auto", num_speculative_tokens=1)
    assert host.rollout().deploy(declared, "sha256:v1", lambda: "warmed").status == "deployed"
    command = {kwargs["name"]: kwargs for kwargs in host.docker.created}[CONTAINER]["command"]
    assert "--speculative-config" not in command
    assert host.gate.schedules[-1]["drafts"] is False


def test_auto_that_cannot_choose_serves_its_one_length_and_says_why(tmp_path):
    host = Host(tmp_path, baseline=True)
    host.gate.speeds = {1: {1: 0.0}}  # no level measured (no request completed)
    declared = dataclasses.replace(config("v1"), speculative_schedule="auto", num_speculative_tokens=1)
    host.gate.base = {1: 0.0}
    assert host.rollout().deploy(declared, "sha256:v1", lambda: "warmed").status == "deployed"
    assert host.gate.schedules[-1]["note"] == "auto could not choose (nothing measured)"
    command = {kwargs["name"]: kwargs for kwargs in host.docker.created}[CONTAINER]["command"]
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens"] == 1


def test_a_failed_version_is_never_the_one_measured_the_restored_proven_one_is(tmp_path):
    host = Host(tmp_path, outcomes={"sha256:bad": "FAILED"})
    host.deploy("v1")
    host.deploy("bad")  # FAILED: v1 is back, proven
    host.deploy("v2")
    assert [m[0] for m in host.gate.measured] == ["sha256:v1", "sha256:v1"]


def test_a_running_but_unproven_engine_is_not_converged(tmp_path):
    """The SSH drop of issue 12: the new engine ran on, unwatched, restart policy `no`."""
    host = Host(tmp_path)
    host.deploy("v1")
    host.watch_raises(Interrupted("the play died with a raw transport error while watching"))
    with pytest.raises(Interrupted):
        host.deploy("v2")
    host.watch = FakeWatch(host.docker, {})
    assert host.serving() == ("sha256:v2", "running", "no")
    rerun = host.deploy("v2")
    assert rerun.status == "deployed" and rerun.changed and "resumed an interrupted rollout" in rerun.notes[0]
    proven(host, "v2")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v1"


@pytest.mark.parametrize("phase", RESUMABLE)
def test_every_phase_interrupted_then_the_rerun_ends_proven(tmp_path, phase):
    host = Host(tmp_path, baseline=phase == "measuring-baseline", auto=phase == "measuring-draft-lengths")
    host.deploy("v1")
    host.store.interrupt_at = phase
    if phase == "rolling-back":
        host.watch.outcomes["sha256:v2"] = "FAILED"
    with pytest.raises(Interrupted):
        host.deploy("v2")
    host.watch.outcomes.pop("sha256:v2", None)
    rerun = host.deploy("v2")
    assert rerun.changed and rerun.status == "deployed", (phase, rerun)  # never "unchanged" before a proof
    proven(host, "v2")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v1"


@pytest.mark.parametrize("phase", RESUMABLE)
def test_every_phase_interrupted_with_a_bad_version_restores_the_last_ready(tmp_path, phase):
    # Bad: FAILED by the watchdog, or READY and refused by its benchmark (the phase after the watch; and
    # auto's lengths: an image that never comes up has no baseline to choose against, so no lengths are swept).
    refused_only = phase in ("benchmarking", "measuring-draft-lengths")
    host = Host(tmp_path, {} if refused_only else {"sha256:bad": "FAILED"}, refuses={"sha256:bad"},
                baseline=phase == "measuring-baseline", auto=phase == "measuring-draft-lengths")  # fmt: skip
    host.deploy("v1")
    host.store.interrupt_at = phase
    with pytest.raises(Interrupted):
        host.deploy("bad")
    rerun = host.deploy("bad")
    assert rerun.status == "rolled-back", (phase, rerun)
    proven(host, "v1")


def test_dockerd_killed_during_the_watch_restores_the_last_ready(tmp_path):
    """Without live-restore every container stops: the new one is judged dead, v1 is started again."""
    host = Host(tmp_path)
    host.deploy("v1")

    crashed = []

    def watch_then_crash(name: str, stall_floor_s: float = 0.0):
        if not crashed:
            crashed.append(host.docker.crash_all())
        return FakeWatch(host.docker, {})(name, stall_floor_s)

    host.watch = watch_then_crash  # type: ignore[assignment]
    outcome = host.deploy("v2")
    assert outcome.status == "rolled-back", outcome
    proven(host, "v1")
    host.watch = FakeWatch(host.docker, {})
    rerun = host.deploy("v2")
    assert rerun.status == "deployed"
    proven(host, "v2")


def test_transport_errors_are_retried_and_each_step_is_idempotent(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    drop = requests.exceptions.ConnectionError("('Connection aborted.', OSError('Socket is closed'))")
    host.docker.fail = {"rename": [drop], "update": [drop], "create": [drop], "get": [drop, drop]}
    outcome = host.deploy("v2")
    assert outcome.status == "deployed"
    proven(host, "v2")
    assert not any(host.docker.fail.values())


def test_a_lost_watch_stops_the_rollout_where_it_is(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    host.watch_raises(SpecdeployError("lost contact with the engine's host: no contact for 130s"))
    rollout = host.rollout()
    with pytest.raises(SpecdeployError):
        rollout.deploy(config("v2"), "sha256:v2", lambda: "")
    assert rollout.began and host.record().phase == "watching"
    host.watch = FakeWatch(host.docker, {})
    assert host.deploy("v2").status == "deployed"
    proven(host, "v2")


def test_rollback_brings_back_the_previous_and_keeps_the_swapped_one(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    host.deploy("v2")
    outcome = host.rollout().rollback()
    assert outcome.status == "deployed"
    proven(host, "v1")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v2"


def test_a_rollback_that_does_not_come_up_puts_both_back(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    host.deploy("v2")
    host.watch.outcomes["sha256:v1"] = "FAILED"  # the previous version no longer starts
    outcome = host.rollout().rollback()
    assert outcome.status == "failed" and "did not come up" in outcome.notes[0]
    proven(host, "v2")
    assert host.docker.named(PREVIOUS).image_id == "sha256:v1"


def test_record_history_names_each_phase(tmp_path):
    host = Host(tmp_path)
    host.deploy("v1")
    assert host.store.phases == [
        "warming",
        "stopping-old",
        "starting-new",
        "watching",
        "benchmarking",
        "promoting",
        "done",
    ]


def test_removing_a_container_that_vanished_meanwhile_is_done_not_an_error():
    """Found by make test-faults: a rerun after a controller SIGKILL looked a container up, and it was
    gone when the removal reached dockerd (404). Removal is idempotent."""
    from docker.errors import NotFound  # noqa: PLC0415

    from specdeploy.serve import engine_host  # noqa: PLC0415

    class Vanishing:
        def remove(self, force: bool = False) -> None:
            raise NotFound("No such container: 6114630a7a5b")

    class Client:
        class containers:
            @staticmethod
            def get(name: str) -> Vanishing:
                return Vanishing()

    engine_host.remove_container(Client(), "specdeploy-engine-older")  # type: ignore[arg-type]
