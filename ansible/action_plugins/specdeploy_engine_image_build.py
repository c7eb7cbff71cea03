"""Action `specdeploy_engine_image_build`: the engine image built on the target over SSH (default) or on
the controller and shipped; log streamed with step progress; changed only when the image on the
target changes; on failure the failing step's root cause. Thin: logic in specdeploy.engine_image."""

from __future__ import annotations

from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import profiles
from specdeploy.engine_image.docker_build import BUILD_ON, BuildRequest, build_for


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "profile": {"type": "str", "required": True, "choices": list(profiles.PROFILES)},
        "context": {"type": "str", "required": True},
        "tag": {"type": "str", "required": True},
        "inputs_digest": {"type": "str", "default": ""},
        "timeout": {"type": "float", "default": 7200.0},
        "build_on": {"type": "str", "choices": list(BUILD_ON), "default": "target"},
    }

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        conn = self.connection
        request = BuildRequest(args["context"], args["tag"], args["inputs_digest"], args["timeout"])
        built = build_for(conn.target, conn.ssh, request, build_on=args["build_on"], run_name=self.host_name,
                          on_step=self.say, ship_base_image=profiles.profile(args["profile"]).shipped_base)  # fmt: skip
        report = {"tag": built.tag, "image_id": built.image_id, "build_log": built.build_log,
                  "seconds": built.seconds, "shipped": built.shipped}  # fmt: skip
        if built.failure:
            return {**report, "failed": True, "changed": False, "msg": built.failure}
        return {**report, "changed": built.changed}
