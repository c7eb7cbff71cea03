"""Action `specdeploy_drafter`: read the EAGLE-3 drafter on the host and check it, before any build.

One SSH round trip reads the drafter's folder (each file's sha256, its `config.json` and `SHA256SUMS`, the
target model's `config.json`); the drafter is then checked against the profile's pinned engine and against
the target. The task fails with every reason to refuse the drafter, before anything is built; it never
changes the host. Runs on the controller. Thin: the logic is in specdeploy.engine_image (drafter, profiles).
"""

from __future__ import annotations

import subprocess
from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import drafter, profiles
from specdeploy.errors import SpecdeployError


class ActionModule(SpecdeployAction):
    CHANGES_HOSTS = False  # reads and checks only (check mode runs it)
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "path": {
            "type": "str",
            "required": True,
            "description": "The drafter's folder on the host (`engine_image_drafter_path`); it must hold a "
            "`SHA256SUMS` manifest.",
        },
        "target_model_path": {
            "type": "str",
            "default": "",
            "description": "The target model's folder on the host: when set, the drafter's hidden size and "
            "vocabulary are checked against its `config.json`.",
        },
        "profile": {
            "type": "str",
            "required": True,
            "choices": list(profiles.PROFILES),
            "description": "The engine image profile: the drafter must be one its pinned engine release loads.",
        },
    }

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        conn = self.connection
        cmd = conn.commands.command("sh", "-c", drafter.READ_SCRIPT, "sh", args["path"], args["target_model_path"])
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise SpecdeployError(f"reading the drafter on {conn} failed: {proc.stderr.strip()[-500:]}")
        read = drafter.parse_read(proc.stdout)
        prof = profiles.profile(args["profile"])
        user = conn.target.user or "the SSH user"
        found = drafter.check_on_host(read, args["path"], user, (prof.engine, prof.version))
        result = {"changed": False, "digest": drafter.digest(read.files_sha256), "problems": found,
                  "files": sorted(read.files_sha256)}  # fmt: skip
        if found:
            return {**result, "failed": True, "msg": f"drafter {args['path']} refused: {'; '.join(found)}"}
        return result
