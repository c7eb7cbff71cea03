"""Action `specdeploy_image_build`: `docker build` on the target over SSH, its log streamed to
the controller with step progress; changed only when the image id changes; on failure the
failing step and its root cause are the task's message. Thin: logic in specdeploy.engine_image."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from specdeploy import engine_image
from specdeploy.errors import SpecdeployError
from specdeploy.images import ensure_image_on
from specdeploy.paths import state_dir
from specdeploy.remote_docker import docker_client, docker_client_for
from specdeploy.targets import CONNECTION_VARS, from_hostvars, ssh_command

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("context", "tag", "inputs_digest", "ship_base_image", "timeout"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = {k: self._templar.template(task_vars[k]) for k in CONNECTION_VARS if k in task_vars}
        target, ssh = from_hostvars(hostvars)
        args = self._task.args
        tag, context = str(args["tag"]), str(args["context"])
        try:
            if args.get("ship_base_image"):
                remote = docker_client_for(target, ssh)
                if ensure_image_on(remote, docker_client(None), str(args["ship_base_image"])):
                    display.display(f"shipped {args['ship_base_image']} to {target}")
        except SpecdeployError as exc:
            return {**result, "failed": True, "msg": str(exc)}

        def inspect(fmt: str) -> str:
            cmd = ssh_command(target, ssh, "docker", "image", "inspect", "--format", f"'{fmt}'", tag)
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            return proc.stdout.strip() if proc.returncode == 0 else ""

        def image_id() -> str:
            return inspect("{{.Id}}")

        inputs = str(args.get("inputs_digest") or "")
        before = image_id()
        if inputs and before and inspect('{{ index .Config.Labels "io.specdeploy.build-inputs" }}') == inputs:
            return {**result, "changed": False, "image_id": before, "tag": tag, "build_log": "(not rebuilt: inputs "
                    "unchanged)", "seconds": 0.0}  # fmt: skip
        log_dir = state_dir() / "runs" / str(hostvars.get("inventory_hostname")) / time.strftime("%Y%m%dT%H%M%S")
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "image-build.log"
        # The classic builder: BuildKit needs buildx, which Debian's docker.io lacks.
        label = ["--label", f"io.specdeploy.build-inputs={inputs}"] if inputs else []
        cmd = ssh_command(target, ssh, "DOCKER_BUILDKIT=0", "docker", "build", *label, "-t", tag, context)
        start = time.monotonic()
        lines: list[str] = []
        with (
            log_path.open("w") as log,
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
            ) as proc,
        ):
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                lines.append(line.rstrip("\n"))
                step = engine_image.progress_line(line)
                if step:
                    display.display(f"  {target.host}: {time.monotonic() - start:6.1f}s {step}")
            code = proc.wait(timeout=float(args.get("timeout", 7200)))
        if code != 0:
            summary = engine_image.build_failure_summary(lines)
            return {**result, "failed": True, "changed": False, "msg": summary, "build_log": str(log_path),
                    "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
        after = image_id()
        return {**result, "changed": after != before, "image_id": after, "tag": tag, "build_log": str(log_path),
                "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
