"""Action `specdeploy_model_fit`: predict the model's fit on the host's GPUs and refuse it before any load.

One SSH round trip reads the model's and the drafter's `config.json` and their safetensors headers (never
the weights); the weights a GPU holds, the engine's reserve and the KV cache left are then predicted,
and a KV cache that cannot hold one `serving_max_model_len` sequence is refused with its figures and the
variables to change. A model not on the host yet is skipped, not refused. It never changes the host.
Runs on the controller. Thin: the logic is in specdeploy.preflight (model_files, memory, weights).
"""

from __future__ import annotations

import subprocess
from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.engine_image import profiles
from specdeploy.errors import SpecdeployError
from specdeploy.preflight import memory, model_files
from specdeploy.serve import schema


class ActionModule(SpecdeployAction):
    CHANGES_HOSTS = False  # reads only (check mode runs it)
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "model_path": {"type": "str", "required": True, "description": "The model's folder on the host."},
        "drafter_path": {"type": "str", "default": "", "description": "The EAGLE-3 drafter's folder on the host."},
        "profile": {"type": "str", "required": True, "choices": list(profiles.PROFILES),
                    "description": "The engine image profile: its engine's reserve and default memory fraction."},
        "gpu_memory_mib": {"type": "int", "default": 0,
                           "description": "One GPU's memory as nvidia-smi reads it (the smallest); 0: no GPUs read."},
        "serving": {"type": "dict", "default": {},
                    "description": "serving_* values said here over the role's (`preflight_*` sizes and length)."},
    }  # fmt: skip

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        given = {n: self._templar.template(self.task_vars[n]) for n in memory.Serving.VARIABLES if n in self.task_vars}
        values = {**schema.with_defaults(given), **args["serving"]}
        prof = profiles.profile(args["profile"])
        serving = memory.Serving.from_vars(values, prof.engine)
        conn = self.connection
        cmd = conn.commands.as_root("sh", "-c", model_files.READ_SCRIPT, "sh", args["model_path"],
                                    args["drafter_path"] if serving.speculative else "")  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise SpecdeployError(f"reading the model's headers on {conn} failed: {proc.stderr.strip()[-500:]}")
        read = model_files.parse_read(proc.stdout)
        cpu_kv = None if prof.gpu else model_files.cpu_kv_gib(values.get("serving_env") or {})
        result = model_files.fit_for(serving, read.get("target"), read.get("drafter"), args["gpu_memory_mib"], cpu_kv)
        if result.fit is None:
            return {"changed": False, "skipped_fit": True, "msg": result.note}
        found = result.fit.problems()
        out = {"changed": False, "fit": result.fit.lines(), "kv_tokens": result.fit.kv_tokens, "note": result.note,
               "problems": found}  # fmt: skip
        if found:
            return {**out, "failed": True, "msg": f"the model does not fit: {'; '.join(found)}"}
        return {**out, "msg": "; ".join(result.fit.lines())}
