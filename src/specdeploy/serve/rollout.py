"""Roll the engine container out on a host, and back when the new one does not come up.

A recorded state machine (rollout.json, specdeploy.records): warm the page cache while the old engine
serves; stop it (kept as `specdeploy-engine-previous` only if it was proven READY); start the new
one with restart policy `no`; watch it; READY: promote it (restart policy, recorded as the last READY
version); FAILED/STALLED: diagnostics saved, the failed container kept stopped as
`specdeploy-engine-failed`, the last READY version restarted and watched. A rerun resumes from the
record; converged means proven.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from docker.client import DockerClient
from docker.errors import APIError
from docker.models.containers import Container

from specdeploy import draft_schedule, names
from specdeploy.errors import SpecdeployError
from specdeploy.gate.benchmark import GateResult
from specdeploy.gate.rules import sweep_speeds
from specdeploy.proof import Proof
from specdeploy.records import (
    EngineRef,
    RecordStore,
    RolloutRecord,
    run_folder,
    write_baseline,
)
from specdeploy.serve.config import CONFIG_LABEL, CONTAINER, ServingConfig
from specdeploy.serve.engine_host import (
    FAILED,
    OLDER,
    PREVIOUS,
    RUNNING_POLICY,
    EngineHost,
    engine_ref,
    get_container,
    matches,
    save_diagnostics,
)
from specdeploy.transport import RECONNECT_GRACE_S
from specdeploy.watch.watchdog import Verdict

# The new image with speculation off, run once for the benchmark's baseline, then removed.
BASELINE = f"{CONTAINER}-baseline"
# serving_speculative_schedule: auto: the new image at one draft length, run once per length, then removed.
DRAFT_LENGTH = f"{CONTAINER}-draft-length"
REVIVE_STOP_S = 10  # a frozen engine never drains: its stop is a kill after this

Watcher = Callable[[str, float], Verdict]  # container name, the stall timeout's floor (s) -> verdict


class Gate(Protocol):
    """The benchmark gate (specdeploy.gate.benchmark.BenchmarkGate, as the serve action wraps it)."""

    def __call__(self, container: Container, verdict: dict[str, Any], kept: dict[str, Any] | None,
                 outgoing: dict[str, Any] | None, baseline: dict[str, Any] | None, *,
                 schedule: dict[str, Any] | None = None) -> GateResult:  # fmt: skip
        """The promotion decision on a READY container, judged against the outgoing version's figures
        when they were measured, else against the last promoted version's kept ones; its sweep
        divided by BASELINE's, when there is one. SCHEDULE: what `auto` chose and why, proven at every level."""
        ...

    def draft_length(self, container: Container, length: int, tokens: int) -> dict[str, Any]:
        """The sweep of a READY engine drafting LENGTH tokens at every batch size, TOKENS per request."""
        ...

    def outgoing(self, container: Container, kept: dict[str, Any] | None) -> dict[str, Any]:
        """The outgoing version's figures, measured once it has left the router, before it stops."""
        ...

    def baseline(self, container: Container, kept: dict[str, Any] | None) -> dict[str, Any]:
        """The sweep of a READY engine with speculation off."""
        ...

    def wants_baseline(self) -> bool:
        """Whether a speculation-off baseline is measured at all (serving_bench_baseline: once)."""
        ...

    def baseline_key(self, config_digest: str, engine_version: str) -> str:
        """Which baseline judges a configuration (its digest with speculation off) on this hardware."""
        ...


T = TypeVar("T")


def _draft_length(gate: Gate, length: int, tokens: int) -> Callable[[Container], dict[str, Any]]:
    """The measurement of one draft length, bound (a loop's lambda would see the last length)."""
    return lambda container: gate.draft_length(container, length, tokens)


@dataclass
class Outcome:
    changed: bool
    status: str  # unchanged | deployed | restarted | rolled-back | failed
    message: str
    image_id: str = ""
    previous_image_id: str | None = None
    warm: str = ""
    verdict: dict[str, Any] | None = None
    rollback_verdict: dict[str, Any] | None = None
    started_at: str = ""
    notes: list[str] = field(default_factory=list)
    gate: dict[str, Any] | None = None  # the benchmark gate's report (bench.json), when it ran


def is_converged(container: Container | None, cfg: ServingConfig, image_id: str) -> bool:
    """Running this configuration and image (proven or not: see is_proven)."""
    return container is not None and container.status == "running" and matches(container, cfg, image_id)


def proven_quiet_s(ref: EngineRef | None) -> float:
    """A floor for the stall timeout when a version proven READY is brought back: twice its
    longest start-up stage as recorded. A tight serving_stall_timeout must not judge the known-good
    version STALLED while it imports (a rollback that fails so leaves nothing serving); found by CI,
    where a restored engine printed its first line after 20 s under the stall test's 20 s timeout."""
    stages = (ref.startup if ref else None) or []
    return 2 * max((float(s.get("seconds") or 0) for s in stages), default=0.0)


def _bring_up(container: Container, watch: Watcher, diagnostics: Path, stall_floor_s: float = 0.0) -> Verdict:
    container.reload()  # a renamed container keeps its old name until reloaded
    if container.status != "running":
        try:
            container.start()
        except APIError as exc:  # e.g. a ulimit or device the host's engine refuses: no process at all
            folder = run_folder(diagnostics)
            return Verdict(
                status="FAILED",
                elapsed_s=0.0,
                stage="container start",
                diagnostics=str(folder),
                headline=f"docker could not start {container.name}: {exc.explanation or exc}",
            )
        container.reload()
    return watch(container.name, stall_floor_s)


def is_proven(container: Container | None, record: RolloutRecord) -> bool:
    """Converged means proven: running, recorded as READY, and given its restart policy."""
    return (
        container is not None
        and container.status == "running"
        and record.proves(str(container.id))
        and container.attrs.get("HostConfig", {}).get("RestartPolicy", {}).get("Name") == RUNNING_POLICY["Name"]
    )


class Rollout:
    """One rollout on one host, every step recorded before it is taken (see records.PHASES).

    Containers are addressed by id and fetched afresh for every operation, through `with_retries`:
    a dropped SSH connection or a restarting dockerd is reconnected with backoff for up to
    `grace_s`, and each operation is idempotent, so a retry after a lost reply does no harm.
    """

    def __init__(
        self,
        connect: Callable[[], DockerClient],
        store: RecordStore,
        watch: Watcher,
        diagnostics: Path,
        grace_s: float = RECONNECT_GRACE_S,
        *,
        before_stop: Callable[[], None] = lambda: None,
        gate: Gate | None = None,
        prove: Callable[[], Proof] | None = None,
    ) -> None:
        self.host = EngineHost(connect, store, grace_s)
        self.watch, self.diagnostics = watch, diagnostics
        self.before_stop, self.gate = before_stop, gate
        # The proof of serving (specdeploy.proof) on this host: a version proven READY that runs but does
        # not answer it is restarted, never called unchanged.
        self.prove = prove

    # What the host's steps keep: its Docker client, its record, whether a step was taken.
    @property
    def client(self) -> DockerClient:
        return self.host.client

    @property
    def record(self) -> RolloutRecord:
        return self.host.record

    @property
    def began(self) -> bool:
        return self.host.began

    def _bring_up(self, container_id: str, stall_floor_s: float = 0.0) -> Verdict:
        """Start it unless it runs, and watch it; the watch itself survives transport faults."""
        container = self.host.get(container_id)
        if container is None:
            raise SpecdeployError(f"the engine container {container_id[:12]} vanished during the rollout")
        return _bring_up(container, self.watch, self.diagnostics, stall_floor_s)

    # ------------------------------------------------------------------ the rollout

    def deploy(self, cfg: ServingConfig, image_id: str, warm: Callable[[], str]) -> Outcome:
        current = self.host.get(CONTAINER)
        if is_converged(current, cfg, image_id) and is_proven(current, self.record):
            assert current is not None
            proof = self.prove() if self.prove else None
            if proof is not None and not proof.serves:
                return self._revive(current, image_id, proof)
            said = f"; {proof.said}" if proof else ""
            return Outcome(
                False,
                "unchanged",
                f"the engine runs this image and configuration, proven READY: not restarted{said}",
                image_id=image_id,
                started_at=current.attrs["State"]["StartedAt"],
            )
        last_ready = self.record.last_ready.image_id if self.record.last_ready else None
        if current is not None and matches(current, cfg, image_id):
            # The version asked for is there but was never proven (an interrupted rollout): prove it.
            interrupted = self.record.phase
            outcome = self._prove(str(current.id), image_id, last_ready, warm_report="")
            outcome.notes.insert(0, f"resumed an interrupted rollout (it had stopped in phase '{interrupted}')")
            return outcome
        self.record.old = engine_ref(current) if current is not None else None
        self.record.new = None
        self.host.step("warming")
        warm_report = warm()  # while the old container still serves
        self.host.step("stopping-old")
        outgoing = None
        if current is not None:
            self.before_stop()  # a fleet host leaves the router: what it still serves are its last requests
            outgoing = self._measure_outgoing(current)
            self.host.stop(str(current.id), cfg.stop_timeout_s)
            self.host.retire(str(current.id))
        self.host.remove(CONTAINER)  # (a leftover of an interrupted run)
        baseline = self._baseline(cfg, image_id)
        cfg, schedule = self._schedule(cfg, image_id, baseline)
        self.host.step("starting-new")
        new = self.host.create(cfg, image_id)
        return self._prove(str(new.id), image_id, last_ready, warm_report, outgoing=outgoing, baseline=baseline,
                           schedule=schedule)  # fmt: skip

    def _revive(self, current: Container, image_id: str, proof: Proof) -> Outcome:
        """The proven version runs but does not answer (a frozen engine core, a stuck process): the same
        version restarted and watched to READY, or a failure that says what did not answer. A stopped
        (SIGSTOP) process ignores SIGTERM, so `docker stop` kills it after its timeout."""
        container_id = str(current.id)
        self.record.old = self.record.new = engine_ref(current)
        self.host.step("stopping-old")
        self.before_stop()  # a fleet host leaves the router first (the sentinel may have taken it out already)
        self.host.stop(container_id, REVIVE_STOP_S)
        self.host.step("watching")
        verdict = self._bring_up(container_id, proven_quiet_s(self.record.last_ready))
        started = self.host.retry(lambda: self.client.containers.get(container_id).attrs["State"]["StartedAt"])
        if verdict.status == "READY":
            self.host.promote(container_id, startup=verdict.startup)
            return Outcome(True, "restarted", f"the proven engine did not answer ({proof.said}): restarted the same "
                           f"version, {verdict.first_line()}", image_id=image_id, verdict=asdict(verdict),
                           started_at=started)  # fmt: skip
        self.host.retry(lambda: save_diagnostics(verdict, self.client.containers.get(container_id)))
        self.host.step("done")
        raise SpecdeployError(f"the engine did not answer ({proof.said}), and restarting the same proven version "
                              f"did not bring it back: {verdict.first_line()}",
                              hint=f"diagnostics: {verdict.diagnostics}")  # fmt: skip

    def _baseline(self, cfg: ServingConfig, image_id: str) -> dict[str, Any] | None:
        """The speculation-off sweep this configuration is judged against: the host's record of it, or
        measured now, once, while the host is out of service anyway (old engine stopped, new not
        started: one GPU set holds one engine), on the new image with the same flags but no drafter."""
        gate = self.gate
        if gate is None or not gate.wants_baseline():  # (it wants one only for a speculative engine)
            return None
        off = cfg.speculation_off()
        key = gate.baseline_key(cfg.baseline_digest(), self._engine_version(image_id))
        if key in self.record.baselines:
            return self.record.baselines[key]
        self.host.step("measuring-baseline")
        kept = self.record.last_ready.bench if self.record.last_ready else None
        measured, why = self._aside(off, image_id, BASELINE, lambda container: gate.baseline(container, kept))
        if measured and measured.get("sweep"):
            self.record.baselines[key] = measured
            return measured
        note = (measured or {}).get("note") or f"the speculation-off engine was not READY ({why})"
        return {"sweep": [], "note": note}

    def _aside(self, cfg: ServingConfig, image_id: str, name: str,
               measure: Callable[[Container], dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:  # fmt: skip
        """CFG started as NAME beside the rollout (the old engine stopped, the new not started: one GPU set
        holds one engine), MEASUREd once READY, then removed; its run folder keeps the measurement
        (baseline.json: a measurement, not a rollout). (what was measured or None, the verdict's line)."""
        self.host.remove(name)  # (a leftover of an interrupted run)
        kwargs = {**cfg.container_kwargs(image_id), "name": name}
        container = self.host.retry(lambda: self.client.containers.create(**kwargs))
        measured: dict[str, Any] | None = None
        verdict: Verdict | None = None
        try:
            verdict = self._bring_up(str(container.id))
            if verdict.status == "READY":
                measured = self.host.retry(lambda: measure(self.client.containers.get(str(container.id))))
        finally:
            self.host.remove(name)
        if verdict is not None and verdict.diagnostics:
            write_baseline(Path(verdict.diagnostics), measured or {"sweep": [], "verdict": verdict.first_line()})
        return measured, verdict.first_line() if verdict else "not started"

    def _schedule(self, cfg: ServingConfig, image_id: str,
                  baseline: dict[str, Any] | None) -> tuple[ServingConfig, dict[str, Any] | None]:  # fmt: skip
        """serving_speculative_schedule: auto: each draft length from 1 to serving_num_speculative_tokens
        swept once (kept in the host's record like the baseline, under its own key), beside the baseline
        (length 0); the fastest length at each level, each holding up to the next level (draft_schedule.choose).
        (CFG with the schedule it runs, the choice and the measurements behind it; None: not auto)."""
        gate = self.gate
        if gate is None or cfg.speculative_schedule != draft_schedule.AUTO or cfg.speculative_method != "eagle3":
            return cfg, None
        if not baseline or not baseline.get("sweep"):
            note = f"auto: no speculation-off baseline to choose against ({(baseline or {}).get('note')})"
            return cfg, {"schedule": "", "note": note}
        tokens = int(baseline["max_tokens"])
        version = self._engine_version(image_id)
        speeds, lengths = {0: sweep_speeds(baseline["sweep"])}, {}
        for length in range(1, cfg.num_speculative_tokens + 1):
            fixed = replace(cfg, speculative_schedule="", num_speculative_tokens=length)
            key = gate.baseline_key(f"{fixed.digest()} {image_id} {tokens}", version)
            measured = self.record.baselines.get(key)
            if measured is None:
                self.host.step("measuring-draft-lengths")
                measured, why = self._aside(fixed, image_id, DRAFT_LENGTH, _draft_length(gate, length, tokens))
                measured = measured or {"sweep": [], "note": f"draft length {length} was not READY ({why})"}
                if measured.get("sweep"):
                    self.record.baselines[key] = measured
            lengths[str(length)] = measured
            speeds[length] = sweep_speeds(measured.get("sweep") or [])
        try:
            choice = draft_schedule.chosen(speeds, cfg.max_running_requests or 0)
        except ValueError as exc:  # a level nothing measured: the one length, said
            return cfg, {"schedule": "", "note": f"auto could not choose ({exc})", "lengths": lengths}
        return replace(cfg, resolved_schedule=choice["schedule"]), {**choice, "lengths": lengths, "max_tokens": tokens}

    def _engine_version(self, image_id: str) -> str:
        labels = self.host.retry(lambda: self.client.images.get(image_id).labels) or {}
        return str(labels.get(names.ENGINE_VERSION_LABEL) or image_id)

    def _measure_outgoing(self, current: Container) -> dict[str, Any] | None:
        """The proven engine about to stop, measured with the gate's workload: the new one is judged
        against it, an A/B under the same conditions (None: no gate, or nothing proven to measure)."""
        gate, container_id = self.gate, str(current.id)
        if gate is None or not self.record.proves(container_id) or current.status != "running":
            return None
        kept = self.record.last_ready.bench if self.record.last_ready else None
        return self.host.retry(lambda: gate.outgoing(self.client.containers.get(container_id), kept))

    def _prove(self, new_id: str, image_id: str, previous: str | None, warm_report: str, *,
               outgoing: dict[str, Any] | None = None, baseline: dict[str, Any] | None = None,
               schedule: dict[str, Any] | None = None) -> Outcome:  # fmt: skip
        new = self.host.get(new_id)
        assert new is not None
        self.record.new = engine_ref(new)
        self.host.step("watching")
        verdict = self._bring_up(new_id)
        gate = self._benchmark(new_id, verdict, outgoing, baseline, schedule)
        if verdict.status == "READY" and (gate is None or gate.passed):
            self.host.promote(new_id, gate.kept if gate else None, verdict.startup)
            self.host.remove(OLDER)  # proven: -previous is the version before this one
            started = self.host.retry(lambda: self.client.containers.get(new_id).attrs["State"]["StartedAt"])
            outcome = Outcome(True, "deployed", verdict.first_line(), image_id=image_id, previous_image_id=previous,
                              warm=warm_report, verdict=asdict(verdict), started_at=started)  # fmt: skip
            if gate is not None:
                outcome.gate = gate.report
                outcome.notes.append(gate.message)
            return outcome
        if gate is not None:  # READY, and refused by its benchmark: a FAILED rollout like any other
            verdict = replace(verdict, status="FAILED", stage="benchmark gate", headline=gate.message)
        self.host.step("rolling-back")
        self.host.retry(lambda: save_diagnostics(verdict, self.client.containers.get(new_id)))
        self.host.stop(new_id, 10)
        self.host.rename(new_id, FAILED)  # kept, stopped, for `docker logs specdeploy-engine-failed`
        outcome = Outcome(True, "failed", verdict.first_line(), image_id=image_id, previous_image_id=previous,
                          warm=warm_report, verdict=asdict(verdict), gate=gate.report if gate else None)  # fmt: skip
        self._restore(outcome)
        return outcome

    def _benchmark(self, container_id: str, verdict: Verdict, outgoing: dict[str, Any] | None,
                   baseline: dict[str, Any] | None,
                   schedule: dict[str, Any] | None = None) -> GateResult | None:  # fmt: skip
        """The gate's decision on a READY engine (None: no gate, or not READY)."""
        if self.gate is None or verdict.status != "READY":
            return None
        self.host.step("benchmarking")
        kept = self.record.last_ready.bench if self.record.last_ready else None
        gate = self.gate

        def judge() -> GateResult:
            return gate(
                self.client.containers.get(container_id), asdict(verdict), kept, outgoing, baseline, schedule=schedule
            )

        return self.host.retry(judge)

    def _restore(self, outcome: Outcome) -> None:
        """Bring the last READY version back, wherever it is kept."""
        ready = self.record.last_ready
        container = self.host.get(ready.container_id) if ready else None
        if ready is None or container is None:
            outcome.notes.append("no version proven READY to roll back to: nothing serves")
            self.host.step("done")
            return
        self.host.rename(ready.container_id, CONTAINER)
        older = self.host.get(OLDER)
        if older is not None:
            self.host.rename(str(older.id), PREVIOUS)  # the version before the restored one, as it was
        back = self._bring_up(ready.container_id, proven_quiet_s(ready))
        outcome.rollback_verdict = asdict(back)
        if back.status == "READY":
            self.host.promote(ready.container_id)
            outcome.status = "rolled-back"
            outcome.notes.append(f"rolled back to the previous engine ({ready.image_id}): {back.first_line()}")
        else:
            self.host.step("done")
            outcome.notes.append(f"the previous engine did not come back either: {back.first_line()}")

    def rollback(self) -> Outcome:
        """`make rollback`: swap the running engine with the previous (proven) one; twice swaps back."""
        previous = self.host.get(PREVIOUS)
        if previous is None:
            raise SpecdeployError(f"there is no {PREVIOUS} container to roll back to", hint="deploy twice first")
        previous_id = str(previous.id)
        current = self.host.get(CONTAINER)
        current_id = str(current.id) if current is not None else None
        was_ready = current_id is not None and self.record.proves(current_id)
        self.record.old = engine_ref(current) if current is not None else None
        self.record.new = engine_ref(previous)
        self.host.step("stopping-old")
        if current_id is not None:
            self.before_stop()
            self.host.stop(current_id, 60)
            self.host.rename(current_id, f"{CONTAINER}-swapping")
        self.host.rename(previous_id, CONTAINER)
        self.host.step("watching")
        verdict = self._bring_up(previous_id)
        if verdict.status == "READY":
            self.host.promote(previous_id)
            if current_id is not None:  # -previous stays a proven version
                self.host.rename(current_id, PREVIOUS if was_ready else FAILED)
            status, notes = "deployed", []
            proof = self.prove() if self.prove else None  # as promoted, through the host's own proof
            if proof is not None:
                status = "deployed" if proof.serves else "failed"
                notes.append(f"proof of serving: {proof.said}")
        else:  # put both back as they were: the one that served serves again, if it was proven
            self.host.stop(previous_id, 10)
            self.host.rename(previous_id, PREVIOUS)
            status, notes = "failed", [f"{PREVIOUS} did not come up: {verdict.first_line()}"]
            if current_id is not None:
                self.host.rename(current_id, CONTAINER)
                if was_ready:
                    back = self._bring_up(current_id)
                    if back.status == "READY":
                        self.host.promote(current_id)
                    notes.append(f"the engine that served before: {back.first_line()}")
            if self.record.phase != "done":
                self.host.step("done")
        serving = self.host.get(CONTAINER)
        assert serving is not None
        return Outcome(True, status, verdict.first_line(), image_id=serving.attrs["Image"],
                       previous_image_id=current.attrs["Image"] if current else None, verdict=asdict(verdict),
                       started_at=serving.attrs["State"]["StartedAt"], notes=notes)  # fmt: skip


def status(client: DockerClient) -> dict[str, Any]:
    """The engine containers on a host: name, state, image, config digest, start time."""
    rows = {}
    for name in (CONTAINER, PREVIOUS, OLDER, FAILED):
        container = get_container(client, name)
        if container is None:
            continue
        state = container.attrs["State"]
        rows[name] = {
            "state": state["Status"],
            "exit_code": state.get("ExitCode"),
            "restarts": container.attrs.get("RestartCount", 0),
            "image": container.attrs["Image"],
            "tags": container.image.tags if container.image else [],
            "config": container.labels.get(CONFIG_LABEL),
            "started_at": state.get("StartedAt"),
        }
    return rows


def logs(client: DockerClient, name: str = CONTAINER, tail: int = 200) -> str:
    container = get_container(client, name)
    if container is None:
        raise SpecdeployError(f"no container {name} on this host", hint="deploy first: make deploy")
    return bytes(container.logs(tail=tail)).decode(errors="replace")
