"""`docker build` of an engine image where it is asked for: on the target over SSH (the default;
the drafter never leaves it) or on the controller, then shipped to the target (docker save | load,
no registry needed). The log is streamed with step progress and kept under .state/runs; a build
whose inputs match the image's label is skipped; a failure reports the failing step's root cause."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeploy import docker_engine, timing
from specdeploy.connection import CommandHost
from specdeploy.engine_image import buildlog
from specdeploy.engine_image.base_image import ensure_base_image
from specdeploy.engine_image.ship import ship_image
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.targets import SshSettings, Target

BUILD_ON = ("target", "controller")
INPUTS_LABEL = "io.specdeploy.engine_image-inputs"


@dataclass(frozen=True)
class BuildRequest:
    context: str  # a folder on the build host
    tag: str
    inputs_digest: str  # what the image is built from; an image labelled with it is not rebuilt
    timeout: float = 7200


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    built: bool  # a new image id on the build host
    shipped: bool  # copied from the controller to the target
    build_log: str
    seconds: float
    failure: str = ""

    @property
    def changed(self) -> bool:
        return self.built or self.shipped


def build(host: CommandHost, req: BuildRequest, log_path: Path, on_step: Callable[[str], None]) -> BuildResult:
    """Build the image on HOST unless one labelled with the same inputs is there."""
    tag, inputs_digest = req.tag, req.inputs_digest
    # One SSH round for both (a converged deploy is made of such rounds).
    fields = host.inspect(tag, f'{{{{.Id}}}} {{{{ index .Config.Labels "{INPUTS_LABEL}" }}}}')
    before, _, labelled = fields.partition(" ")
    if inputs_digest and labelled == inputs_digest:
        return BuildResult(tag, before, False, False, "(not rebuilt: inputs unchanged)", 0.0)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # The classic builder: BuildKit needs buildx, which Debian's docker.io lacks.
    label = ["--label", f"{INPUTS_LABEL}={inputs_digest}"] if inputs_digest else []
    cmd = host.command("env", "DOCKER_BUILDKIT=0", "docker", "build", *label, "-t", tag, req.context)
    start = time.monotonic()
    lines: list[str] = []
    steps: list[tuple[str, float]] = []  # (step, when it began)
    with (
        log_path.open("w") as log,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
            step = buildlog.progress_line(line)
            if step:
                steps.append((step, time.monotonic() - start))
                on_step(f"{steps[-1][1]:6.1f}s {step}")
        code = proc.wait(timeout=req.timeout)
    seconds = round(time.monotonic() - start, 1)
    write_steps(log_path.parent / timing.STEPS_FILE, tag, seconds, steps)
    if code != 0:
        return BuildResult(tag, before, False, False, str(log_path), seconds, buildlog.build_failure_summary(lines))
    after = host.inspect(tag, "{{.Id}}")
    return BuildResult(tag, after, after != before, False, str(log_path), seconds)


def write_steps(path: Path, tag: str, seconds: float, steps: list[tuple[str, float]]) -> None:
    """Each build step's seconds (to the next step's start, the last to the build's end), for the table
    at the end of `make deploy` (specdeploy.timing). A cached step takes about nothing."""
    ends = [began for _, began in steps[1:]] + [seconds]
    doc = {"tag": tag, "seconds": seconds,
           "steps": [{"step": step, "began_s": round(began, 1), "seconds": round(end - began, 1)}
                     for (step, began), end in zip(steps, ends, strict=True)]}  # fmt: skip
    path.write_text(json.dumps(doc, indent=1))


def build_for(
    target: Target,
    ssh: SshSettings,
    req: BuildRequest,
    *,
    build_on: str,
    run_name: str,
    on_step: Callable[[str], None],
    ship_base_image: str = "",
) -> BuildResult:
    """The engine image on TARGET, built there or on the controller and shipped."""
    if build_on not in BUILD_ON:
        raise SpecdeployError(f"build_on={build_on!r}: use one of {', '.join(BUILD_ON)}")
    log_path = state_dir() / "runs" / run_name / time.strftime("%Y%m%dT%H%M%S") / "image-build.log"
    if build_on == "controller":
        docker_engine.ensure_engine(state_dir())
        result = build(CommandHost(), req, log_path, on_step)
        if result.failure:
            return result
        on_step(f"shipping {req.tag} to {target} (docker save | docker load, skipped when it is there)")
        shipped = ship_image(req.tag, CommandHost(), CommandHost(target, ssh))
        return BuildResult(req.tag, result.image_id, result.built, shipped, result.build_log, result.seconds)
    if ship_base_image:
        ensure_base_image(docker_engine.ensure_engine(state_dir()))
        if ship_image(ship_base_image, CommandHost(), CommandHost(target, ssh)):
            on_step(f"shipped the base image {ship_base_image} to {target}")
    return build(CommandHost(target, ssh), req, log_path, on_step)
