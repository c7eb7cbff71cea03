"""Action `specdeploy_serve`: roll the engine container out (or back) on the target and watch it
to READY, rolling back on FAILED/STALLED. Thin: the logic is in specdeploy.serving.

The API key is read from the `serving_api_key` variable, never from the task's arguments, so
it appears in no task result or log line.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from specdeploy.errors import SpecdeployError
from specdeploy.images import CommandHost
from specdeploy.paths import state_dir
from specdeploy.remote_docker import docker_client_for
from specdeploy.serving import rollout
from specdeploy.serving.config import ServingConfig
from specdeploy.targets import CONNECTION_VARS, from_hostvars
from specdeploy.watch.remote import diagnostics_root, watch_container_on_host
from specdeploy.watch.watchdog import Verdict, WatchOptions

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("action", "image", "config", "stall_timeout", "timeout", "warm_page_cache"))

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
            verdict = watch_container_on_host(hostvars, container, cfg.port, options)
            display.display(f"  {target.host}: {container}: {verdict.first_line()}")
            return verdict

        def warm() -> str:
            if not args.get("warm_page_cache", True):
                return "page cache not warmed (serving_warm_page_cache: false)"
            report = rollout.warm_page_cache(CommandHost(target, ssh), cfg.model_path)
            display.display(f"  {target.host}: {report}")
            return report

        try:
            client = docker_client_for(target, ssh)
            if args.get("action", "deploy") == "rollback":
                outcome = rollout.rollback(client, watch, diagnostics)
            else:
                image = str(args["image"])
                try:
                    image_id = str(client.images.get(image).id)
                except Exception as exc:
                    raise SpecdeployError(f"image {image} is not on {target}: run the build phase first") from exc
                outcome = rollout.deploy(client, cfg, image_id, watch, warm, diagnostics=diagnostics)
        except SpecdeployError as exc:
            return {**result, "failed": True, "changed": False, "msg": str(exc)}
        failed = outcome.status not in ("deployed", "unchanged")
        message = outcome.message if not outcome.notes else f"{outcome.message} | {' | '.join(outcome.notes)}"
        return {**result, **asdict(outcome), "changed": outcome.changed, "failed": failed, "msg": message}
