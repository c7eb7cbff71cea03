"""Action `specdeploy_engine_image_build`: build the engine image on the target, or on the controller and ship it.

`docker build` runs on the target over SSH (the default), or on the controller, the image then shipped to the
target with docker save | load (no registry needed). The log is streamed with step progress and kept in the
controller's run folder. An image with the same tag labelled with the same inputs digest is not rebuilt, so the
task is changed only when the image on the target changes; a failed build's message is the failing step's root
cause. Thin: the logic is in specdeploy.engine_image.docker_build.
"""

from __future__ import annotations

from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import profiles
from specdeploy.engine_image.docker_build import BUILD_ON, BuildRequest, build_for


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "profile": {
            "type": "str",
            "required": True,
            "choices": list(profiles.PROFILES),
            "description": "The engine image profile; a base image made on the controller is shipped to the "
            "build host first.",
        },
        "context": {
            "type": "str",
            "required": True,
            "description": "The build context's folder on the build host (`specdeploy_engine_image_context`'s "
            "`context` when it is the controller).",
        },
        "tag": {"type": "str", "required": True, "description": "The image's tag."},
        "inputs_digest": {
            "type": "str",
            "default": "",
            "description": "The context's `inputs_digest`, a label of the image: an image with this tag and "
            "label is not rebuilt. Empty: always built.",
        },
        "timeout": {"type": "float", "default": 7200.0, "description": "The build's time limit, in seconds."},
        "build_on": {
            "type": "str",
            "choices": list(BUILD_ON),
            "default": "target",
            "description": "Where `docker build` runs: on the target (the drafter stays there) or on the "
            "controller, the image then shipped to the target.",
        },
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
