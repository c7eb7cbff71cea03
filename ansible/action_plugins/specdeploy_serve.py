"""Action `specdeploy_serve`: roll the engine container out (or back) on the target, watched to READY.

`action: deploy` warms the page cache with the model while the old engine still serves, stops it, starts
`image` with `config` and watches the start-up to READY (stage, elapsed time, ETA); when `bench` asks, the
benchmark gate measures the READY engine before it is promoted. A FAILED or STALLED start-up, or a refused
gate, rolls back to the last version proven READY. A rerun with this image and configuration, proven
READY, restarts nothing; an interrupted rollout resumes. `action: rollback` swaps the running engine with
the previous one, watched the same way. In a fleet (`router_host`), the engine leaves the router before it
stops and joins it again once READY. The outcome is recorded on the host (`current.json` and
`rollout.json` in `state_dir`) and in the controller's run folder. Thin: the logic is in specdeploy.serve.

Notes:
- Secrets: the engine's API key is never an argument. The action reads the `serving_api_key` variable
  (keep it in ansible-vault) itself, so the key appears in no task argument, result or log line; `config`
  never holds it (roles/serving leaves every secret out).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

from specdeploy import names
from specdeploy.actions import SpecdeployAction
from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.fleet.membership import RouterMembership
from specdeploy.fleet.router_api import SENTINEL_PORT, worker_url
from specdeploy.gate import client
from specdeploy.gate.benchmark import HARDWARE_PROBE, BenchmarkGate, GateResult, hardware
from specdeploy.gate.rules import GateSettings, flag
from specdeploy.record_types import Figures, PrewarmReport
from specdeploy.records import STATE_DIR, HostRecords, Serving, host_runs, write_bench, write_prewarm
from specdeploy.serve import rollout as rollouts
from specdeploy.serve.config import CONTAINER, ServingConfig
from specdeploy.serve.group import GroupRollout, Member
from specdeploy.serve.prewarm import Prewarmer, prewarmer
from specdeploy.serve.ranks import problems as group_problems
from specdeploy.serve.ranks import ranks_of
from specdeploy.serve.rollout import Gate, Rollout
from specdeploy.targets import CONNECTION_VARS
from specdeploy.transport import RECONNECT_GRACE_S, is_transport_error, lost_contact
from specdeploy.watch import startup
from specdeploy.watch.remote import watch_container_on_host, watch_group_on_hosts
from specdeploy.watch.watchdog import Verdict, WatchOptions


def result(outcome: rollouts.Outcome, joined: bool) -> dict[str, Any]:
    """The task's result: the outcome, its one-line message, and the start-up table to print."""
    failed = outcome.status not in ("deployed", "unchanged")
    message = outcome.message if not outcome.notes else f"{outcome.message} | {' | '.join(outcome.notes)}"
    verdict = outcome.verdict or {}
    table = startup.render(verdict["startup"], verdict["status"]) if verdict.get("startup") else []
    return {**asdict(outcome), "changed": outcome.changed or joined, "failed": failed, "msg": message,
            "joined_router": joined, "startup_table": table}  # fmt: skip


def serving(outcome: rollouts.Outcome, args: dict[str, Any], api_key_set: bool) -> Serving:
    """current.json after a promotion; a rollback names the image by its id (it has no tag of its own)."""
    return Serving(args["image"] if args["action"] == "deploy" else outcome.image_id, outcome.image_id,
                   outcome.previous_image_id, {**args["config"], "api_key_set": api_key_set}, outcome.started_at,
                   args["engine_image_profile"], args["engine_image_drafter_path"])  # fmt: skip


class Prewarm:
    """The rollout's `warm` step (run while the old engine serves); its report is kept beside the
    verdict of the start-up it was for."""

    def __init__(self, action: SpecdeployAction, prewarmer: Prewarmer, enabled: bool) -> None:
        self.action, self.prewarmer, self.enabled = action, prewarmer, enabled
        self.report: PrewarmReport | None = None

    def __call__(self) -> str:
        if not self.enabled:
            return "page cache not warmed (serving_warm_page_cache: false)"
        self.report = self.prewarmer.warm()
        self.action.say(self.report.message)
        return self.report.message

    def keep(self, verdict: dict[str, Any] | None) -> None:
        folder = (verdict or {}).get("diagnostics")
        if self.report is not None and folder:
            write_prewarm(Path(folder), self.report)


def _sweep_line(sweep: list[dict[str, Any]]) -> str:
    """`1: 12.3 tok/s, 4: 40.1 tok/s` (a level the client could not finish: its error)."""
    return ", ".join(f"{p['concurrency']}: {p['output_tokens_per_s']:.1f} tok/s" if "output_tokens_per_s" in p
                     else f"{p['concurrency']}: {p.get('error', '?')[:80]}" for p in sweep)  # fmt: skip


class _SaidGate:
    """The benchmark gate as the rollout calls it: each measurement said, each report kept (bench.json)."""

    def __init__(self, gate: BenchmarkGate, action: ActionModule, cfg: ServingConfig, args: dict[str, Any],
                 diagnostics: Path) -> None:  # fmt: skip
        self.gate, self.action, self.cfg, self.args, self.diagnostics = gate, action, cfg, args, diagnostics

    def outgoing(self, container: Any, kept: dict[str, Any] | None) -> dict[str, Any]:
        self.action.say(f"benchmark gate: measuring the outgoing {container.name} before it stops (an A/B)")
        measured = self.gate.outgoing(container, kept)
        figures = measured.get("figures")
        self.action.say(f"benchmark gate: outgoing {Figures.from_dict(figures).summary()}" if figures
                        else f"benchmark gate: {measured.get('note')}")  # fmt: skip
        return measured

    def wants_baseline(self) -> bool:
        return self.gate.wants_baseline()

    def baseline_key(self, config_digest: str, engine_version: str) -> str:
        return self.gate.baseline_key(config_digest, engine_version)

    def baseline(self, container: Any, kept: dict[str, Any] | None) -> dict[str, Any]:
        levels = ", ".join(str(c) for c in self.gate.settings.sweep)
        self.action.say(f"benchmark gate: the speculation-off baseline in {container.name} at {levels} concurrent "
                        "requests (once for this configuration, engine version and hardware)")  # fmt: skip
        measured = self.gate.baseline(container, kept)
        self.action.say(f"benchmark gate: baseline {_sweep_line(measured.get('sweep') or [])}"
                        if measured.get("sweep") else f"benchmark gate: {measured.get('note')}")  # fmt: skip
        return measured

    def __call__(self, container: Any, verdict: dict[str, Any], kept: dict[str, Any] | None,
                 outgoing: dict[str, Any] | None, baseline: dict[str, Any] | None) -> GateResult:  # fmt: skip
        gate = self.gate
        self.action.say(f"benchmark gate: {client.name(gate.engine)} in {container.name} (budget "
                        f"{gate.settings.budget_s:.0f} s, on {gate.hardware})")  # fmt: skip
        result = gate(container, verdict, kept, outgoing, baseline)
        if result.report.get("sweep"):
            self.action.say(f"benchmark gate: sweep {_sweep_line(result.report['sweep'])}")
        self.action.say(result.message)
        folder = Path(str(verdict.get("diagnostics") or self.diagnostics))
        write_bench(folder, result.report, self.action.host_name, self.args["image"],
                    image_id=str(container.attrs.get("Image", "")), config_digest=self.cfg.digest())  # fmt: skip
        return result


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "action": {
            "type": "str",
            "choices": ["deploy", "rollback"],
            "default": "deploy",
            "description": "`deploy` rolls `image` out; `rollback` swaps the running engine with the previous one.",
        },
        "image": {
            "type": "str",
            "description": "The engine image to deploy, by tag: needed by `action: deploy`; it must be on the "
            "target already (the engine image phase builds it).",
        },
        "config": {
            "type": "dict",
            "default": {},
            "description": "The engine's serving configuration, ServingConfig's fields (roles/serving's "
            "`serving_config`, from its `serving_*` variables); checked before anything changes.",
        },
        "stall_timeout": {
            "type": "float",
            "default": 300.0,
            "description": "Seconds without start-up progress before the engine is judged STALLED "
            "(`serving_stall_timeout`); raised to twice the proven version's longest recorded stage.",
        },
        "timeout": {
            "type": "float",
            "default": 3600.0,
            "description": "Seconds before the start-up is abandoned (`serving_timeout`).",
        },
        "warm_page_cache": {
            "type": "bool",
            "default": True,
            "description": "Warm the page cache with the model's files while the old engine still serves "
            "(`serving_warm_page_cache`).",
        },
        "prewarm": {
            "type": "dict",
            "default": {},
            "description": "The prewarm's bounds (specdeploy.serve.prewarm): `readers` (0: from the host's CPUs), "
            "`max_fraction` of MemAvailable, `max_gb` (0: none); roles/serving's `serving_prewarm_*`.",
        },
        "state_dir": {
            "type": "str",
            "default": STATE_DIR,
            "description": "The host's serving state folder, of `rollout.json` and `current.json` "
            "(`serving_state_dir`).",
        },
        "engine_image_profile": {
            "type": "str",
            "default": names.DEFAULT_PROFILE,
            "description": "The profile the image was built from, kept in `current.json` so that "
            "`specdeploy verify --host` needs no inventory (roles/engine_image).",
        },
        "engine_image_drafter_path": {
            "type": "str",
            "default": "",
            "description": "The drafter the image was built from, kept in `current.json` likewise.",
        },
        "reconnect_grace": {
            "type": "float",
            "default": RECONNECT_GRACE_S,
            "description": "Seconds without contact with the host that change no verdict "
            "(`serving_reconnect_grace`): the watch and the rollout reconnect meanwhile.",
        },
        "router_host": {
            "type": "str",
            "default": "",
            "description": "A fleet: the router's inventory host, which this engine leaves before it stops "
            "and joins once READY; empty: no router.",
        },
        "router_port": {"type": "int", "default": names.ROUTER_PORT, "description": "The router's port."},
        "sentinel_port": {
            "type": "int",
            "default": SENTINEL_PORT,
            "description": "The fleet sentinel's hold API port, on the router host's loopback.",
        },
        "fleet_worker": {
            "type": "str",
            "default": "",
            "description": "This engine's URL at the router (roles/serving's `serving_fleet_worker`); empty: "
            "from `ansible_host` and the engine's port.",
        },
        "bench": {
            "type": "dict",
            "default": {"gate": False, "enabled": False},
            "description": "The benchmark gate between READY and promotion (specdeploy.gate): `enabled`, `gate` "
            "(false: measure and record, refuse nothing), `budget`, `concurrency`, `max_tokens`, "
            "`min_acceptance_length`, `max_regression`; roles/serving's `serving_bench*`.",
        },
    }

    def gate(self, cfg: ServingConfig, values: dict[str, Any]) -> BenchmarkGate | None:
        if not flag(values.get("enabled", True)):
            return None
        settings = GateSettings.from_vars(values)
        probe = subprocess.run(self.connection.commands.command("sh", "-c", HARDWARE_PROBE), capture_output=True,
                               text=True, check=False, timeout=60)  # fmt: skip
        return BenchmarkGate.for_engine(settings, cfg, hardware(probe.stdout))

    def membership(self, args: dict[str, Any], port: int) -> RouterMembership | None:
        if not args["router_host"]:
            return None
        worker = args["fleet_worker"] or worker_url(str(self.hostvars.get("ansible_host", self.host_name)), port)
        return RouterMembership(self.connection_of(args["router_host"]), args["router_port"], worker, self.say,
                                args["sentinel_port"])  # fmt: skip

    def connection_of(self, host: str) -> HostConnection:
        """Another inventory host, over SSH as Ansible has it."""
        host_vars = self.task_vars["hostvars"][host]
        return HostConnection.from_hostvars({k: self._templar.template(host_vars[k]) for k in CONNECTION_VARS
                                             if k in host_vars})  # fmt: skip

    def recorded(self, cfg: ServingConfig, args: dict[str, Any], diagnostics: Path) -> Gate | None:
        """The gate of a deploy, saying what it does and keeping its report beside the watch's verdict.json."""
        gate = self.gate(cfg, args["bench"]) if args["action"] == "deploy" else None
        return None if gate is None else _SaidGate(gate, self, cfg, args, diagnostics)

    def group(self, args: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
        """The hosts of this host's multi-node engine, {host: rank}, whatever serve batch each is in; and
        the play's hosts whose serving variables were never composed (failed before the rollout)."""
        hostvars = self.task_vars["hostvars"]
        hosts = self.task_vars.get("ansible_play_hosts_all") or [self.host_name]
        configs = {h: self._templar.template(hostvars[h].get("serving_config")) for h in hosts}
        return ranks_of(configs, args["config"]), [h for h, cfg in configs.items() if not cfg]

    def checked(self, args: dict[str, Any]) -> tuple[ServingConfig, dict[str, int], list[str]]:
        """The configuration, its multi-node group ({host: rank}, empty for one host) and what is wrong."""
        cfg = ServingConfig.from_vars({**args["config"], "api_key": self.secret("serving_api_key")})
        ranks, unchecked = self.group(args)
        problems = cfg.problems() + GateSettings.from_vars(args["bench"]).problems()
        problems += group_problems(ranks, cfg.nnodes, unchecked)
        return cfg, ranks, problems

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        cfg, ranks, problems = self.checked(args)
        if problems or ranks:
            return self.act_group(args, cfg, ranks) if not problems else {"failed": True, "msg": "; ".join(problems)}
        conn, grace = self.connection, args["reconnect_grace"]
        diagnostics = host_runs(self.host_name)

        def watch(container: str, stall_floor_s: float = 0.0) -> Verdict:
            stall = max(args["stall_timeout"], stall_floor_s)
            why = " (the proven version's: twice its longest recorded stage)" if stall > args["stall_timeout"] else ""
            self.say(f"watching {container} (stall timeout {stall:.0f} s{why})")
            options = WatchOptions(
                url=None,
                model=cfg.served_model_name,
                # The benchmark's baseline runs the same image with speculation off: no drafts to count.
                speculative=cfg.speculative_method == "eagle3" and container != rollouts.BASELINE,
                stall_timeout_s=stall,
                timeout_s=args["timeout"],
                api_key=cfg.api_key,
                diagnostics=diagnostics,
                progress=False,
                # Stage, elapsed, ETA and GPU memory while a long load runs: never a silent wait.
                on_progress=lambda line: self.say(f"{container}: {line}"),
            )
            verdict = watch_container_on_host(conn, container, cfg.port, options, grace)
            for note in verdict.notes:
                self.say(f"{container}: {note}")
            self.say(f"{container}: {verdict.first_line()}")
            if verdict.status == "LOST":  # not a verdict on the engine: the rollout stops where it is
                raise SpecdeployError(verdict.headline)
            return verdict

        warm = Prewarm(self, prewarmer(conn.commands, cfg.model_path, args["prewarm"]), args["warm_page_cache"])

        grace_note = f"contact lost for more than {grace:.0f} s (serving_reconnect_grace)"
        rollout: Rollout | None = None
        fleet = self.membership(args, cfg.port)
        joined = False
        try:
            store = HostRecords(conn.commands, args["state_dir"])
            leave = fleet.leave if fleet is not None else lambda: None
            if fleet is not None:
                fleet.hold()
            rollout = Rollout(conn.reconnect_docker, store, watch, diagnostics, grace, before_stop=leave,
                              gate=self.recorded(cfg, args, diagnostics))  # fmt: skip
            if args["action"] == "rollback":
                outcome = rollout.rollback()
            else:
                if not args["image"]:
                    raise SpecdeployError("specdeploy_serve: action=deploy needs image")
                outcome = rollout.deploy(cfg, image_id(rollout, args["image"], str(conn)), warm)
                warm.keep(outcome.verdict)
            if outcome.status == "deployed":  # promoted: it serves, whether or not a router takes it back
                store.record_serving(serving(outcome, args, bool(self.secret("serving_api_key"))))
            # Back in the router only on a READY engine: the new version, or the previous one restored.
            if fleet is not None and outcome.status in ("deployed", "unchanged", "rolled-back"):
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
        return {**result(outcome, joined), "prewarm": warm.report.as_dict() if warm.report else None}

    def member(self, host: str, rank: int, args: dict[str, Any]) -> tuple[Member, HostConnection, dict[str, Any]]:
        """One rank of the group: its host's connection (as Ansible has it), records and configuration."""
        host_vars = self.task_vars["hostvars"][host]
        conn = self.connection if host == self.host_name else self.connection_of(host)
        raw = args["config"] if host == self.host_name else self._templar.template(host_vars["serving_config"])
        key = self._templar.template(host_vars.get("serving_api_key") or "") or None
        rollout = Rollout(conn.reconnect_docker, HostRecords(conn.commands, args["state_dir"]), _no_watch,
                          host_runs(host), args["reconnect_grace"])  # fmt: skip
        image = image_id(rollout, args["image"], host)
        return Member(rank, host, rollout, ServingConfig.from_vars({**raw, "api_key": key}), image), conn, raw

    def group_watch(self, args: dict[str, Any], cfg: ServingConfig,
                    conns: list[tuple[int, str, HostConnection]]) -> Callable[[float, int], Verdict]:  # fmt: skip
        def watch(stall_floor_s: float, replicas: int) -> Verdict:
            stall = max(args["stall_timeout"], stall_floor_s)
            self.say(f"watching the {len(conns)} ranks of {CONTAINER} on {', '.join(h for _, h, _ in conns)} "
                     f"(stall timeout {stall:.0f} s)")  # fmt: skip
            options = WatchOptions(url=None, model=cfg.served_model_name, stall_timeout_s=stall,
                                   speculative=cfg.speculative_method == "eagle3", timeout_s=args["timeout"],
                                   api_key=cfg.api_key,
                                   diagnostics=host_runs(self.host_name), progress=False,
                                   data_parallel_ranks=replicas,
                                   on_progress=lambda line: self.say(f"group: {line}"))  # fmt: skip
            verdict = watch_group_on_hosts(conns, CONTAINER, cfg.port, options, args["reconnect_grace"])
            for line in [*verdict.notes, verdict.first_line()]:
                self.say(f"group: {line}")
            if verdict.status == "LOST":
                raise SpecdeployError(verdict.headline)
            return verdict

        return watch

    def act_group(self, args: dict[str, Any], cfg: ServingConfig, ranks: dict[str, int]) -> dict[str, Any]:
        """A multi-node engine (specdeploy.serve.group): rank 0's task rolls every rank out, the
        others' tasks say so and change nothing."""
        head = next(host for host, rank in ranks.items() if rank == 0)
        if cfg.node_rank != 0:
            msg = f"rank {cfg.node_rank} of {cfg.nnodes}: rolled out, watched and rolled back with its group by {head}"
            return {**result(rollouts.Outcome(False, "unchanged", msg), False), "prewarm": None}
        if args["action"] == "rollback":
            raise SpecdeployError(
                "make rollback swaps one host's engine; a multi-node group rolls back as one when a rollout fails",
                hint="make deploy with the previous image (-e serving_image=...)",
            )
        built = [self.member(host, rank, args) for host, rank in sorted(ranks.items(), key=lambda item: item[1])]
        members = [m for m, _, _ in built]
        warms = {m.rank: Prewarm(self, prewarmer(conn.commands, m.cfg.model_path, args["prewarm"]),
                                 args["warm_page_cache"]) for m, conn, _ in built}  # fmt: skip
        fleet = self.membership(args, cfg.port)
        group = GroupRollout(members, self.group_watch(args, cfg, [(m.rank, m.host, c) for m, c, _ in built]),
                             before_stop=fleet.leave if fleet is not None else lambda: None)  # fmt: skip
        joined = False
        try:
            if fleet is not None:
                fleet.hold()
            if flag(args["bench"].get("enabled", False)):
                self.say("benchmark gate: not run on a multi-node group (it measures one host's engine)")
            outcome = group.deploy(lambda m: warms[m.rank]())
            warms[0].keep(outcome.verdict)
            for m, _, raw in built if outcome.status == "deployed" else []:
                store: Any = m.rollout.host.store  # (HostRecords: the host types it as the RecordStore it uses)
                old = m.rollout.record.old
                mine = replace(outcome, image_id=m.image_id, previous_image_id=old.image_id if old else None)
                store.record_serving(serving(mine, {**args, "config": raw}, bool(m.cfg.api_key)))
            joined = fleet is not None and outcome.status in ("deployed", "unchanged", "rolled-back") and fleet.join()
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
        return {**result(outcome, joined), "prewarm": None, "ranks": ranks, "data_parallel": group.serves_replicas()}


def image_id(rollout: Rollout, tag: str, where: str) -> str:
    """The id of image TAG on the rollout's host."""
    try:
        return str(rollout.client.images.get(tag).id)
    except Exception as exc:
        if is_transport_error(exc):
            raise
        raise SpecdeployError(f"image {tag} is not on {where}: run the build phase first") from exc


def _no_watch(container: str, stall_floor_s: float = 0.0) -> Verdict:
    """A group's ranks are watched together (GroupRollout's watcher), never one by one."""
    raise SpecdeployError(f"{container}: a rank of a multi-node group is never watched alone")
