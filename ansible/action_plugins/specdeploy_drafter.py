"""Action `specdeploy_drafter`: read the drafter on the host in one SSH round trip (files' sha256,
config.json, SHA256SUMS, the target's config.json) and check it against the pinned engine and the
target. Failed with every reason to refuse it, before any build. Thin: logic in specdeploy.engine_image."""

from __future__ import annotations

import subprocess
from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import drafter, profiles
from specdeploy.errors import SpecdeployError


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "path": {"type": "str", "required": True},
        "target_model_path": {"type": "str", "default": ""},
        "profile": {"type": "str", "required": True, "choices": list(profiles.PROFILES)},
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
