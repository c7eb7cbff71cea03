"""The engine image, built for real on a test-bed host (Docker-in-Docker) through site.yml's
build phase: drafter checks, the patch verify inside the build, labels, idempotence, and a
deliberately broken patch set failing the build at its verify step with the root cause."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdeploy.connection import docker_client
from specdeploy.engine_image import profiles
from specdeploy.gate.client import tar_archive
from specdeploy.paths import project_root
from specdeploy.playbook import run_playbook
from specdeploy_testbed import testbed
from tests.e2e import engine

from .helpers import record_timing

pytestmark = pytest.mark.integration
HOST_DIR = "/srv/specdeploy"
TARGET = f"{HOST_DIR}/models/target"


def put_drafter(container, name: str, files: dict[str, bytes], manifest: bool = True) -> str:
    if manifest:
        sums = "".join(f"{hashlib.sha256(data).hexdigest()}  {n}\n" for n, data in sorted(files.items()))
        files = {**files, "SHA256SUMS": sums.encode()}
    container.exec_run(["rm", "-rf", f"{HOST_DIR}/{name}"])
    container.exec_run(["mkdir", "-p", f"{HOST_DIR}/{name}", TARGET])
    assert container.put_archive(f"{HOST_DIR}/{name}", tar_archive(files))
    return f"{HOST_DIR}/{name}"


@pytest.fixture(scope="module")
def host_with_models(testbed_up, docker_client):
    engine.ensure_engine_venv()
    models = engine.ensure_tiny_models()
    container = docker_client.containers.get(testbed.container_name("testbed-1"))
    # Its SHA256SUMS is left out: put_drafter writes the manifest of what it puts.
    drafter = {p.name: p.read_bytes() for p in (models / "drafter").iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    container.exec_run(["mkdir", "-p", TARGET])
    container.put_archive(TARGET, tar_archive({"config.json": (models / "target" / "config.json").read_bytes()}))
    return container, drafter


def build(*extra: str):
    start = time.monotonic()
    model = f"engine_image_target_model_path={TARGET}"
    run = run_playbook(testbed.paths().inventory, "--tags", "engine_image", "-e", model, *extra)
    return run, time.monotonic() - start


def remote():
    tb = testbed.paths()
    return docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base()}", (tb.known_hosts,), tb.key)


def test_vllm_cpu_image_builds_for_real_verifies_and_converges(host_with_models):
    container, drafter = host_with_models
    path = put_drafter(container, "drafter", drafter)
    run, seconds = build("-e", f"engine_image_drafter_path={path}")
    assert run.returncode == 0, run.output[-3000:]
    record_timing("engine image build (vllm-cpu, first in this session)", seconds)
    log_path = re.findall(r"build_log: (\S+)", run.output)[-1]
    if Path(log_path).is_file():  # (a warm test bed may already hold this very image)
        log = Path(log_path).read_text()
        assert "EAGLE-3 drafters are accepted" in log  # specdeploy patch verify ran inside the build
        assert "import probe: passed" in log  # ... with the engine's own torch and vLLM importable
    tag = re.findall(r"tag: (specdeploy/vllm-cpu:\S+)", run.output)[-1]
    engine_host = remote()
    labels = engine_host.images.get(tag).labels
    prof = profiles.profile("vllm-cpu")
    assert labels["io.specdeploy.patch-digest"] == profiles.expected_patch_digest(prof)
    assert labels["io.specdeploy.drafter-digest"].startswith("sha256:")
    assert labels["io.specdeploy.engine-version"] == prof.version
    # The image itself proves its engine: verify (AST checks + import probe) inside it.
    site = "/opt/engine/lib/python3.11/site-packages"
    out = engine_host.containers.run(
        tag,
        ["/opt/specdeploy/bin/python", "-m", "specdeploy.patches", "verify", "--engine", "vllm",
         "--site-packages", site, "--python", "/opt/engine/bin/python"],
        remove=True, stdout=True, stderr=True,
    ).decode()  # fmt: skip
    assert "import probe: passed" in out and "EAGLE-3 drafters are accepted" in out, out
    baked = engine_host.containers.run(tag, ["ls", "/opt/drafter"], remove=True).decode().split()
    assert {"config.json", "model.safetensors", "SHA256SUMS"} <= set(baked), baked

    again, seconds = build("-e", f"engine_image_drafter_path={path}")
    assert again.returncode == 0 and again.recap["testbed-1"]["changed"] == 0, again.output[-3000:]
    record_timing("engine image build (converged rerun)", seconds)


def _sabotaged_wheel(tmp_path: Path) -> Path:
    """specdeploy with a patch set that applies cleanly but breaks EAGLE-3 on vLLM 0.18+."""
    src = tmp_path / "src"
    shutil.copytree(project_root() / "src", src / "src")
    shutil.copy2(project_root() / "pyproject.toml", src)
    shutil.copy2(project_root() / "README.md", src)
    patchset = src / "src/specdeploy/patches/patchset.py"
    text = patchset.read_text()
    text = text.replace("        return VLLM_NATIVE\n", "        return BROKEN_FOR_TEST\n")
    text += """

def _drop_supports_eagle3(module, anchors):
    cls = anchors.top_class(module, "DeepseekV2ForCausalLM")
    kept = [b for b in cls.bases if getattr(b.value, "value", None) != "SupportsEagle3"]
    return module.deep_replace(cls, cls.with_changes(bases=kept))


BROKEN_FOR_TEST = PatchSet(
    "deliberately-broken",
    (FilePatch("drop-eagle3", "vllm/model_executor/models/deepseek_v2.py", "break it", _drop_supports_eagle3),),
    "a test's sabotage",
)
"""
    patchset.write_text(text)
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)], check=True)
    return next(out.glob("specdeploy-*.whl"))


def test_broken_patch_set_fails_the_build_at_verify_with_the_root_cause(host_with_models, tmp_path):
    container, drafter = host_with_models
    path = put_drafter(container, "drafter", drafter)
    run, seconds = build("-e", f"engine_image_drafter_path={path}", "-e",
                         f"engine_image_specdeploy_wheel={_sabotaged_wheel(tmp_path)}")  # fmt: skip
    assert run.returncode != 0
    assert run.recap["testbed-1"]["failed"] == 1
    message = " ".join(run.output[run.output.index("FAILED!") :].split())  # undo YAML line folding
    # The patch layer's RUN (venv, apply, verify) is the failing step.
    assert re.search(r"image build failed at step \d+/\d+ \(RUN python3 -m venv /opt/specdeploy", message), message
    assert re.search(r"deepseek_v2\.py:\d+: class DeepseekV2ForCausalLM does not inherit SupportsEagle3", message)
    # The engine's install (uv's step) came from the cache: a patch change never reinstalls the
    # engine. Judged by the builder's log, not a wall-clock bound.
    build_log = Path(re.findall(r"build_log: (\S+)", run.output)[-1]).read_text()
    wheelhouse = re.search(r"Step \d+/\d+ : ADD wheelhouse.tar .*\n(.*)", build_log)
    install = re.search(r"Step \d+/\d+ : RUN .*uv pip install .*\n(.*)", build_log)
    assert wheelhouse and install, build_log[:3000]
    # Docker reruns a step whose inputs changed: the install is owed to the cache only while the
    # wheelhouse it reads is the same. Once in CI (stop 29) the wheelhouse layer itself was rebuilt
    # between the two builds, and the install with it; the patch change is never the reason.
    if "Using cache" in wheelhouse[1]:
        assert "Using cache" in install[1], build_log[:3000]
    else:
        record_timing("broken patch set: the wheelhouse layer was not cached, so neither was the install", 0.0)
    build_seconds = float(re.search(r"seconds: ([\d.]+)", message)[1])
    record_timing("broken patch set: play failed after", seconds)
    record_timing("broken patch set: docker build failed at verify after", build_seconds)


def test_drafter_with_a_wrong_manifest_is_refused_before_any_build(host_with_models):
    container, drafter = host_with_models
    path = put_drafter(container, "drafter-tampered", drafter)
    container.exec_run(["sh", "-c", f"printf x >> {path}/model.safetensors"])
    run, _ = build("-e", f"engine_image_drafter_path={path}")
    assert run.returncode != 0
    message = " ".join(run.output.split())
    assert "model.safetensors: sha256" in message and "does not match SHA256SUMS" in message
    assert "TASK [engine_image : Build the engine image" not in run.output


def test_a_model_that_is_not_an_eagle3_drafter_is_refused(host_with_models, tmp_path):
    container, _ = host_with_models
    plain = b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "vocab_size": 2048}'
    path = put_drafter(container, "not-a-drafter", {"config.json": plain})
    run, _ = build("-e", f"engine_image_drafter_path={path}")
    assert run.returncode != 0 and "is not an EAGLE-3 drafter" in run.output
