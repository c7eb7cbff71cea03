"""One serve task, composed: the checks, the prewarm, the benchmark gate, the watch, the fleet's router
and the records around this host's rollout (serve.rollout), or around a multi-node group's
(serve.group) on its rank 0. The action plugin `specdeploy_serve` only validates its arguments and
hands over what Ansible has (Inventory): the composition lives here, where it is typed and tested.

The role's own knobs (the watch's timeouts, the state folder, the prewarm's bounds, the gate's
settings, the fleet worker URL) are not task arguments: the action reads VARIABLES, the serving_*
variables schema.py declares for them, from the task's variables. The API key is read apart, never
an argument, a result or a log line.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from specdeploy import draft_schedule
from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.fleet.membership import RouterMembership
from specdeploy.fleet.router_api import worker_url
from specdeploy.gate.benchmark import HARDWARE_PROBE, BenchmarkGate, hardware
from specdeploy.gate.rules import GateSettings, flag, measuring_starts
from specdeploy.records import HostRecords, host_runs
from specdeploy.serve import engine_cache
from specdeploy.serve.config import CONTAINER, ServingConfig
from specdeploy.serve.deploy_parts import Prewarm, SaidGate, image_id, result, serving
from specdeploy.serve.group import GroupRollout, GroupWatcher, Member
from specdeploy.serve.knob import UNSET
from specdeploy.serve.prewarm import prewarmer
from specdeploy.serve.ranks import problems as group_problems
from specdeploy.serve.ranks import ranks_of
from specdeploy.serve.rollout import BASELINE, DRAFT_LENGTH, Gate, Outcome, Rollout, Watcher
from specdeploy.serve.schema import BY_VARIABLE, KNOBS
from specdeploy.transport import is_transport_error, lost_contact
from specdeploy.watch.remote import watch_container_on_host, watch_group_on_hosts
from specdeploy.watch.watchdog import Verdict, WatchOptions

# The role's knobs the deploy reads: these by name, the prewarm's and the gate's by prefix, so that a
# new serving_bench_* or serving_prewarm_* knob reaches them as schema.py declares it.
_SINGLE = ("stall_timeout", "timeout", "reconnect_grace", "state_dir", "warm_page_cache", "fleet_worker")
_PREFIXES = ("prewarm_", "bench", "engine_cache")
VARIABLES: tuple[str, ...] = tuple(
    k.variable for k in KNOBS if not k.no_log and (k.name in _SINGLE or k.name.startswith(_PREFIXES))
)
# GateSettings.from_vars's words for the two gate knobs whose names say more (the rest: serving_bench_<word>).
_GATE_WORDS = {"bench": "enabled", "bench_budget_s": "budget"}
_DEFAULTS = {BY_VARIABLE[v].name: BY_VARIABLE[v].default for v in VARIABLES
             if BY_VARIABLE[v].default is not UNSET and not BY_VARIABLE[v].derived}  # fmt: skip
SERVES = ("deployed", "unchanged", "restarted", "rolled-back")  # a READY engine: back in the router


@dataclass(frozen=True)
class Settings:
    """The role's own serving knobs of a deploy, typed (each checked by its rule in the preflight)."""

    stall_timeout: float
    timeout: float
    reconnect_grace: float
    state_dir: str
    warm_page_cache: bool
    fleet_worker: str  # empty: from ansible_host and the engine's port
    prewarm: dict[str, Any]  # serve.prewarm.prewarmer's values
    bench: dict[str, Any]  # GateSettings.from_vars's values, and `enabled`
    engine_cache: dict[str, Any]  # serving_engine_cache (`enabled`), _keep, _max_gb

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Settings:
        """VALUES: {serving_*: value} as the task's variables hold them; one not there: the role's default."""
        given = {**_DEFAULTS, **{BY_VARIABLE[v].name: value for v, value in values.items() if v in VARIABLES}}
        prewarm = {name.removeprefix("prewarm_"): v for name, v in given.items() if name.startswith("prewarm_")}
        bench = {_GATE_WORDS.get(name, name.removeprefix("bench_")): v for name, v in given.items()
                 if name.startswith("bench")}  # fmt: skip
        cache = {name.removeprefix("engine_cache").lstrip("_") or "enabled": v for name, v in given.items()
                 if name.startswith("engine_cache")}  # fmt: skip
        return cls(float(given["stall_timeout"]), float(given["timeout"]), float(given["reconnect_grace"]),
                   str(given["state_dir"]), flag(given["warm_page_cache"]), str(given.get("fleet_worker") or ""),
                   prewarm, bench, cache)  # fmt: skip


def first_rollout_starts(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The engine starts the first rollout of VALUES' configuration (an inventory host's serving_* as
    Ansible resolves them; a knob not there: the role's default) makes on each host beside its own, for
    `specdeploy plan` (gate.rules.measuring_starts)."""

    def knob(variable: str) -> Any:
        return values.get(variable, BY_VARIABLE[variable].default)

    settings = Settings.from_values(values)
    starts = measuring_starts(GateSettings.from_vars(settings.bench), flag(settings.bench.get("enabled", False)),
                              str(knob("serving_speculative_method")) == "eagle3",
                              str(knob("serving_speculative_schedule")) == draft_schedule.AUTO,
                              int(knob("serving_num_speculative_tokens")))  # fmt: skip
    return tuple(starts)


class Inventory(Protocol):
    """What a deploy needs from Ansible (the serve action gives it; the unit tests, a fake)."""

    @property
    def host_name(self) -> str:
        """The task's inventory host."""
        ...

    @property
    def play_hosts(self) -> list[str]:
        """Every host of the play (ansible_play_hosts_all), whatever serve batch each is in."""
        ...

    @property
    def address(self) -> str:
        """The task's host as the router reaches it by default: ansible_host, else its name."""
        ...

    @property
    def connection(self) -> HostConnection:
        """The task's host: one connection for the whole task."""
        ...

    def connection_of(self, host: str) -> HostConnection:
        """Another inventory host (the router's, a group's rank), over SSH as Ansible has it."""
        ...

    def serving_config(self, host: str) -> dict[str, Any] | None:
        """HOST's serving_config as roles/serving composed it; None where it never was."""
        ...

    def api_key(self, host: str) -> str | None:
        """HOST's serving_api_key (ansible-vault); None when unset or empty."""
        ...

    def say(self, line: str) -> None:
        """One line in Ansible's output, while the task runs."""
        ...


def _no_watch(container: str, stall_floor_s: float = 0.0) -> Verdict:
    """A group's ranks are watched together (GroupRollout's watcher), never one by one."""
    raise SpecdeployError(f"{container}: a rank of a multi-node group is never watched alone")


class Deploy:
    """ARGS: the serve action's validated arguments (action, image, config, engine_image_profile,
    engine_image_drafter_path, router_host, router_port, sentinel_port)."""

    def __init__(self, inventory: Inventory, args: Mapping[str, Any], settings: Settings) -> None:
        self.inventory, self.args, self.settings = inventory, dict(args), settings
        self.say = inventory.say

    def run(self) -> dict[str, Any]:
        """The task's result: a failed one (with its reasons) when the checks refuse, else the rollout's."""
        cfg, ranks, problems = self.checked()
        if problems or ranks:
            return self.run_group(cfg, ranks) if not problems else {"failed": True, "msg": "; ".join(problems)}
        return self.run_one(cfg)

    # ------------------------------------------------------------------ checks

    def group(self) -> tuple[dict[str, int], list[str]]:
        """The hosts of this host's multi-node engine, {host: rank}, whatever serve batch each is in; and
        the play's hosts whose serving variables were never composed (failed before the rollout)."""
        configs = {h: self.inventory.serving_config(h) for h in self.inventory.play_hosts}
        return ranks_of(configs, self.args["config"]), [h for h, cfg in configs.items() if not cfg]

    def checked(self) -> tuple[ServingConfig, dict[str, int], list[str]]:
        """The configuration, its multi-node group ({host: rank}, empty for one host) and what is wrong."""
        key = self.inventory.api_key(self.inventory.host_name)
        cfg = ServingConfig.from_vars({**self.args["config"], "api_key": key})
        ranks, unchecked = self.group()
        problems = cfg.problems()
        if self.args["action"] == "deploy":  # a rollback runs no gate: its settings cannot refuse it
            settings = GateSettings.from_vars(self.settings.bench)
            problems += settings.problems()
            if cfg.speculative_schedule == draft_schedule.AUTO and cfg.speculative_method == "eagle3":
                problems += settings.auto_schedule_problems(flag(self.settings.bench.get("enabled", True)))
        problems += group_problems(ranks, cfg.nnodes, unchecked)
        return cfg, ranks, problems

    # ------------------------------------------------------------------ the parts

    def gate(self, cfg: ServingConfig) -> BenchmarkGate | None:
        if not flag(self.settings.bench.get("enabled", True)):
            return None
        settings = GateSettings.from_vars(self.settings.bench)
        probe = subprocess.run(self.inventory.connection.commands.command("sh", "-c", HARDWARE_PROBE),
                               capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
        return BenchmarkGate.for_engine(settings, cfg, hardware(probe.stdout))

    def recorded(self, cfg: ServingConfig, diagnostics: Path) -> Gate | None:
        """The gate of a deploy, saying what it does and keeping its report beside the watch's verdict.json."""
        gate = self.gate(cfg) if self.args["action"] == "deploy" else None
        if gate is None:
            return None
        return SaidGate(gate, self.say, cfg, diagnostics, host=self.inventory.host_name, image=self.args["image"])

    def membership(self, port: int) -> RouterMembership | None:
        if not self.args["router_host"]:
            return None
        worker = self.settings.fleet_worker or worker_url(self.inventory.address, port)
        return RouterMembership(self.inventory.connection_of(self.args["router_host"]), self.args["router_port"],
                                worker, self.say, self.args["sentinel_port"])  # fmt: skip

    def prewarm(self, conn: HostConnection, cfg: ServingConfig) -> Prewarm:
        warmer = prewarmer(conn.commands, cfg.model_path, self.settings.prewarm)
        return Prewarm(self.say, warmer, self.settings.warm_page_cache)

    def cached(self, conn: HostConnection, cfg: ServingConfig, image: str) -> ServingConfig:
        """CFG with this image's engine cache on the host (specdeploy.serve.engine_cache), said; as it was
        when serving_engine_cache is off."""
        cache = self.settings.engine_cache
        if not flag(cache.get("enabled", True)):
            return cfg
        prepared = engine_cache.prepare(conn.commands, self.settings.state_dir, cfg.engine, image,
                                        keep=int(cache.get("keep", engine_cache.KEEP)),
                                        max_gb=float(cache.get("max_gb", engine_cache.MAX_GB)))  # fmt: skip
        self.say(prepared.says())
        return replace(cfg, cache_dir=prepared.path)

    def watcher(self, cfg: ServingConfig, diagnostics: Path) -> Watcher:
        """This host's watch of a container to its verdict, each stage said; LOST stops the rollout."""
        conn, settings = self.inventory.connection, self.settings

        def watch(container: str, stall_floor_s: float = 0.0) -> Verdict:
            stall = max(settings.stall_timeout, stall_floor_s)
            why = " (the proven version's: twice its longest recorded stage)" if stall > settings.stall_timeout else ""
            self.say(f"watching {container} (stall timeout {stall:.0f} s{why})")
            options = WatchOptions(
                url=None,
                model=cfg.served_model_name,
                # The READY completion is one request: drafts are counted where one request drafts. The
                # baseline runs with speculation off; auto's draft lengths draft at every batch size.
                speculative=container == DRAFT_LENGTH or (container != BASELINE and cfg.drafts_within(1)),
                stall_timeout_s=stall,
                timeout_s=settings.timeout,
                api_key=cfg.api_key,
                diagnostics=diagnostics,
                progress=False,
                # Stage, elapsed, ETA and GPU memory while a long load runs: never a silent wait.
                on_progress=lambda line: self.say(f"{container}: {line}"),
            )
            verdict = watch_container_on_host(conn, container, cfg.port, options, settings.reconnect_grace)
            for note in verdict.notes:
                self.say(f"{container}: {note}")
            self.say(f"{container}: {verdict.first_line()}")
            if verdict.status == "LOST":  # not a verdict on the engine: the rollout stops where it is
                raise SpecdeployError(verdict.headline)
            return verdict

        return watch

    # ------------------------------------------------------------------ one host

    def run_one(self, cfg: ServingConfig) -> dict[str, Any]:
        args, inventory = self.args, self.inventory
        conn, grace = inventory.connection, self.settings.reconnect_grace
        diagnostics = host_runs(inventory.host_name)
        watch = self.watcher(cfg, diagnostics)
        warm = self.prewarm(conn, cfg)
        grace_note = f"contact lost for more than {grace:.0f} s (serving_reconnect_grace)"
        rollout: Rollout | None = None
        fleet = self.membership(cfg.port)
        joined = False
        try:
            store = HostRecords(conn.commands, self.settings.state_dir)
            leave = fleet.leave if fleet is not None else lambda: None
            if fleet is not None:
                fleet.hold()
            rollout = Rollout(conn.reconnect_docker, store, watch, diagnostics, grace, before_stop=leave,
                              gate=self.recorded(cfg, diagnostics),
                              prove=lambda: conn.commands.prove_serving(state_dir=self.settings.state_dir))  # fmt: skip
            if args["action"] == "rollback":
                outcome = rollout.rollback()
            else:
                if not args["image"]:
                    raise SpecdeployError("specdeploy_serve: action=deploy needs image")
                image = image_id(rollout, args["image"], str(conn))
                outcome = rollout.deploy(self.cached(conn, cfg, image), image, warm)
                warm.keep(outcome.verdict)
            if outcome.status in ("deployed", "restarted"):  # promoted: it serves, router or not
                store.record_serving(serving(outcome, args, bool(inventory.api_key(inventory.host_name))))
            # Back in the router only on a READY engine: the new version, or the previous one restored.
            if fleet is not None and outcome.status in SERVES:
                joined = fleet.join()
        except SpecdeployError as exc:
            return {"failed": True, "changed": bool(rollout and rollout.began), "msg": str(exc)}
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            state = rollout.record.describe() if rollout is not None else "no rollout began"
            error = lost_contact(str(conn), "rolling the engine out", exc, state,
                                 hint=f"{grace_note}; when {conn.target.host} answers again: make status "
                                      "(what runs there), then make deploy (it resumes the rollout)")  # fmt: skip
            return {"failed": True, "changed": bool(rollout and rollout.began), "msg": str(error)}
        predicted = int(args.get("predicted_kv_capacity") or 0)
        return {**result(outcome, joined, predicted), "prewarm": warm.report.as_dict() if warm.report else None}

    # ------------------------------------------------------------------ a multi-node group

    def member(self, host: str, rank: int) -> tuple[Member, HostConnection, dict[str, Any]]:
        """One rank of the group: its host's connection (as Ansible has it), records and configuration."""
        inventory, mine = self.inventory, host == self.inventory.host_name
        conn = inventory.connection if mine else inventory.connection_of(host)
        raw = self.args["config"] if mine else dict(inventory.serving_config(host) or {})  # (ranks_of: composed)
        rollout = Rollout(conn.reconnect_docker, HostRecords(conn.commands, self.settings.state_dir), _no_watch,
                          host_runs(host), self.settings.reconnect_grace)  # fmt: skip
        image = image_id(rollout, self.args["image"], host)
        cfg = self.cached(conn, ServingConfig.from_vars({**raw, "api_key": inventory.api_key(host)}), image)
        return Member(rank, host, rollout, cfg, image), conn, raw

    def group_watch(self, cfg: ServingConfig, conns: list[tuple[int, str, HostConnection]]) -> GroupWatcher:
        settings = self.settings

        def watch(stall_floor_s: float, replicas: int) -> Verdict:
            stall = max(settings.stall_timeout, stall_floor_s)
            self.say(f"watching the {len(conns)} ranks of {CONTAINER} on {', '.join(h for _, h, _ in conns)} "
                     f"(stall timeout {stall:.0f} s)")  # fmt: skip
            options = WatchOptions(url=None, model=cfg.served_model_name, stall_timeout_s=stall,
                                   speculative=cfg.drafts_within(1), timeout_s=settings.timeout,
                                   api_key=cfg.api_key,
                                   diagnostics=host_runs(self.inventory.host_name), progress=False,
                                   data_parallel_ranks=replicas,
                                   on_progress=lambda line: self.say(f"group: {line}"))  # fmt: skip
            verdict = watch_group_on_hosts(conns, CONTAINER, cfg.port, options, settings.reconnect_grace)
            for line in [*verdict.notes, verdict.first_line()]:
                self.say(f"group: {line}")
            if verdict.status == "LOST":
                raise SpecdeployError(verdict.headline)
            return verdict

        return watch

    def run_group(self, cfg: ServingConfig, ranks: dict[str, int]) -> dict[str, Any]:
        """A multi-node engine (specdeploy.serve.group): rank 0's task rolls every rank out, the
        others' tasks say so and change nothing."""
        args = self.args
        head = next(host for host, rank in ranks.items() if rank == 0)
        if cfg.node_rank != 0:
            msg = f"rank {cfg.node_rank} of {cfg.nnodes}: rolled out, watched and rolled back with its group by {head}"
            return {**result(Outcome(False, "unchanged", msg), False), "prewarm": None}
        if args["action"] == "rollback":
            raise SpecdeployError(
                "make rollback swaps one host's engine; a multi-node group rolls back as one when a rollout fails",
                hint="make deploy with the previous image (-e serving_image=...)",
            )
        built = [self.member(host, rank) for host, rank in sorted(ranks.items(), key=lambda item: item[1])]
        members = [m for m, _, _ in built]
        warms = {m.rank: self.prewarm(conn, m.cfg) for m, conn, _ in built}
        fleet = self.membership(cfg.port)
        group = GroupRollout(members, self.group_watch(cfg, [(m.rank, m.host, c) for m, c, _ in built]),
                             before_stop=fleet.leave if fleet is not None else lambda: None)  # fmt: skip
        joined = False
        try:
            if fleet is not None:
                fleet.hold()
            if flag(self.settings.bench.get("enabled", False)):
                self.say("benchmark gate: not run on a multi-node group (it measures one host's engine)")
            outcome = group.deploy(lambda m: warms[m.rank]())
            warms[0].keep(outcome.verdict)
            for m, _, raw in built if outcome.status == "deployed" else []:
                store: Any = m.rollout.host.store  # (HostRecords: the host types it as the RecordStore it uses)
                old = m.rollout.record.old
                mine = replace(outcome, image_id=m.image_id, previous_image_id=old.image_id if old else None)
                store.record_serving(serving(mine, {**args, "config": raw}, bool(m.cfg.api_key)))
            joined = fleet is not None and outcome.status in SERVES and fleet.join()
        except SpecdeployError as exc:
            return {"failed": True, "changed": group.began, "msg": str(exc)}
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            state = "; ".join(f"{m.name}: {m.rollout.record.describe()}" for m in members)
            error = lost_contact(
                ", ".join(ranks),
                "rolling the multi-node engine out",
                exc,
                state,
                hint="when every host answers again: make status, then make deploy (it resumes)",
            )
            return {"failed": True, "changed": group.began, "msg": str(error)}
        predicted = int(self.args.get("predicted_kv_capacity") or 0)  # rank 0's figure: its log is the verdict's
        return {**result(outcome, joined, predicted), "prewarm": None, "ranks": ranks,
                "data_parallel": group.serves_replicas()}  # fmt: skip


def run(inventory: Inventory, args: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The serve task's result: ARGS its arguments, VALUES the task's VARIABLES ({serving_*: value})."""
    return Deploy(inventory, args, Settings.from_values(values)).run()
