"""`make bench`: a drafter-only change rebuilds only the engine image's last layers.

The vllm-cpu profile on this machine's Docker engine (classic builder), its context from
dockerfile.prepare_context: a cold build, then the same context with only the drafter changed
(other bytes, so another digest in the LABEL), built with the cache. Every step but the drafter
COPY and the LABEL must say "Using cache", or this fails. Figures are measured in this run only;
the ratio compares the two builds of the same run.

Cold means a per-run copy of the Debian base (same files, a new image id, passed as BASE_IMAGE),
under which nothing can be cached. Not `--no-cache`: with it the classic builder makes two equal
SHELL layers on the base (one per stage), the next cached build takes the newer one (the final
stage's) for the engine stage as well, and runs the whole engine stage again (seen here).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from specdeploy import names
from specdeploy.docker_engine import ensure_engine
from specdeploy.engine_image import buildlog, dockerfile, drafter, profiles, source
from specdeploy.paths import state_dir
from specdeploy_testbed import testbed

REPOSITORY = "specdeploy-bench/vllm-cpu"
STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$", re.M)
REBUILT = ("COPY drafter/", "LABEL ")  # the only steps a drafter change may run again


def write_drafter(folder: Path, seed: bytes) -> str:
    """A drafter folder (config.json, 1 MiB of weights, SHA256SUMS); returns its digest."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
              "vocab_size": 2048, "target_hidden_size": 256}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config) + "\n")
    (folder / "model.safetensors").write_bytes(hashlib.sha256(seed).digest() * (1 << 15))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
    (folder / drafter.MANIFEST).write_text("".join(f"{digest}  {name}\n" for name, digest in files.items()))
    return drafter.digest(files)


def context_for(dest: Path, seed: bytes, wheel: Path) -> str:
    """The real build context (dockerfile.prepare_context) plus a drafter; returns its digest."""
    digest = write_drafter(dest.parent / "drafter", seed)
    dockerfile.prepare_context(profiles.profile("vllm-cpu"), dest, drafter_digest=digest, base_digest=None,
                                 sgl_kernel_build="never", wheel=wheel)  # fmt: skip
    shutil.rmtree(dest / "drafter", ignore_errors=True)
    shutil.copytree(dest.parent / "drafter", dest / "drafter")
    return digest


def docker_build(context: Path, tag: str, base: str, outputs: list[str]) -> float:
    """`docker build` (classic builder) on BASE with step progress; its output goes to OUTPUTS."""
    cmd = ["docker", "build", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(context)]
    start = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          env={**os.environ, "DOCKER_BUILDKIT": "0"}) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            step = buildlog.progress_line(line)
            if step:
                print(f"  {time.monotonic() - start:6.1f}s {step}", flush=True)
    outputs.append("".join(lines))
    if proc.returncode != 0:
        sys.exit(f"docker build {tag} failed: {buildlog.build_failure_summary(lines)}")
    return time.monotonic() - start


def steps(output: str) -> list[tuple[str, str]]:
    """(instruction, its output) for each step of a classic-builder log."""
    parts = STEP.split(output)
    return list(zip(parts[3::4], parts[4::4], strict=True))


def layer_steps(output: str) -> list[tuple[str, bool]]:
    """(instruction, taken from the cache) for each step that makes an image (not ARG/FROM)."""
    return [(instr, "---> Using cache" in body) for instr, body in steps(output)
            if " ---> " in body and not instr.startswith("FROM ")]  # fmt: skip


def remove_built(output: str) -> None:
    """Remove what one of our builds made and no tag keeps: a failed step's container, and the
    untagged layers (the engine stage's chain stays dangling once the final images are gone)."""
    for container in re.findall(r"^ ---> Running in ([0-9a-f]{12})$", output, re.M):
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    made = [body for instr, body in steps(output) if not instr.startswith("FROM ") and "Using cache" not in body]
    for image in reversed([i for body in made for i in re.findall(r"^ ---> ([0-9a-f]{12})$", body, re.M)]):
        tags = subprocess.run(["docker", "image", "inspect", "--format", "{{len .RepoTags}}", image],
                              capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
        if tags == "0":
            subprocess.run(["docker", "rmi", image], capture_output=True, check=False)


def check_cold(output: str) -> None:
    """Nothing from the cache but a step this same build already ran (the final stage's SHELL)."""
    seen: set[str] = set()
    for instr, cached in layer_steps(output):
        if cached and instr not in seen:
            sys.exit(f"the cold build took {instr!r} from the cache")
        seen.add(instr)


def check_drafter_only(output: str) -> tuple[int, int]:
    """Every layer step from the cache but the drafter COPY and the LABEL, which must run again."""
    layers = layer_steps(output)
    wrong = [instr for instr, cached in layers if cached == instr.startswith(REBUILT)]
    if wrong or not layers:
        sys.exit("drafter-only rebuild: these steps broke the layer order (cached when they should run, or run "
                 f"when they should be cached): {wrong or 'no layer steps found'}\n{output[-3000:]}")  # fmt: skip
    return sum(cached for _, cached in layers), len(layers)


def fresh_base(tag: str) -> None:
    """The test bed's Debian base under a new image id (a label), so no layer is cached under it."""
    recipe = f'FROM {testbed.BASE_IMAGE}\nLABEL io.specdeploy.bench-run="{time.time_ns()}"\n'
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=recipe, text=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=True)  # fmt: skip


def main() -> None:
    testbed.ensure_base_image(ensure_engine(state_dir()))
    work = state_dir() / "build" / "bench-image"  # kept: the next run reuses its wheelhouse
    context = work / "context"
    # One specdeploy wheel for both builds: the checkout may change under a 10-minute run, and
    # only the drafter may differ between the two contexts.
    (work / "wheel").mkdir(parents=True, exist_ok=True)
    wheel = Path(shutil.copy2(source.specdeploy_wheel(), work / "wheel"))
    base, cold_tag, warm_tag = (f"{REPOSITORY}:{name}" for name in ("base", "cold", "drafter-changed"))
    outputs: list[str] = []
    try:
        fresh_base(base)
        print(f"cold build of {cold_tag} (on {base}, a fresh copy of {testbed.BASE_IMAGE})")
        digest_a = context_for(context, b"drafter A", wheel)
        cold_s = docker_build(context, cold_tag, base, outputs)
        check_cold(outputs[-1])

        print(f"drafter-only change, rebuilt with the cache as {warm_tag}")
        digest_b = context_for(context, b"drafter B", wheel)
        assert digest_b != digest_a
        warm_s = docker_build(context, warm_tag, base, outputs)
        cached, layers = check_drafter_only(outputs[-1])
        label = subprocess.run(["docker", "image", "inspect", "--format",
                                f'{{{{ index .Config.Labels "{names.DRAFTER_DIGEST_LABEL}" }}}}', warm_tag],
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        if label != digest_b:
            sys.exit(f"the rebuilt image is labelled {label}, not the new drafter's {digest_b}")
    finally:
        for tag in (cold_tag, warm_tag):
            subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)
        for output in reversed(outputs):
            remove_built(output)
        subprocess.run(["docker", "rmi", base], capture_output=True, check=False)
    print(f"{'cold s':>8} {'drafter-only s':>15} {'ratio':>7} {'steps cached':>13}")
    print(f"{cold_s:8.1f} {warm_s:15.1f} {warm_s / cold_s:7.3f} {f'{cached}/{layers}':>13}")


if __name__ == "__main__":
    main()
