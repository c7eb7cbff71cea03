"""Action `specdeploy_serve`: roll the engine container out (or back) on the target and watch it
to READY, rolling back on FAILED/STALLED. Thin: the logic is in specdeploy.serve.

The API key is read from the `serving_api_key` variable, never from the task's arguments, so
it appears in no task result or log line.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from specdeploy.connection import CommandHost, docker_client_for
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.serve import rollout as rollouts
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.record import DEFAULT_STATE_DIR, HostRecordStore
from specdeploy.serve.rollout import Rollout
from specdeploy.targets import CONNECTION_VARS, from_hostvars
from specdeploy.transport import RECONNECT_GRACE_S, is_transport_error, lost_contact
from specdeploy.watch.remote import diagnostics_root, watch_container_on_host
from specdeploy.watch.watchdog import Verdict, WatchOptions

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        ("action", "image", "config", "stall_timeout", "timeout", "warm_page_cache", "state_dir", "reconnect_grace")
    )

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        hostvars = {k: self._templar.template(task_vars[k]) for k in CONNECTION_VARS if k in task_vars}
        api_key = self._templar.template(task_vars.get("serving_api_key", "")) or None
        cfg = ServingConfig.from_vars({**dict(args.get("config") or {}), "api_key": api_key})
        problems = cfg.problems()
        if problems:
            return {**result, "failed": True, "msg": "; ".join(problems)}
        target, ssh = from_hostvars(hostvars)
        grace = float(args.get("reconnect_grace", RECONNECT_GRACE_S))
        host_name = str(hostvars.get("inventory_hostname"))
        diagnostics = diagnostics_root(state_dir(), host_name)

        def watch(container: str) -> Verdict:
            display.display(f"  {target.host}: watching {container} (stall timeout {args.get('stall_timeout', 300)} s)")
            options = WatchOptions(
                url=None,
                model=cfg.served_model_name,
                speculative=cfg.speculative_method == "eagle3",
                stall_timeout_s=float(args.get("stall_timeout", 300)),
                timeout_s=float(args.get("timeout", 3600)),
                api_key=cfg.api_key,
                diagnostics=diagnostics,
                progress=False,
                # Stage, elapsed, ETA and GPU memory while a long load runs: never a silent wait.
                on_progress=lambda line: display.display(f"  {target.host}: {container}: {line}"),
            )
            verdict = watch_container_on_host(hostvars, container, cfg.port, options, grace)
            for note in verdict.notes:
                display.display(f"  {target.host}: {container}: {note}")
            display.display(f"  {target.host}: {container}: {verdict.first_line()}")
            if verdict.status == "LOST":  # not a verdict on the engine: the rollout stops where it is
                raise SpecdeployError(verdict.headline)
            return verdict

        def warm() -> str:
            if not args.get("warm_page_cache", True):
                return "page cache not warmed (serving_warm_page_cache: false)"
            report = rollouts.warm_page_cache(CommandHost(target, ssh), cfg.model_path)
            display.display(f"  {target.host}: {report}")
            return report

        grace_note = f"contact lost for more than {grace:.0f} s (serving_reconnect_grace)"
        rollout: Rollout | None = None
        try:
            store = HostRecordStore(CommandHost(target, ssh), str(args.get("state_dir", DEFAULT_STATE_DIR)))
            rollout = Rollout(lambda: docker_client_for(target, ssh), store, watch, diagnostics, grace)
            if args.get("action", "deploy") == "rollback":
                outcome = rollout.rollback()
            else:
                image = str(args["image"])
                try:
                    image_id = str(rollout.client.images.get(image).id)
                except Exception as exc:
                    if is_transport_error(exc):
                        raise
                    raise SpecdeployError(f"image {image} is not on {target}: run the build phase first") from exc
                outcome = rollout.deploy(cfg, image_id, warm)
        except SpecdeployError as exc:
            return {**result, "failed": True, "changed": bool(rollout and rollout.began), "msg": str(exc)}
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            state = rollout.record.describe() if rollout is not None else "no rollout began"
            error = lost_contact(str(target), "rolling the engine out", exc, state,
                                 hint=f"{grace_note}; when {target.host} answers again: make status "
                                      "(what runs there), then make deploy (it resumes the rollout)")  # fmt: skip
            return {**result, "failed": True, "changed": bool(rollout and rollout.began), "msg": str(error)}
        failed = outcome.status not in ("deployed", "unchanged")
        message = outcome.message if not outcome.notes else f"{outcome.message} | {' | '.join(outcome.notes)}"
        return {**result, **asdict(outcome), "changed": outcome.changed, "failed": failed, "msg": message}
