"""One engine over several hosts, rolled out as one unit (serving_nnodes > 1).

The ranks of a multi-node engine live and die together: rank 0 serves the API, the others run
headless and have none, and neither notices the other's death on its own (a headless rank killed
leaves rank 0's requests hanging; rank 0 killed leaves the headless ones waiting, silent). So the
group is rolled out as one: each rank's host keeps its own rollout.json (specdeploy.serve.rollout's
record and container names), and this module takes every step on every rank before the next:
warm, stop (rank 0 first: it holds the API), retire, create; start the headless ranks, then rank 0;
one watch over all of them (specdeploy.watch.group): READY only when rank 0 answers a real
completion on every data-parallel rank and every rank is alive. FAILED or STALLED names the rank
and host, and every rank goes back to its last READY version together; if that fails too, every
rank is stopped, so nothing is left running headless. A rerun resumes: a group whose containers are
all this version but unproven is proven; one where any rank restarted since its proof is restarted
as a whole (a rank that came back alone never rejoins its group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from docker.errors import APIError

from specdeploy.errors import SpecdeployError
from specdeploy.records import run_folder
from specdeploy.serve.config import CONTAINER, DP_RANKS_LABEL, ServingConfig
from specdeploy.serve.engine_host import FAILED, OLDER, PREVIOUS, engine_ref, matches, save_diagnostics
from specdeploy.serve.rollout import Outcome, Rollout, is_converged, is_proven, proven_quiet_s
from specdeploy.watch.watchdog import Verdict

# (the stall timeout's floor in s, the data-parallel replicas to prove) -> the group's verdict on CONTAINER
GroupWatcher = Callable[[float, int], Verdict]


@dataclass(frozen=True)
class Member:
    """One rank: its host's name, its rollout (connection, record store), its configuration, and the
    engine image's id on its host (an image built on each host has an id of its own)."""

    rank: int
    host: str
    rollout: Rollout
    cfg: ServingConfig
    image_id: str

    @property
    def name(self) -> str:
        return f"rank {self.rank} on {self.host}"


class GroupRollout:
    def __init__(self, members: list[Member], watch: GroupWatcher, *,
                 before_stop: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.members = sorted(members, key=lambda m: m.rank)
        if [m.rank for m in self.members] != list(range(len(self.members))):
            raise SpecdeployError(f"a group needs ranks 0..{len(self.members) - 1}, has {[m.rank for m in members]}")
        self.watch, self.before_stop = watch, before_stop

    @property
    def began(self) -> bool:
        return any(m.rollout.began for m in self.members)

    def _step(self, phase: str) -> None:
        for m in self.members:
            m.rollout.host.step(phase)

    def _restarted_since_proof(self, member: Member) -> bool:
        ref = member.rollout.record.last_ready
        current = member.rollout.host.get(CONTAINER)
        return bool(ref and ref.started_at and current and current.attrs["State"]["StartedAt"] != ref.started_at)

    def serves_replicas(self) -> bool:
        """Whether the version rank 0 runs now is data-parallel replicas (the sentinel probes each)."""
        head = self.members[0].rollout.host.get(CONTAINER)
        return head is not None and int(head.labels.get(DP_RANKS_LABEL) or 1) > 1

    # ------------------------------------------------------------------ deploy

    def deploy(self, warm: Callable[[Member], str]) -> Outcome:
        image_id = self.members[0].image_id
        current = {m.rank: m.rollout.host.get(CONTAINER) for m in self.members}
        matching = [(c := current[m.rank]) is not None and matches(c, m.cfg, m.image_id) for m in self.members]
        proven = [is_converged(current[m.rank], m.cfg, m.image_id) and is_proven(current[m.rank], m.rollout.record)
                  and not self._restarted_since_proof(m) for m in self.members]  # fmt: skip
        last_ready = self.members[0].rollout.record.last_ready
        previous = last_ready.image_id if last_ready else None
        if all(proven):
            started = current[0].attrs["State"]["StartedAt"] if current[0] is not None else ""
            return Outcome(False, "unchanged", f"the engine's {len(self.members)} ranks run this image and "
                           "configuration, proven READY together: not restarted", image_id=image_id,
                           started_at=started)  # fmt: skip
        if all(matching):  # this version on every rank, unproven (an interrupted rollout) or a rank came back alone
            why = [f"{m.name} restarted since its proof" for m in self.members if self._restarted_since_proof(m)]
            self.before_stop()  # (a group a rank left serves no longer: out of the router while it restarts)
            for m in self.members:
                self._stop_quietly(m, str(current[m.rank].id))  # type: ignore[union-attr]
            outcome = self._prove(image_id, previous, "")
            outcome.notes.insert(0, "; ".join(why) or f"resumed an interrupted rollout (phase "
                                 f"'{self.members[0].rollout.record.phase}')")  # fmt: skip
            return outcome
        for m in self.members:
            c = current[m.rank]
            m.rollout.record.old, m.rollout.record.new = (engine_ref(c) if c is not None else None), None
        self._step("warming")
        reports = [f"{m.host}: {warm(m)}" for m in self.members]
        self._step("stopping-old")
        if current[0] is not None:
            self.before_stop()  # the group leaves the router as one worker (rank 0's URL)
        for m in self.members:  # rank 0 first: it holds the API
            c = current[m.rank]
            if c is not None:
                m.rollout.host.stop(str(c.id), m.cfg.stop_timeout_s)
                m.rollout.host.retire(str(c.id))
            m.rollout.host.remove(CONTAINER)
        self._step("starting-new")
        for m in self.members:
            m.rollout.host.create(m.cfg, m.image_id)
        return self._prove(image_id, previous, "; ".join(reports))

    def _stop_quietly(self, member: Member, container_id: str) -> None:
        member.rollout.host.stop(container_id, 10)

    def _prove(self, image_id: str, previous: str | None, warm_report: str) -> Outcome:
        ids = {}
        for m in self.members:
            new = m.rollout.host.get(CONTAINER)
            if new is None:
                raise SpecdeployError(f"the engine container vanished from {m.name} during the rollout")
            ids[m.rank] = str(new.id)
            m.rollout.record.new = engine_ref(new)
        self._step("watching")
        verdict = self._bring_up(ids, 0.0)
        if verdict.status == "READY":
            self._promote(ids)
            for m in self.members:
                m.rollout.host.remove(OLDER)
            started = str(
                self.members[0].rollout.host.retry(
                    lambda: self.members[0].rollout.client.containers.get(ids[0]).attrs["State"]["StartedAt"]
                )
            )
            return Outcome(True, "deployed", verdict.first_line(), image_id=image_id, previous_image_id=previous,
                           warm=warm_report, verdict=asdict(verdict), started_at=started)  # fmt: skip
        self._step("rolling-back")
        for m in self.members:
            container_id = ids[m.rank]
            self._save(m, verdict, container_id)
            m.rollout.host.stop(container_id, 10)
            m.rollout.host.rename(container_id, FAILED)  # kept, stopped, for `docker logs specdeploy-engine-failed`
        outcome = Outcome(True, "failed", verdict.first_line(), image_id=image_id, previous_image_id=previous,
                          warm=warm_report, verdict=asdict(verdict))  # fmt: skip
        self._restore(outcome)
        return outcome

    @staticmethod
    def _save(member: Member, verdict: Verdict, container_id: str) -> None:
        """The rank's container as it failed, beside the group's verdict."""
        rollout = member.rollout
        rollout.host.retry(lambda: save_diagnostics(verdict, rollout.client.containers.get(container_id)))

    def _bring_up(self, ids: dict[int, str], stall_floor_s: float) -> Verdict:
        """The headless ranks first (they wait for rank 0), then rank 0; then one watch over all."""
        for m in [*self.members[1:], self.members[0]]:
            container = m.rollout.host.get(ids[m.rank])
            if container is None:
                raise SpecdeployError(f"the engine container {ids[m.rank][:12]} vanished from {m.name}")
            container.reload()
            if container.status == "running":
                continue
            try:
                container.start()
            except APIError as exc:  # e.g. a device the host's engine refuses: no process at all
                for started in self.members:
                    if started.rank != m.rank:
                        self._stop_quietly(started, ids[started.rank])
                return Verdict(status="FAILED", elapsed_s=0.0, stage="container start",
                               diagnostics=str(run_folder(m.rollout.diagnostics)),
                               headline=f"{m.name}: docker could not start {container.name}: "
                                        f"{exc.explanation or exc}")  # fmt: skip
        head = self.members[0].rollout.host.get(ids[0])
        replicas = int((head.labels if head is not None else {}).get(DP_RANKS_LABEL) or 1)
        return self.watch(stall_floor_s, replicas)

    def _promote(self, ids: dict[int, str]) -> None:
        for m in self.members:
            m.rollout.host.promote(ids[m.rank])
            ref = m.rollout.record.last_ready
            container = m.rollout.host.get(ids[m.rank])
            if ref is not None and container is not None:  # a rank that restarts alone is no longer proven
                m.rollout.record.last_ready = replace(ref, started_at=str(container.attrs["State"]["StartedAt"]))
                m.rollout.host.step("done")

    def _restore(self, outcome: Outcome) -> None:
        """Every rank back to its last READY version, together; else every rank stopped."""
        kept = {m.rank: m.rollout.record.last_ready for m in self.members}
        ids = {rank: ref.container_id for rank, ref in kept.items() if ref is not None}
        lacking = [m.name for m in self.members if m.rank not in ids or m.rollout.host.get(ids[m.rank]) is None]
        if lacking:
            outcome.notes.append(f"no version proven READY to roll back to on {', '.join(lacking)}: nothing serves")
            self._step("done")
            return
        for m in self.members:
            m.rollout.host.rename(ids[m.rank], CONTAINER)
            older = m.rollout.host.get(OLDER)
            if older is not None:
                m.rollout.host.rename(str(older.id), PREVIOUS)
        floor = max(proven_quiet_s(kept[m.rank]) for m in self.members)
        back = self._bring_up(ids, floor)
        outcome.rollback_verdict = asdict(back)
        if back.status == "READY":
            self._promote(ids)
            outcome.status = "rolled-back"
            image = kept[0].image_id if kept[0] else "?"
            outcome.notes.append(f"rolled every rank back to the previous engine ({image}): {back.first_line()}")
            return
        for m in self.members:  # nothing left running headless, waiting for a rank 0 that is not coming
            self._stop_quietly(m, ids[m.rank])
        self._step("done")
        outcome.notes.append(f"the previous engine did not come back either (every rank stopped): {back.first_line()}")
