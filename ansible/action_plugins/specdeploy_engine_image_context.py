"""Action `specdeploy_engine_image_context`: prepare the engine image's build context on the controller.

The context holds the rendered Dockerfile, the engine's wheelhouse and the specdeploy wheel, in one folder
per profile and drafter under the controller's state folder; the digest of these inputs tells the build
whether the image must be rebuilt. The drafter is not in it: the role adds it on the host that builds.
Never changed (the context is the controller's cache). Thin: the logic is in specdeploy.engine_image.dockerfile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import dockerfile, profiles
from specdeploy.serve import loaders


class ActionModule(SpecdeployAction):
    CHANGES_HOSTS = False  # reads and checks only (check mode runs it)
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "profile": {
            "type": "str",
            "required": True,
            "choices": list(profiles.PROFILES),
            "description": "The engine image profile: the engine, its pinned release and base image.",
        },
        "drafter_digest": {
            "type": "str",
            "required": True,
            "description": "The drafter's digest (`specdeploy_drafter`'s `digest`): it names the context's folder "
            "and labels the image.",
        },
        "base_digest": {
            "type": "str",
            "default": "",
            "description": "`sha256:<64 hex>` of the GPU profiles' official base image, pinned with its tag; "
            "unused for vllm-cpu.",
        },
        "sgl_kernel_build": {
            "type": "str",
            "choices": list(profiles.SGL_KERNEL_BUILD_MODES),
            "default": "auto",
            "description": "sglang-cuda: rebuild sgl-kernel for SM120 when its wheel lacks sm_120a code "
            "(`auto`), `always` or `never`.",
        },
        "specdeploy_wheel": {
            "type": "path",
            "default": "",
            "description": "A specdeploy wheel to install in the image; empty: one built from this checkout.",
        },
        "load_format": {
            "type": "str",
            "default": "",
            "description": "The weight loader the engine serves with (`serving_load_format`): the image bakes in "
            "the package it needs (specdeploy.serve.loaders).",
        },
        "flashinfer_kernels": {
            "type": "str",
            "default": "",
            "description": "FlashInfer's ahead-of-time kernels: empty (none baked in; the build log says so), "
            "`download` (vLLM's `vllm download-kernels` at build time) or a controller folder of the kernel wheels "
            "(specdeploy.engine_image.flashinfer).",
        },
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
            flashinfer_kernels=args["flashinfer_kernels"],
        )
        return {**info, "changed": False}
