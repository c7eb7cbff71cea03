"""Action `specdeploy_watch`: run the specdeploy watchdog on the controller against a container
on the target host. Thin: every decision is in specdeploy.watch."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ansible.plugins.action import ActionBase

from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.targets import CONNECTION_VARS
from specdeploy.watch.remote import diagnostics_root, watch_container_on_host
from specdeploy.watch.watchdog import WatchOptions


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        ("container", "api_port", "model", "tokens", "speculative", "stall_timeout", "timeout", "api_key")
    )

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        hostvars = {k: self._templar.template(task_vars[k]) for k in CONNECTION_VARS if k in task_vars}
        options = WatchOptions(
            url=None,
            model=args.get("model"),
            tokens=int(args.get("tokens", 8)),
            speculative=bool(args.get("speculative", False)),
            stall_timeout_s=float(args.get("stall_timeout", 300)),
            timeout_s=float(args.get("timeout", 3600)),
            api_key=args.get("api_key"),
            diagnostics=diagnostics_root(state_dir(), str(hostvars.get("inventory_hostname"))),
            progress=False,
        )
        try:
            port = args.get("api_port")
            verdict = watch_container_on_host(hostvars, str(args["container"]), int(port) if port else None, options)
        except SpecdeployError as exc:
            result.update(failed=True, changed=False, msg=str(exc))
            return result
        result.update(
            changed=False,
            failed=verdict.status != "READY",
            msg=verdict.first_line(),
            verdict=asdict(verdict),
        )
        return result
