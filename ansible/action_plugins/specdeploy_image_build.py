"""Action `specdeploy_image_build`: the engine image built on the target over SSH (default) or on
the controller and shipped; log streamed with step progress; changed only when the image on the
target changes; on failure the failing step's root cause. Thin: logic in specdeploy.image_build."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from specdeploy.build.docker_build import BuildRequest, build_for
from specdeploy.errors import SpecdeployError
from specdeploy.targets import CONNECTION_VARS, from_hostvars

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("context", "tag", "inputs_digest", "ship_base_image", "timeout", "build_on"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = {k: self._templar.template(task_vars[k]) for k in CONNECTION_VARS if k in task_vars}
        target, ssh = from_hostvars(hostvars)
        args = self._task.args
        try:
            request = BuildRequest(str(args["context"]), str(args["tag"]), str(args.get("inputs_digest") or ""),
                                   float(args.get("timeout", 7200)))  # fmt: skip
            built = build_for(
                target,
                ssh,
                request,
                build_on=str(args.get("build_on") or "target"),
                run_name=str(hostvars.get("inventory_hostname")),
                on_step=lambda step: display.display(f"  {target.host}: {step}"),
                ship_base_image=str(args.get("ship_base_image") or ""),
            )
        except SpecdeployError as exc:
            return {**result, "failed": True, "msg": str(exc)}
        report = {"tag": built.tag, "image_id": built.image_id, "build_log": built.build_log,
                  "seconds": built.seconds, "shipped": built.shipped}  # fmt: skip
        if built.failure:
            return {**result, **report, "failed": True, "changed": False, "msg": built.failure}
        return {**result, **report, "changed": built.changed}
