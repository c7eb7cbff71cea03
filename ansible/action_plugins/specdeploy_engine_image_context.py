"""Action `specdeploy_engine_image_context`: the engine image's build context, prepared on the controller
(Dockerfile, wheelhouse, the specdeploy wheel), and the digest of its inputs. Thin: logic in
specdeploy.engine_image.dockerfile; the drafter is added by the role, on the host that builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import dockerfile, profiles
from specdeploy.serve import loaders


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "profile": {"type": "str", "required": True, "choices": list(profiles.PROFILES)},
        "drafter_digest": {"type": "str", "required": True},
        "base_digest": {"type": "str", "default": ""},
        "sgl_kernel_build": {"type": "str", "choices": list(profiles.SGL_KERNEL_BUILD_MODES), "default": "auto"},
        "specdeploy_wheel": {"type": "path", "default": ""},
        # serving_load_format: the image bakes in the package its loader needs (specdeploy.serve.loaders).
        "load_format": {"type": "str", "default": ""},
    }

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        prof = profiles.profile(args["profile"])
        dest = dockerfile.context_dir(prof, args["drafter_digest"])
        info = dockerfile.prepare_context(
            prof,
            dest,
            drafter_digest=args["drafter_digest"],
            base_digest=args["base_digest"] or None,
            sgl_kernel_build=args["sgl_kernel_build"],
            wheel=Path(args["specdeploy_wheel"]) if args["specdeploy_wheel"] else None,
            loader_requirements=tuple(loaders.image_requirements(args["load_format"], prof.name)),
        )
        return {**info, "changed": False}
