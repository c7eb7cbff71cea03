"""The engine Dockerfile rendered from docker/engine.Dockerfile.j2 (the link beside this module
ships it in the wheel), and the build context the controller prepares for the build host (wheelhouse,
specdeploy wheel)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jinja2

from specdeploy import __version__, names, pins
from specdeploy.engine_image import flashinfer, profiles, source, wheels
from specdeploy.engine_image.profiles import (
    DIGEST,
    DRAFTER_DIR,
    PIP_CA,
    SGL_KERNEL_BUILD_MODES,
    TOOL_REQUIREMENTS,
    PipBase,
    Profile,
    base_image,
    expected_patch_digest,
    pip_profile,
)
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir


def render(
    prof: Profile,
    *,
    patch_digest: str,
    drafter_digest: str,
    base_digest: str | None = None,
    sgl_kernel_build: str = "auto",
    base: PipBase | None = None,
    sgl_kernel_requirement: str | None = None,
    loader_requirements: tuple[str, ...] = (),
    flashinfer_kernels: str = "",
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
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
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
        uv_version=pins.UV,
        engine_requirements=prof.engine_requirements,
        unwanted_packages=prof.unwanted_packages,
        sgl_kernel_build=sgl_kernel_build if prof.engine == "sglang" else "never",
        sgl_kernel_requirement=sgl_kernel_requirement or "sglang-kernel",
        sgl_kernel_max_jobs=2,
        system_packages=prof.system_packages,
        engine_python=prof.engine_python,
        engine_distribution=prof.distribution,
        engine_version=prof.version,
        runtime_imports=list(prof.runtime_imports),
        engine=prof.engine,
        cpu_shim=prof.cpu_shim,
        tool_requirements=TOOL_REQUIREMENTS,
        py_spy_requirement=f"py-spy=={pins.PY_SPY}",
        patch_digest=patch_digest,
        drafter_dir=DRAFTER_DIR,
        loader_requirements=loader_requirements,
        # "" none, "download" vLLM's own download, else a folder's wheels (engine_image.flashinfer)
        flashinfer_kernels=flashinfer_kernels,
        flashinfer_folder=flashinfer.CONTEXT_FOLDER,
        labels={
            names.PROFILE_LABEL: prof.name,
            names.ENGINE_LABEL: prof.engine,
            names.ENGINE_VERSION_LABEL: prof.version,
            names.PATCH_DIGEST_LABEL: patch_digest,
            names.DRAFTER_DIGEST_LABEL: drafter_digest,
            names.VERSION_LABEL: __version__,
        },
    )


def engine_wheelhouse(prof: Profile) -> Path:
    """The wheels a wheelhouse profile's engine installs from, and uv, which installs them: one download
    (a tar under .state/wheelhouses) for the image's context and the test bed's model maker, which
    takes its torch and transformers from the same wheels."""
    requirements = [*prof.engine_requirements, f"uv=={pins.UV}"]
    key = hashlib.sha256(json.dumps([requirements, prof.python_version]).encode()).hexdigest()[:12]
    return wheels.wheelhouse_tar(f"engine-{prof.name}-{key}", requirements, prof.python_version)


def context_dir(prof: Profile, drafter_digest: str, base: PipBase | None = None) -> Path:
    """One context per profile and drafter, so hosts building different drafters never share one."""
    name = prof.name if base is None else f"{prof.name}-pip-{pip_profile(prof, base).version}"
    return state_dir() / "build" / f"{name}-{drafter_digest[7:19]}"


def prepare_context(
    prof: Profile,
    dest: Path,
    *,
    drafter_digest: str,
    base_digest: str | None,
    sgl_kernel_build: str,
    wheel: Path | None,
    base: PipBase | None = None,
    loader_requirements: tuple[str, ...] = (),
    flashinfer_kernels: str = "",
) -> dict[str, object]:
    """Fill DEST with everything but the drafter: Dockerfile, wheelhouse, specdeploy wheels,
    FlashInfer's kernel wheels when a folder of them is given. One host at a time: the fleet's hosts
    share the controller's context (the same drafter), and two writers of one wheelhouse.tar tear it."""
    with wheels.exclusive(dest.parent / f".{dest.name}.lock"):
        return _prepare(prof, dest, drafter_digest=drafter_digest, base_digest=base_digest,
                        sgl_kernel_build=sgl_kernel_build, wheel=wheel, base=base,
                        loader_requirements=loader_requirements, flashinfer_kernels=flashinfer_kernels)  # fmt: skip


def _prepare(prof: Profile, dest: Path, *, drafter_digest: str, base_digest: str | None, sgl_kernel_build: str,
             wheel: Path | None, base: PipBase | None, loader_requirements: tuple[str, ...],
             flashinfer_kernels: str) -> dict[str, object]:  # fmt: skip
    refused = flashinfer.problems(prof, flashinfer_kernels)
    if refused:
        raise SpecdeployError("; ".join(refused), hint=flashinfer.HINT)
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
        sgl_kernel_requirement=profiles.sglang_kernel_requirement(built) if built.engine == "sglang" else None,
        loader_requirements=loader_requirements,
        flashinfer_kernels=flashinfer.mode(flashinfer_kernels),
    )
    prof = built
    dest.mkdir(parents=True, exist_ok=True)
    (dest / PIP_CA).unlink(missing_ok=True)
    if base is not None and base.ca_bundle is not None:
        shutil.copyfile(base.ca_bundle, dest / PIP_CA)
    # Markers sit outside the context, so they are not sent to the build.
    marker, stamp = dest.parent / f".{dest.name}.wheelhouse", dest.parent / f".{dest.name}.inputs"
    wanted = json.dumps([prof.engine_requirements, TOOL_REQUIREMENTS, pins.PY_SPY, pins.UV, prof.python_version])
    complete = (dest / "wheelhouse.tar").is_file() or not prof.install_from_wheelhouse
    if not complete or not marker.is_file() or marker.read_text() != wanted:
        (dest / "wheelhouse.tar").unlink(missing_ok=True)
        stamp.unlink(missing_ok=True)
        shutil.rmtree(dest / "specdeploy-wheels", ignore_errors=True)
        if prof.install_from_wheelhouse:
            wheels.place(engine_wheelhouse(prof), dest / "wheelhouse.tar")
        wheels.pip_download(
            [*TOOL_REQUIREMENTS, f"py-spy=={pins.PY_SPY}"], dest / "specdeploy-wheels", prof.python_version
        )
        if prof.engine == "sglang":
            wheels.pip_download(
                [f"nvidia-cuda-cuobjdump=={pins.CUOBJDUMP}"], dest / "tools-wheelhouse", prof.python_version
            )
        marker.write_text(wanted)
    if prof.engine == "sglang":
        (dest / "sglang-source").mkdir(exist_ok=True)  # an operator's sglang.tar.gz goes here (air-gapped)
    kernels = flashinfer.fill(dest, flashinfer_kernels)
    # Everything the build reads but the drafter (whose digest is in the Dockerfile's labels): an
    # image labelled with this digest needs no rebuild, and its context no new copy. The specdeploy
    # package counts by its source digest (or the given wheel's bytes), so no wheel is built to hash.
    inputs = hashlib.sha256(dockerfile.encode() + wanted.encode() + kernels.encode())
    if (dest / PIP_CA).is_file():
        inputs.update((dest / PIP_CA).read_bytes())
    inputs.update(hashlib.sha256(wheel.read_bytes()).digest() if wheel else source.package_digest().encode())
    digest = "sha256:" + inputs.hexdigest()
    if not stamp.is_file() or stamp.read_text() != digest:
        stamp.unlink(missing_ok=True)
        for old in (dest / "specdeploy-wheels").glob("specdeploy-*.whl"):
            old.unlink()
        shutil.copy2(wheel or source.specdeploy_wheel(), dest / "specdeploy-wheels")
        (dest / "Dockerfile").write_text(dockerfile)
        stamp.write_text(digest)
    return {"profile": prof.name, "patch_digest": patch_digest, "context": str(dest),
            "inputs_digest": digest}  # fmt: skip
