"""vllm-cuda images built for real on this machine's Docker engine (building needs no GPU): the
test bed's Debian base, a venv and `pip install vllm==VERSION` from PyPI (the CUDA builds of vLLM
and torch), for the pinned release (EAGLE-3 native) and for 0.17.1 (our codemod patch set).

Inside each image, supports_eagle3() holds for DeepseekV2ForCausalLM and
KimiK25ForConditionalGeneration, and the build's own `specdeploy patch verify` says so.

Slow (several GB from PyPI per image), so not part of `make test`: run `make test-gpu-images`.
Each image is removed after its test unless SPECDEPLOY_KEEP_IMAGES=1. Behind a TLS-intercepting
proxy, pip in the build trusts SPECDEPLOY_PIP_CA_BUNDLE (default: this machine's PIP_CERT).
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.connection import CommandHost
from specdeploy.docker_engine import ensure_engine
from specdeploy.engine_image import docker_build, dockerfile, drafter, profiles, wheels
from specdeploy.patches import vllm_eagle3
from specdeploy.paths import state_dir
from specdeploy_testbed import testbed

pytestmark = pytest.mark.e2e  # a real engine, installed from PyPI; its own folder keeps it out of `make test`

HADOLINT = Path(sys.executable).parent / "hadolint"
REPOSITORY = "specdeploy-gpu-images/vllm-cuda-pip"
SITE = "/opt/engine/lib/python3.11/site-packages"
ENGINE_PYTHON = "/opt/engine/bin/python"
# Measured here: free space fell by 14 GB at the peak of one build (the torch + CUDA layer, 5.7 GB,
# exists twice while the builder commits it; pip's downloads sit beside the install before that).
MIN_FREE_GB = 16
CLASSES = ("DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration")

# The same question the build's verify asks, asked again of the finished image, plus what was installed.
PROBE = """
import json, torch, vllm
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
print(json.dumps({"vllm": vllm.__version__, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                  "supports_eagle3": {c.__name__: bool(supports_eagle3(c))
                                      for c in (DeepseekV2ForCausalLM, KimiK25ForConditionalGeneration)}}))
"""

# What `specdeploy patch verify` prints inside the build (patches/commands.py: _apply, _verify).
COMMON_LINES = (
    "✓ DeepseekV2ForCausalLM and KimiK25ForConditionalGeneration implement SupportsEagle3",
    "✓ DeepseekV2Model.forward collects aux hidden states in its layer loop",
    "import probe: passed",  # not "skipped": torch and vLLM imported in the engine's interpreter
)
PATCH_LINES = {
    pins.VLLM_CUDA: (
        f"vllm {pins.VLLM_CUDA}: support is native; no engine file changed",
        "✓ no EAGLE-3 target whitelist (removed in 0.22; the interface decides)",
    ),
    "0.17.1": (
        f"patched {vllm_eagle3.SPECULATIVE_CONFIG} (eagle3-target-whitelist)",
        f"patched {vllm_eagle3.DEEPSEEK_V2} (deepseek-v2-supports-eagle3)",
        f"patched {vllm_eagle3.KIMI_K25} (kimi-k25-delegates-eagle3)",
        "✓ whitelist lists deepseek_v2, deepseek_v3, kimi_k2, kimi_k25",
    ),
}
VERSIONS = [
    pytest.param(pins.VLLM_CUDA, id=f"vllm-{pins.VLLM_CUDA}-pinned-native"),
    pytest.param("0.17.1", id="vllm-0.17.1-codemods"),
]


class _Timings:
    """Build times, printed in pytest's terminal summary (registered as a plugin at run time)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.lines:
            terminalreporter.section("vllm-cuda image build times")
            for line in self.lines:
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def timings(request: pytest.FixtureRequest) -> _Timings:
    plugin = _Timings()
    request.config.pluginmanager.register(plugin, "specdeploy-gpu-image-timings")
    return plugin


@pytest.fixture(scope="session")
def base_image() -> str:
    testbed.ensure_base_image(ensure_engine(state_dir()))
    return testbed.BASE_IMAGE


def docker(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)


def ca_bundle() -> Path | None:
    for name in ("SPECDEPLOY_PIP_CA_BUNDLE", "PIP_CERT"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


def dummy_drafter(folder: Path) -> str:
    """A folder with a config.json and its SHA256SUMS; its digest the way the role computes it."""
    folder.mkdir(parents=True)
    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 256,
              "vocab_size": 2048, "target_hidden_size": 256, "draft_vocab_size": 1024}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    files = {"config.json": hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()}
    (folder / drafter.MANIFEST).write_text("".join(f"{digest}  {name}\n" for name, digest in files.items()))
    return drafter.digest(files)


def free_gb() -> float:
    root = docker("info", "--format", "{{.DockerRootDir}}").stdout.strip() or "/var/lib/docker"
    return shutil.disk_usage(root).free / 1e9


def cached_steps(log: str) -> list[str]:
    """The instructions whose layer the classic builder took from its cache."""
    parts = re.split(r"^Step \d+/\d+ : (.*)$", log, flags=re.M)
    return [step for step, body in zip(parts[1::2], parts[2::2], strict=True) if "---> Using cache" in body]


def created_by(log: str) -> tuple[list[str], list[str]]:
    """(images, containers) this build made: step results not taken from the cache, and the
    container of a step that failed (the classic builder keeps it)."""
    images: list[str] = []
    containers: list[str] = []
    for step in re.split(r"^Step \d+/\d+ : ", log, flags=re.M)[1:]:
        containers += re.findall(r"^ ---> Running in ([0-9a-f]{12})$", step, re.M)
        if "---> Using cache" in step or step.startswith("FROM "):
            continue
        images += re.findall(r"^ ---> ([0-9a-f]{12})$", step, re.M)
    return images, containers


@dataclass
class Slot:
    """One image under test: its tag, its build log (kept under .state/runs/gpu-images/), its timings."""

    version: str
    tag: str
    log: Path
    timings: _Timings
    base_image: str


@pytest.fixture
def slot(request: pytest.FixtureRequest, base_image: str, timings: _Timings) -> Iterator[Slot]:
    """Removes the image afterwards (unless SPECDEPLOY_KEEP_IMAGES=1), with what a failed build left."""
    version = request.node.callspec.params["version"]
    log = state_dir() / "runs" / "gpu-images" / time.strftime("%Y%m%dT%H%M%S") / f"vllm-cuda-pip-{version}.log"
    slot = Slot(version, f"{REPOSITORY}:{version}", log, timings, base_image)
    docker("rmi", slot.tag)  # a cold build: a kept image from an earlier run would only be cache
    yield slot
    if os.environ.get("SPECDEPLOY_KEEP_IMAGES") == "1":
        return
    docker("rmi", slot.tag)
    images, containers = created_by(slot.log.read_text()) if slot.log.is_file() else ([], [])
    for container in containers:  # the container of a failed step, which the classic builder keeps
        docker("rm", "-f", container)
    for image in reversed(images):  # the layers of a failed build, now dangling; never a tagged one
        if docker("image", "inspect", "--format", "{{len .RepoTags}}", image).stdout.strip() == "0":
            docker("rmi", image)


def run_in(tag: str, *argv: str, volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    mounts = [arg for volume in volumes for arg in ("-v", volume)]
    return docker("run", "--rm", *mounts, "--entrypoint", argv[0], tag, *argv[1:])


def last_json(text: str) -> dict[str, object]:
    """The last stdout line that is a JSON object (vLLM logs to stdout as well)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"no JSON line in: {text[-2000:]}")


def prepare(slot: Slot, tmp_path: Path) -> tuple[dict[str, object], str]:
    """The build context (pip base, this version) with a dummy drafter; (its info, drafter digest)."""
    base = profiles.PipBase(slot.base_image, python_version="3.11", engine_version=slot.version,
                                ca_bundle=ca_bundle())  # fmt: skip
    drafter_digest = dummy_drafter(tmp_path / "drafter")
    context = tmp_path / "context"
    info = dockerfile.prepare_context(profiles.profile("vllm-cuda"), context, drafter_digest=drafter_digest,
                                        base_digest=None, sgl_kernel_build="never", wheel=None, base=base)  # fmt: skip
    shutil.copytree(tmp_path / "drafter", context / "drafter")
    text = (context / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE={slot.base_image}\n" in text
    assert f"/opt/engine/bin/pip install --no-cache-dir vllm=={slot.version}" in text
    lint = subprocess.run([str(HADOLINT), "--no-color", str(context / "Dockerfile")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    return info, drafter_digest


def build(slot: Slot, info: dict[str, object], capsys: pytest.CaptureFixture[str]) -> str:
    """A cold build through specdeploy.engine_image.docker_build, timed; returns its log."""
    free = free_gb()
    assert free >= MIN_FREE_GB, f"building {slot.tag} needs about {MIN_FREE_GB} GB free for Docker, {free:.1f} GB is"

    def on_step(line: str) -> None:
        with capsys.disabled():
            print(f"  [{slot.version}] {line}", flush=True)

    request = docker_build.BuildRequest(str(info["context"]), slot.tag, str(info["inputs_digest"]), timeout=5400)
    result = docker_build.build(CommandHost(), request, slot.log, on_step)
    log = slot.log.read_text()
    assert not result.failure, f"{result.failure}\n{log[-4000:]}"
    assert result.built
    size_gb = int(docker("image", "inspect", "--format", "{{.Size}}", slot.tag).stdout.strip()) / 1e9
    line = (f"vllm-cuda (pip base, vLLM {slot.version}) cold build: {result.seconds:.0f} s, image {size_gb:.1f} GB, "
            f"log {slot.log}")  # fmt: skip
    slot.timings.lines.append(line)
    with capsys.disabled():
        print(f"\n  {line}", flush=True)
    return log


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("with_ca", [False, True], ids=["certifi", "ca-bundle"])
def test_pip_base_renders_hadolint_clean_with_torch_in_its_own_layer(
    version: str, with_ca: bool, tmp_path: Path
) -> None:
    """Seconds, no build: what the pip base renders, and that the default vllm-cuda still pins the official image."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    base = profiles.PipBase(testbed.BASE_IMAGE, engine_version=version, ca_bundle=bundle if with_ca else None)
    digest = "sha256:" + "0" * 64
    text = dockerfile.render(profiles.profile("vllm-cuda"), patch_digest=digest, drafter_digest=digest, base=base)
    (tmp_path / "Dockerfile").write_text(text)
    lint = subprocess.run([str(HADOLINT), "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    torch = re.search(r"^RUN python3 -m venv /opt/engine \\\n && (?:PIP_CERT=\S+ )?/opt/engine/bin/pip install "
                      r"--no-cache-dir (torch==[\d.]+)$", text, re.M)  # fmt: skip
    assert torch, text
    metadata = next(wheels.release_sources("vllm", version).glob("*.dist-info/METADATA")).read_text()
    assert f"Requires-Dist: {torch[1]}\n" in metadata  # vLLM's own exact pin
    assert text.index(torch[1]) < text.index(f"pip install --no-cache-dir vllm=={version}")
    assert f'io.specdeploy.engine-version="{version}"' in text
    assert ("COPY pip-ca.pem /tmp/pip-ca.pem" in text) == with_ca
    official = dockerfile.render(profiles.profile("vllm-cuda"), patch_digest=digest, drafter_digest=digest,
                                   base_digest=digest)  # fmt: skip
    assert f"ARG BASE_IMAGE=vllm/vllm-openai:v{pins.VLLM_CUDA}@{digest}" in official
    assert "/opt/engine/bin/pip install" not in official


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_cuda_image_from_pypi_supports_eagle3(
    version: str, slot: Slot, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    info, drafter_digest = prepare(slot, tmp_path)
    log = build(slot, info, capsys)

    # The engine and patch layers ran (not from the cache), and the build's verify said what it must.
    cached = [step for step in cached_steps(log) if "pip install" in step or "specdeploy.patches" in step]
    assert not cached, f"not built cold, these steps came from the cache: {cached}"
    for line in (*PATCH_LINES[version], *COMMON_LINES):
        assert line in log, f"{line!r} is not in the build log:\n{log[-4000:]}"
    assert (
        f"EAGLE-3 drafters are accepted for deepseek_v3, kimi_k2 and kimi_k25 targets by the source (vllm {version};"
        in log
    )

    # The build listed the FlashInfer kernels the image carries (engine_side.flashinfer_kernels), in
    # the engine's interpreter: its FlashInfer version and each ahead-of-time kernel package.
    said = [line.strip() for line in log.splitlines() if "FlashInfer: " in line or "flashinfer-cubin" in line
            or "flashinfer-jit-cache" in line or "no ahead-of-time kernels" in line]  # fmt: skip
    with capsys.disabled():
        print(f"  [{version}] FlashInfer in the build log: {said}", flush=True)
    assert any("FlashInfer: flashinfer-python" in line for line in said), log[-4000:]

    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", slot.tag).stdout)
    assert labels["io.specdeploy.profile"] == "vllm-cuda"
    assert labels["io.specdeploy.engine-version"] == version
    assert labels["io.specdeploy.patch-digest"] == info["patch_digest"]
    assert labels["io.specdeploy.drafter-digest"] == drafter_digest
    assert run_in(slot.tag, "cat", "/opt/drafter/config.json").stdout.startswith("{")

    # The finished image, asked directly: the CUDA builds of torch and vLLM, and SupportsEagle3.
    probe = run_in(slot.tag, ENGINE_PYTHON, "-c", PROBE)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = last_json(probe.stdout)
    with capsys.disabled():
        print(f"  [{version}] import probe in the image: {json.dumps(seen)}", flush=True)
    assert seen["vllm"] == version
    assert seen["torch_cuda"], f"torch {seen['torch']} is not a CUDA build"
    assert seen["supports_eagle3"] == dict.fromkeys(CLASSES, True)

    # ... and through specdeploy's own verify (AST checks + the same probe), as a deploy would.
    verify = run_in(slot.tag, "/opt/specdeploy/bin/python", "-m", "specdeploy.patches", "verify", "--engine", "vllm",
                    "--site-packages", SITE, "--python", ENGINE_PYTHON, "--json")  # fmt: skip
    report = last_json(verify.stdout)
    assert verify.returncode == 0 and report["accepted"] is True, verify.stdout + verify.stderr[-3000:]
    assert report["import_probe"] == "passed" and report["findings"] == []

    if PATCH_LINES[version][0].startswith("patched"):
        # The probe can say no: the released (unpatched) model files, mounted over the patched
        # ones, turn both classes back to supports_eagle3() False in the same image.
        pristine = wheels.release_sources("vllm", version)
        volumes = tuple(f"{pristine / rel}:{SITE}/{rel}:ro" for rel in (vllm_eagle3.DEEPSEEK_V2, vllm_eagle3.KIMI_K25))
        unpatched = run_in(slot.tag, ENGINE_PYTHON, "-c", PROBE, volumes=volumes)
        assert unpatched.returncode == 0, unpatched.stderr[-3000:]
        assert last_json(unpatched.stdout)["supports_eagle3"] == dict.fromkeys(CLASSES, False)
