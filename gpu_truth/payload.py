"""The engine payload for the lent GPU machine, made here (it has PyPI; the GPU machine has no network).

    python gpu_truth/payload.py vllm      # or sglang; writes .gpu-payload/<engine>/

1. The release: the one pinned in src/specdeploy/pins.yaml (`engines.<engine>_cuda`; `--release`
   overrides). Where its wheel's own `Requires-Dist` refuses the GPU machine's torch, torch is carried
   at the version it pins, with what torch's own `Requires-Dist` names that the machine lacks, as the
   recipe says (TORCH_CARRIED: triton, NCCL); what the machine has at another version and is kept is
   named with the reason (TORCH_KEPT). `--machine-torch`: the old choice instead, the newest release
   admitting the machine's torch (read from each wheel's METADATA by HTTP range requests), and torch
   never carried.
2. The wheel set: pip's resolver (`--dry-run --report`) for that release on the machine's platform
   (CPython 3.12, manylinux x86_64), with the machine's own packages as constraints, so the set
   fits what is installed there; a package the engine pins to another version is let go (it is
   carried and shadows the machine's copy on PYTHONPATH), and so is, when torch is carried, one whose
   own Requires-Dist refuses the carried torch (torchvision: built against the machine's).
3. Left out: what the machine already has at the resolved version, and what the engine itself
   treats as optional (each with the reason, in the recipe below), with whatever only they need.
4. Chunks of <= 48 MiB (the device tool carries 64 MiB a run, the checkout included; 60 MiB parts
   were refused there on 2026-12-05 with a 3.9 MB checkout) and their
   SHA256SUMS, plus manifest.json saying what is carried and what was left out, and why.

Test-bed tooling (the GPU truth harness): never shipped in the wheel or an engine image.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PINS = yaml.safe_load((ROOT / "src" / "specdeploy" / "pins.yaml").read_text())
OUT = ROOT / ".gpu-payload"
INDEX = "https://pypi.org/simple"
CHUNK = 48 * 1024**2
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]
MARKERS = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip


@dataclass(frozen=True)
class Recipe:
    """One engine: what is asked for, and what is left out with the engine's own reason."""

    package: str
    # name -> why the engine runs without it (read in the engine's source; file named)
    optional: dict[str, str] = field(default_factory=dict)
    # wheel name -> members dropped from it, with the reason
    trim: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    # machine packages let go (carried at the version the engine's set needs), with the reason
    release: dict[str, str] = field(default_factory=dict)
    # carried beside the engine: py-spy, so a stalled engine is dumped there too (the watchdog's stacks);
    # each at its pin in pins.yaml (tools, or loaders for a weight loader's package)
    also: tuple[str, ...] = ("py-spy",)
    # Debian packages carried as .deb files into .gpu-payload/tools (`dpkg -x` there, never into /), each
    # at the version pins.yaml gives its role (host.serving_<name>_version or host.monitoring_<name>_version).
    # Prometheus: the gate's measuring call asks the dashboard's queries of it (gpu_truth/live_panels.py).
    debs: tuple[str, ...] = ("prometheus",)
    # packages the machine has in another form (a metapackage whose content it holds): name -> of
    assume: dict[str, str] = field(default_factory=dict)
    # torch carried: what torch's requirements name is carried beside it, or kept from the machine; why
    torch_carried: dict[str, str] = field(default_factory=lambda: dict(TORCH_CARRIED))
    torch_kept: dict[str, str] = field(default_factory=lambda: dict(TORCH_KEPT))


# Torch carried (a pinned release refuses the machine's torch): what torch's own Requires-Dist names
# at a version the machine does not have is either carried (at torch's pin, or the nearest later
# release of the same major when the index lacks it) or kept from the machine, each with the reason.
# A CUDA library in neither is refused: the recipe must say which.
TORCH_CARRIED: dict[str, str] = {
    "triton": "torch's own Requires-Dist pins it: torch.compile and the engine's Triton kernels need the "
    "Triton that torch was built with",
    "nvidia-nccl-cu13": "torch 2.14.0 + triton 3.8.0 alone fail at import against the machine's NCCL 2.28.9: "
    "'libtorch_cuda.so: undefined symbol: ncclCommResume'; adding nvidia-nccl-cu13 fixed it (H200, 2026-12-03)",
}
TORCH_KEPT: dict[str, str] = {
    "cuda-toolkit": "a metapackage with no files of its own: the libraries its extras pin are compared one by "
    "one (nvidia-cublas, nvidia-cuda-runtime, ...)",
    "nvidia-cudnn-cu13": "only cuDNN calls fail ('PyTorch was compiled against (9, 24, 0) but found runtime "
    "version (9, 19, 0)', H200 2026-12-03), and the LLM decode path makes none (no convolutions; attention "
    "is FlashAttention/FlashInfer/MLA kernels); carry nvidia-cudnn-cu13 if a cuDNN call is ever needed",
    "nvidia-cublas": "the same cuBLAS 13.1 (libcublas.so.13) a patch release older: torch 2.14.0's bf16 matmul, "
    "torch.compile and SDPA ran on the machine's copy (H200, 2026-12-03)",
    "nvidia-cusparselt-cu13": "2:4 structured-sparse matmul only (torch's semi-structured sparsity), which "
    "the LLM decode path does not call; the same 0.8 series",
}


RECIPES = {
    "vllm": Recipe(
        package="vllm",
        # the loads step (gpu_truth/loads.py): vLLM's runai_streamer loader needs its package (the wheel's
        # `runai` extra; fastsafetensors and instanttensor it requires itself), and the product's prewarm
        # and the cold cases need vmtouch
        also=("py-spy", "runai-model-streamer"),
        debs=("vmtouch", "prometheus"),
        optional={  # read in vllm 0.26.0's own source
            "nvidia-cutlass-dsl": "CuTe DSL kernels: every use is behind vllm/utils/import_utils.py has_cutedsl()",
            "tilelang": "vllm/utils/import_utils.py has_tilelang(): 'the optional tilelang package'",
            # its cu13 extra would carry nvcc 13.5 and NVVM: a second CUDA toolchain beside the machine's
            "humming-kernels": "mixed-precision (INT4) kernels: has_humming(), 'the optional humming package'",
            "tokenspeed-mla": "an MLA backend: vllm/v1/attention/backends/mla/tokenspeed_mla.py try-imports it "
            "and reports the backend unavailable ('not installed'); another MLA backend is chosen",
            "opentelemetry-sdk": "tracing: vllm/tracing/otel.py imports OpenTelemetry in try/except",
            "opentelemetry-api": "tracing, as above",
            "opentelemetry-exporter-otlp": "tracing, as above",
            "opentelemetry-semantic-conventions-ai": "tracing, as above",
            "torchcodec": "video decoding: vllm/utils/import_utils.py check_torchcodec_available(), 'optional'",
            "pynvvideocodec": "NVDEC video decoding: imported inside vllm/multimodal/video.py's loader only",
        },
        assume={"cuda-python": "cuda-bindings"},  # cuda-python is a metapackage of cuda-bindings and cuda-core
        trim={
            "vllm": (
                ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",),
                "FlashAttention 2 is for GPUs before Hopper; on SM90 vLLM picks FA3 "
                "(vllm/vllm_flash_attn/flash_attn_interface.py: FA3 when supported)",
            )
        },
    ),
    "sglang": Recipe(
        package="sglang",
        optional={  # read in sglang 0.5.23's own source (its wheel); no module-level import of any of these
            # is reached from sglang.launch_server, the scheduler, DeepseekV2/KimiK25 and their EAGLE-3 drafter,
            # the FA3/Triton attention backends, the Marlin INT4 MoE or sglang.benchmark.serving
            "tilelang": "TileLang kernels for DSA (DeepSeek-V3.2), DeepSeek-V4 and MiniCPM attention: `import "
            "tilelang` only atop sglang/kernels/ops/attention/dsa/tilelang_kernel.py (and dsv4/, quantization/"
            "act_quant_tilelang.py, srt/layers/attention/minicpm/fuse_kernel.py), each imported inside a function "
            "(srt/layers/attention/dsa/dsa_indexer_kpool.py:1064, minicpm/backend.py:311)",
            "decord2": "video decoding: asked only on aarch64/armv7l; sglang/srt/utils/video_decoder.py:78 imports "
            "decord inside the decoder, as the fallback when torchcodec is missing",
            "torchcodec": "video/audio decoding: sglang/srt/utils/video_decoder.py:10-15 imports it in try/except "
            "(ImportError, RuntimeError) and falls back to decord; srt/utils/common.py:1948 only when it was found",
            "nvidia-cutlass-dsl": "CuTe DSL kernels (Blackwell MLA/MoE/DSA, FA4, quack): FlashInfer 0.7.2 probes it "
            "(flashinfer/cute_dsl/availability.py: a top-level import 'would make import flashinfer hard-require "
            "nvidia-cutlass-dsl'; flashinfer/__init__.py:179 contextlib.suppress(ImportError)); SGLang imports its "
            "CuTe kernels inside functions or after importlib.util.find_spec('cutlass') "
            "(srt/layers/attention/linear/kda_backend.py:1735)",
            "humming-kernels": "mixed-precision kernels for `--quantization humming` and MXFP4 MoE: "
            "sglang/srt/layers/quantization/humming.py:54 _lazy_import_humming() ('Please install it to use "
            "`--quantization humming`'), srt/layers/moe/moe_runner/humming.py:48-55 try/except "
            "ModuleNotFoundError; compressed-tensors INT4 MoE runs on Marlin (compressed_tensors_wNa16_moe.py:424). "
            "Its cu13 extra would carry nvcc/NVVM 13.5: a second CUDA toolchain beside the machine's",
        },
        assume={"cuda-python": "cuda-bindings"},
        # tokenizers is no longer let go: sglang 0.5.23 pins tokenizers==0.23.2 (the machine's) and its
        # transformers 5.19.0 asks tokenizers>=0.23.1,<0.24.0 (transformers/dependency_versions_table.py:76).
    ),
}


# ---------------------------------------------------------------- the index


def _wheels(client: httpx.Client, package: str) -> list[dict[str, Any]]:
    resp = client.get(f"{INDEX}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    resp.raise_for_status()
    return [f for f in resp.json()["files"] if f["filename"].endswith(".whl") and not f.get("yanked")]


def _fits(filename: str) -> bool:
    """A wheel the machine's CPython 3.12 on x86_64 installs."""
    tags = filename[:-4].split("-")[-3:]
    python, abi, platform = tags
    py_ok = python in ("py3", "cp312") or (python.startswith("cp3") and abi == "abi3" and int(python[3:]) <= 12)
    return py_ok and (platform == "any" or any(p in platform.split(".") for p in PLATFORMS))


class _RemoteFile(io.RawIOBase):
    """A remote file read by HTTP range requests in 1 MiB blocks: enough for zipfile to list a
    wheel and read one member without downloading it."""

    BLOCK = 1024**2

    def __init__(self, client: httpx.Client, url: str, size: int) -> None:
        self._client, self._url, self._size, self._pos = client, url, size, 0
        self._blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence] + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        got = bytearray()
        while len(got) < want:
            index, skip = divmod(self._pos + len(got), self.BLOCK)
            if index not in self._blocks:
                first = index * self.BLOCK
                last = min(self._size, first + self.BLOCK) - 1
                self._blocks[index] = self._client.get(self._url, headers={"Range": f"bytes={first}-{last}"}).content
            got += self._blocks[index][skip : skip + want - len(got)]
        buffer[: len(got)] = got
        self._pos += len(got)
        return len(got)


def _remote_metadata(client: httpx.Client, url: str, size: int) -> str:
    """A wheel's METADATA, read without downloading the wheel (PyPI serves no separate metadata for it)."""
    with zipfile.ZipFile(io.BufferedReader(_RemoteFile(client, url, size), buffer_size=64 * 1024)) as wheel:
        name = next(n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        return wheel.read(name).decode()


def requires(metadata: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The Requires-Dist lines that apply on the machine (no extra, or one of `extras`)."""
    out = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            envs = [{**MARKERS, "extra": e} for e in ("", *extras)]
            if req.marker is None or any(Marker(str(req.marker)).evaluate(env) for env in envs):
                out.append(req)
    return out


def pick_release(client: httpx.Client, package: str, torch: str) -> tuple[str, list[str]]:
    """The newest release whose own torch requirement admits the machine's torch; the log of why."""
    by_version: dict[Version, dict[str, Any]] = {}
    for f in _wheels(client, package):
        version = Version(f["filename"].split("-")[1])
        if _fits(f["filename"]) and not version.is_prerelease:
            by_version.setdefault(version, f)
    log = []
    for version in sorted(by_version, reverse=True):
        wheel = by_version[version]
        torch_reqs = [r for r in requires(_remote_metadata(client, wheel["url"], wheel["size"]))
                      if canonicalize_name(r.name) == "torch"]  # fmt: skip
        spec = ", ".join(str(r.specifier) for r in torch_reqs) or "(no torch requirement)"
        ok = all(r.specifier.contains(torch, prereleases=True) for r in torch_reqs)
        log.append(f"{package} {version}: torch {spec} -> {'admits' if ok else 'refuses'} {torch}")
        if ok:
            return str(version), log
    raise SystemExit(f"no {package} release admits torch {torch}:\n" + "\n".join(log))


# ---------------------------------------------------------------- the machine


def machine_packages(path: Path) -> dict[str, str]:
    """The GPU machine's `pip freeze` (name==version lines), captured there by gpu_truth/probe.sh."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[canonicalize_name(name)] = version.strip()
    return out


# ---------------------------------------------------------------- torch: the machine's, or carried


def _installable(filename: str) -> bool:
    """As _fits, a compressed python tag (`py2.py3`) read tag by tag (cuda-toolkit's wheels carry one)."""
    python, abi, platform = filename[:-4].split("-")[-3:]
    return any(_fits(f"x-0-{tag}-{abi}-{platform}.whl") for tag in python.split("."))


def index_wheels(client: httpx.Client, name: str) -> dict[Version, dict[str, Any]]:
    """A wheel the machine installs for each final release of `name` on the index."""
    out: dict[Version, dict[str, Any]] = {}
    for f in _wheels(client, name):
        version = Version(f["filename"].split("-")[1])
        if _installable(f["filename"]) and not version.is_prerelease:
            out.setdefault(version, f)
    return out


def metadata_of(client: httpx.Client, name: str, version: str) -> str:
    wheel = index_wheels(client, name)[Version(version)]
    return _remote_metadata(client, wheel["url"], wheel["size"])


def carry_version(client: httpx.Client, req: Requirement) -> tuple[str, str]:
    """The version of `req` to carry: the newest on the index it admits, or, if the index has none (a
    pin it lacks), the nearest later release of the same major (same soname); and a note when so."""
    versions = sorted(index_wheels(client, req.name))
    admitted = [v for v in versions if req.specifier.contains(v, prereleases=True)]
    if admitted:
        return str(admitted[-1]), ""
    pins = [Version(s.version) for s in req.specifier if s.operator in ("==", "===")]
    later = [v for v in versions if pins and v > pins[0] and v.release[0] == pins[0].release[0]]
    if not later:
        raise SystemExit(f"{req}: no release of {req.name} on the index to carry ({[str(v) for v in versions]})")
    return str(later[0]), f" ({req.name}=={pins[0]} is not on the index: the nearest later release of the same major)"


@dataclass
class TorchPlan:
    """The torch the engine runs on there: the machine's, or one carried with what it needs."""

    machine: str
    carried: str | None
    why: str
    carry: dict[str, str] = field(default_factory=dict)  # name -> version, fetched as real wheels (torch too)
    carried_why: dict[str, str] = field(default_factory=dict)  # "name==version" -> why (beside torch)
    kept: dict[str, str] = field(default_factory=dict)  # machine library -> why it is kept
    specs: list[str] = field(default_factory=list)  # torch's other requirements, for pip to resolve
    requirements: list[Requirement] = field(default_factory=list)  # all of torch's, the toolkit's expanded


def torch_requirements(client: httpx.Client, metadata: str) -> list[Requirement]:
    """torch's requirements on the machine, a CUDA metapackage's extras expanded into what they pin
    (cuda-toolkit[cublas,...] names nvidia-cublas==..., each compared with the machine's own)."""
    out = []
    for req in requires(metadata):
        out.append(req)
        if req.extras and NEVER_RELEASED.match(canonicalize_name(req.name)):
            version, _ = carry_version(client, req)
            for sub in requires(metadata_of(client, req.name, version), tuple(sorted(req.extras))):
                if str(sub) not in map(str, out):
                    out.append(sub)
    return out


def plan_torch(client: httpx.Client, recipe: Recipe, release: str, machine: dict[str, str],
               may_carry: bool) -> TorchPlan:  # fmt: skip
    """Whether the release's own torch requirement admits the machine's torch; if not (and carrying is
    allowed), torch at the version it pins and, from torch's own requirements, what is carried beside
    it and what is kept from the machine (the recipe's torch_carried / torch_kept, with the reasons)."""
    machine_torch = machine["torch"].split("+")[0]
    engine_reqs = requires(metadata_of(client, recipe.package, release))
    torch_reqs = [r for r in engine_reqs if canonicalize_name(r.name) == "torch"]
    spec = ", ".join(str(r.specifier) for r in torch_reqs) or "(no torch requirement)"
    if all(r.specifier.contains(machine_torch, prereleases=True) for r in torch_reqs):
        return TorchPlan(machine_torch, None, f"{recipe.package} {release} asks torch {spec}: "
                         f"the machine's {machine_torch} admits it")  # fmt: skip
    if not may_carry:
        raise SystemExit(f"{recipe.package} {release} asks torch {spec}, refusing the machine's {machine_torch}, "
                         "and --machine-torch never carries torch")  # fmt: skip
    torch, _ = carry_version(client, Requirement(f"torch{spec}"))
    plan = TorchPlan(machine_torch, torch, f"{recipe.package} {release} asks torch {spec}, refusing the "
                     f"machine's {machine_torch}: torch {torch} is carried")  # fmt: skip
    plan.carry["torch"] = torch
    plan.requirements = torch_requirements(client, metadata_of(client, "torch", torch))
    for req in plan.requirements:
        name = canonicalize_name(req.name)
        on_machine = name in machine and req.specifier.contains(machine[name].split("+")[0], prereleases=True)
        if not NEVER_RELEASED.match(name):
            plan.specs.append(f"{req.name}{req.specifier}")  # pip's to resolve, with the engine's set
        elif on_machine or name in plan.carry:
            continue
        elif name in recipe.torch_carried:
            version, note = carry_version(client, req)
            plan.carry[name] = version
            plan.carried_why[f"{name}=={version}"] = f"torch {torch} asks {req.specifier}, the machine has " \
                f"{machine.get(name, 'none')}: {recipe.torch_carried[name]}{note}"  # fmt: skip
        elif name in recipe.torch_kept:
            plan.kept[name] = f"torch {torch} asks {req.specifier}, the machine has {machine.get(name, 'none')}, " \
                f"kept: {recipe.torch_kept[name]}"  # fmt: skip
        else:
            raise SystemExit(f"torch {torch} asks {req}; the machine has {name} {machine.get(name, 'none')}: "
                             "say in the recipe (torch_carried or torch_kept) whether it is carried or kept, "
                             "and why")  # fmt: skip
    return plan


def torch_bound(client: httpx.Client, on_machine: list[str], torch: str) -> dict[str, str]:
    """Machine packages of the engine's set whose own Requires-Dist refuses the carried torch (read from
    their wheels on the index): built against the machine's torch, they would break beside the carried one
    (torchvision 0.26.0 asks torch==2.11.0 and its _C.so is that torch's; SGLang 0.5.23 asks torchvision
    unpinned, so pip keeps the machine's). Each is let go, and pip carries a version that admits it."""
    out = {}
    for pin in on_machine:
        name, version = pin.split("==", 1)
        if NEVER_RELEASED.match(name):
            continue
        try:
            metadata = metadata_of(client, name, version)
        except (KeyError, httpx.HTTPStatusError):  # no wheel of it for the machine on the index: nothing to read
            continue
        asks = [r for r in requires(metadata) if canonicalize_name(r.name) == "torch"]
        refused = [str(r) for r in asks if not r.specifier.contains(torch, prereleases=True)]
        if refused:
            out[name] = f"{name} {version} asks {', '.join(refused)}, refusing the carried torch {torch}"
    return out


def direct_specs(reqs: list[Requirement], optional: set[str]) -> list[str]:
    """The release's own requirements as they apply on the machine, markers already read, for pip:
    pip reads markers with the interpreter it runs on, not --python-version's (vLLM 0.33.0's
    `setuptools<81; python_version > "3.11"` was lost under this machine's Python 3.11)."""
    return [f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}" for r in reqs
            if canonicalize_name(r.name) not in optional]  # fmt: skip


def unmet(reqs: list[Requirement], have: dict[str, str], excused: set[str]) -> list[str]:
    """The requirements neither the payload nor the machine meets (`have`: name -> version there
    after install), less those left out or kept on purpose (`excused`)."""
    out = []
    for req in reqs:
        name = canonicalize_name(req.name)
        version = have.get(name)
        if name in excused:
            continue
        if version is None or not req.specifier.contains(version.split("+")[0], prereleases=True):
            out.append(f"{req} (there: {version or 'nothing'})")
    return out


# ---------------------------------------------------------------- resolve, select, fetch


def _stub(folder: Path, name: str, version: str, label: str = "machine") -> None:
    """A wheel with no requirements, standing for a package the machine already has: its version
    carries a local label (`+machine`), so pip prefers it to the index's copy of that version and
    never walks the machine's own dependencies (torch's CUDA libraries, for one)."""
    dist = f"{name.replace('-', '_')}-{version}+{label}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}+{label}\n")
        whl.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}.dist-info/RECORD", "")


def resolve(specs: list[str], machine: dict[str, str], optional: dict[str, str], work: Path,
            carried: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """pip's own resolver for the machine's platform, the machine's packages held at their
    versions, the optional ones left empty and torch's carried set held at its versions (all as
    stubs: their own needs are never walked; the carried ones are fetched as real wheels after);
    returns the report's install items."""
    carried = carried or {}
    stubs = work / "machine"
    stubs.mkdir()
    for name, version in machine.items():
        if name not in carried:
            _stub(stubs, name, version.split("+")[0])
    for name, version in optional.items():
        _stub(stubs, name, version, "optional")
    for name, version in carried.items():
        _stub(stubs, name, version, "carried")
    cfile = work / "constraints.txt"
    held = {**{n: v for n, v in machine.items() if n not in carried}, **optional, **carried}
    cfile.write_text("".join(f"{n}=={v.split('+')[0]}\n" for n, v in sorted(held.items())))
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
           "--report", str(work / "report.json"), "--target", str(work / "target"), "--only-binary=:all:",
           "--python-version", PYTHON, "--implementation", "cp", *platforms, "--find-links", str(stubs),
           "-c", str(cfile), *specs]  # fmt: skip
    # This machine's pip config (local wheel folders, a torch cap) is not the GPU machine's.
    env = {**{k: v for k, v in os.environ.items() if k in ("PATH", "PIP_CERT", "SSL_CERT_FILE")},
           "PIP_CONFIG_FILE": "/dev/null", "HOME": str(work)}  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise Conflict(done.stdout + done.stderr)
    return list(json.loads((work / "report.json").read_text())["install"])


class Conflict(Exception):
    """pip found no set: its own account of the conflict."""

    def machine_package(self) -> tuple[str, str] | None:
        """The machine package at the heart of it, and the requirement that refuses its version."""
        text = str(self)
        held = re.search(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==", text)
        if not held:
            return None
        name = canonicalize_name(held.group(1))
        needs = [line.strip() for line in text.splitlines() if re.search(rf"depends on {re.escape(held.group(1))}\b",
                 line, re.IGNORECASE)]  # fmt: skip
        # the release's (or carried torch's) own requirements, given to pip directly (direct_specs)
        needs += [f"{line.strip()} (the release's or torch's own requirement)" for line in text.splitlines()
                  if re.search(rf"The user requested {re.escape(held.group(1))}[^A-Za-z0-9._-]", line, re.IGNORECASE)
                  and "(constraint)" not in line]  # fmt: skip
        return name, "; ".join(needs) or "pip's conflict"


# The machine's CUDA stack is torch's: carrying another copy would shadow what torch was built with.
# A conflict never lets these go; only torch carrying does, deliberately, by the recipe (plan_torch).
NEVER_RELEASED = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def resolve_releasing(specs: list[str], machine: dict[str, str], optional: dict[str, str], released: dict[str, str],
                      carried: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Resolve; a machine package the engine's set needs at another version is let go (carried at
    that version, shadowing the machine's on PYTHONPATH) and the reason recorded in `released`."""
    for _ in range(20):
        held = {n: v for n, v in machine.items() if n not in released}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return resolve(specs, held, optional, Path(tmp), carried)
            except Conflict as conflict:
                found = conflict.machine_package()
                if found is None or found[0] in released or NEVER_RELEASED.match(found[0]):
                    raise SystemExit(
                        f"pip could not resolve {specs} for the GPU machine:\n{str(conflict)[-3000:]}"
                    ) from None
                released[found[0]] = found[1]
                print(f"released {found[0]} {machine[found[0]]} from the machine: {found[1]}")
    raise SystemExit(f"{specs}: more than 20 machine packages conflict")


def select(items: list[dict[str, Any]], recipe: Recipe) -> dict[str, Any]:
    """What to carry: every package of pip's set that is neither a machine stub (already there at
    that version) nor an optional one's stub nor torch's carried set (fetched as real wheels beside).
    Optional packages were stubs during the resolution, so whatever only they need never entered the set."""
    carry, on_machine = [], []
    for item in items:
        version = item["metadata"]["version"]
        if version.endswith("+machine"):
            on_machine.append(f"{canonicalize_name(item['metadata']['name'])}=={version.split('+')[0]}")
        elif not version.endswith(("+optional", "+carried")):
            carry.append(item)
    return {"carry": carry, "on_machine": sorted(on_machine), "left_out": dict(recipe.optional)}


def optional_versions(client: httpx.Client, recipe: Recipe, release: str) -> dict[str, str]:
    """For each optional package the engine asks for by name: the newest version its requirement
    admits (the stub pip is given in its place)."""
    engine = next(
        f for f in _wheels(client, recipe.package) if _fits(f["filename"]) and f"-{release}-" in f["filename"]
    )
    wanted = {canonicalize_name(r.name): r for r in requires(_remote_metadata(client, engine["url"], engine["size"]))}
    out: dict[str, str] = {}
    for name in map(canonicalize_name, recipe.optional):
        if name in wanted:
            versions = sorted({Version(f["filename"].split("-")[1]) for f in _wheels(client, name)}, reverse=True)
            fits = [v for v in versions if wanted[name].specifier.contains(v, prereleases=True)]
            out[name] = str(fits[0] if fits else versions[0])
    return out


def resolve_set(client: httpx.Client, specs: list[str], machine: dict[str, str], *, optional: dict[str, str],
                released: dict[str, str], recipe: Recipe, torch_plan: TorchPlan) -> dict[str, Any]:  # fmt: skip
    """pip's set for the machine (select's carry / on_machine / left_out) and, when torch is carried, the
    set again without the machine packages built against the machine's torch (torch_bound: let go)."""
    chosen = select(resolve_releasing(specs, machine, optional, released, torch_plan.carry), recipe)
    while torch_plan.carried and (bound := torch_bound(client, chosen["on_machine"], torch_plan.carried)):
        for name, reason in bound.items():
            print(f"released {name} {machine[name]} from the machine: {reason}")
        released |= bound
        chosen = select(resolve_releasing(specs, machine, optional, released, torch_plan.carry), recipe)
    return chosen


def fetch(client: httpx.Client, item: dict[str, Any], folder: Path) -> Path:
    url: str = item["download_info"]["url"]
    want = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    path = folder / url.rsplit("/", 1)[1]
    if not (path.is_file() and want and hashlib.sha256(path.read_bytes()).hexdigest() == want):
        data = client.get(url).content
        if want and hashlib.sha256(data).hexdigest() != want:
            raise SystemExit(f"{path.name}: sha256 differs from the index's")
        path.write_bytes(data)
    return path


def trim(path: Path, members: tuple[str, ...]) -> int:
    """The wheel without `members` (and their RECORD lines); returns the bytes saved."""
    before = path.stat().st_size
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        missing = [m for m in members if m not in names]
        if missing:
            raise SystemExit(f"{path.name}: the members to trim are not there ({missing}): re-read the engine")
        for info in src.infolist():
            if info.filename in members:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if line.split(b",", 1)[0].decode() not in members)  # fmt: skip
            dst.writestr(info, data)
    path.write_bytes(buffer.getvalue())
    return before - path.stat().st_size


def payload_tar(wheels: Path) -> bytes:
    """The wheels as one tar whose bytes depend on the wheels alone: its sha256 keys the GPU machine's
    engine cache (`on_device.py`), so a payload rebuilt from the same wheels must keep it (a tar with the
    download's mtimes and owner made a new key, and a cold cache, for every rebuild: 2026-12-07)."""

    def reproducible(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for whl in sorted(wheels.iterdir()):
            tar.add(whl, arcname=f"wheels/{whl.name}", filter=reproducible)
    return buffer.getvalue()


def pinned_release(engine: str) -> str:
    """The release pins.yaml deploys on CUDA (engines.<engine>_cuda)."""
    return str(PINS["engines"][f"{engine}_cuda"])


def choose_release(client: httpx.Client, engine: str, release: str | None,
                   machine_torch: str | None) -> tuple[str, list[str]]:  # fmt: skip
    """`--release`; else, given the machine's torch (`--machine-torch`), the newest release admitting
    it; else the release pins.yaml deploys. With the log of why."""
    package = RECIPES[engine].package
    if release:
        return release, [f"{package} {release}: --release"]
    if machine_torch:
        return pick_release(client, package, machine_torch)
    return pinned_release(engine), [f"{package} {pinned_release(engine)}: pins.yaml engines.{engine}_cuda"]


def _index_item(client: httpx.Client, name: str, version: str) -> dict[str, Any]:
    """A carried wheel of torch's set as pip's report would name it (for fetch)."""
    wheel = index_wheels(client, name)[Version(version)]
    return {"metadata": {"name": name, "version": version},
            "download_info": {"url": wheel["url"], "archive_info": {"hashes": wheel.get("hashes", {})}}}  # fmt: skip


def write_parts(out: Path, data: bytes) -> int:
    """The payload in CHUNK-sized parts with their SHA256SUMS (the whole first: on_device checks both)."""
    for old in out.glob("part-*"):
        old.unlink()
    sums = [f"{hashlib.sha256(data).hexdigest()}  payload.tar"]
    for n, start in enumerate(range(0, len(data), CHUNK)):
        part = out / f"part-{n:02d}"
        part.write_bytes(data[start : start + CHUNK])
        sums.append(f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}")
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return len(sums) - 1


def pinned(name: str) -> str:
    """NAME's pin in pins.yaml: a tool's, or a weight loader's package."""
    key = name.replace("-", "_")
    found = PINS["tools"].get(key) or PINS["loaders"].get(key)
    if not found:
        raise SystemExit(f"{name}: no pin in src/specdeploy/pins.yaml (tools or loaders)")
    return str(found)


def deb_pin(name: str) -> str:
    """The Debian package NAME's version, as pins.yaml gives it to the role that installs it."""
    pins = PINS["host"]
    found = pins.get(f"serving_{name}_version") or pins.get(f"monitoring_{name}_version")
    if not found:
        raise SystemExit(f"{name}: no pin in src/specdeploy/pins.yaml (host.serving_* or host.monitoring_*)")
    return str(found)


def fetch_debs(names: tuple[str, ...], folder: Path) -> list[str]:
    """The Debian packages NAMES as .deb files in FOLDER (`apt-get download`), each at its pin."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.deb"):
        old.unlink()
    for name in names:
        want = deb_pin(name)
        subprocess.run(["apt-get", "download", f"{name}={want}"], cwd=folder, check=True, capture_output=True)
    return sorted(p.name for p in folder.glob("*.deb"))


def resplit(out: Path) -> Path:
    """Parts made at another CHUNK cut again, without fetching: the whole is checked against SHA256SUMS."""
    data = b"".join(p.read_bytes() for p in sorted(out.glob("part-*")))
    want = (out / "SHA256SUMS").read_text().split()[0]
    if hashlib.sha256(data).hexdigest() != want:
        raise SystemExit(f"{out}: the parts do not join into the payload SHA256SUMS names; build it again")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["parts"] = write_parts(out, data)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


def build(engine: str, machine_file: Path, torch_version: str | None, release: str | None = None,
          machine_torch: bool = False) -> Path:  # fmt: skip
    recipe = RECIPES[engine]
    machine = machine_packages(machine_file)
    if torch_version:
        machine["torch"] = torch_version
    torch = machine["torch"].split("+")[0]
    out = OUT / engine
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with httpx.Client(timeout=120, follow_redirects=True) as client:
        version, why = choose_release(client, engine, release, torch if machine_torch else None)
        torch_plan = plan_torch(client, recipe, version, machine, may_carry=not machine_torch)
        why.append(torch_plan.why)
        print("\n".join(why))
        for name, reason in {**torch_plan.carried_why, **torch_plan.kept}.items():
            print(f"  {name}: {reason}")
        released: dict[str, str] = {canonicalize_name(n): why for n, why in recipe.release.items()}
        machine |= {canonicalize_name(n): machine[canonicalize_name(of)] for n, of in recipe.assume.items()}
        optional = optional_versions(client, recipe, version)
        engine_reqs = requires(metadata_of(client, recipe.package, version))
        specs = [f"{recipe.package}=={version}", *(f"{n}=={pinned(n)}" for n in recipe.also),
                 *direct_specs(engine_reqs, set(optional)), *torch_plan.specs]  # fmt: skip
        chosen = resolve_set(
            client, specs, machine, optional=optional, released=released, recipe=recipe, torch_plan=torch_plan
        )
        chosen["carry"] += [_index_item(client, n, v) for n, v in torch_plan.carry.items()]
        # Nothing the release (or the carried torch) asks for is missing there: carried, on the machine,
        # left out with the engine's reason, or kept with the recipe's.
        have = {n: v for n, v in machine.items() if n not in released and n not in torch_plan.carry}
        have |= {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in chosen["carry"]}
        missing = unmet(engine_reqs + torch_plan.requirements, have,
                        set(map(canonicalize_name, recipe.optional)) | set(torch_plan.kept))  # fmt: skip
        if missing:
            raise SystemExit(f"{engine} {version}: not met there:\n" + "\n".join(missing))
        for old in wheels.iterdir():
            old.unlink()
        trimmed = {}
        for item in chosen["carry"]:
            path = fetch(client, item, wheels)
            name = canonicalize_name(item["metadata"]["name"])
            if name in recipe.trim:
                members, reason = recipe.trim[name]
                trimmed[path.name] = {"members": list(members), "saved_bytes": trim(path, members), "why": reason}
    data = payload_tar(wheels)
    parts = write_parts(out, data)
    debs = fetch_debs(recipe.debs, OUT / "tools")
    manifest = {
        "engine": engine, "release": version, "release_choice": why,
        "torch": {"machine": torch_plan.machine, "carried": torch_plan.carried, "why": torch_plan.why},
        "carried_cuda_libraries": torch_plan.carried_why, "kept_from_machine": torch_plan.kept,
        "requirements_unmet": missing,
        "carried": sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in chosen["carry"]),
        "on_machine": chosen["on_machine"], "left_out": chosen["left_out"], "trimmed": trimmed,
        "released_from_machine": released, "bytes": len(data), "parts": parts,
        "debs": {name: "carried as .gpu-payload/tools/" + name for name in debs},
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{engine} {version}: {len(chosen['carry'])} wheels, {len(data) / 1024**2:.0f} MiB in {parts} "
          f"parts under {out.relative_to(ROOT)} (left out: {', '.join(chosen['left_out']) or 'nothing'})")  # fmt: skip
    return out


# The gate at full depth (docs/gpu-truth.md), one device call each, every one bounded under the
# device's 10-minute limit (SIGINT: the harness stops its engine and keeps what it measured) and packed
# into one file ($OUT returns 8 files at most, 2 folders down).
GATE_CALLS = (("spec-off", "--baseline"), ("acc2.3", "--acceptance 2.3"), ("acc1.6", "--acceptance 1.6"))
GATE_BOUND_S = 570  # of the per-call 600 s: the stop and the pack after it take ~5 s
# Each configuration measured twice (two sweeps of one READY engine, each its own crossover line): the
# H100 baseline's two sweeps agreed within 3 % at every level (2026-12-06).
REPEATS = 2
# The engine-cache subfolders worth carrying to the next session's machine (gpu_truth/carried_cache.py):
# SGLang 0.5.23's JIT kernels (its WNA16 Marlin MoE build: 229 s on the H100, over 400 s on the H200).
CARRY_CACHE = {"sglang": ("sglang-jit",)}


def rust_measured(baseline_file: str) -> bool:
    """vLLM's gate runs its Rust client (on_device.RUST_CLIENT: ~20 s less a client run) unless the carried
    baseline was measured by another client: a sweep divides only by a baseline of the same client."""
    if not baseline_file:
        return True
    sys.path.insert(0, str(ROOT))
    from gpu_truth.on_device import RUST_CLIENT  # noqa: PLC0415

    return bool(json.loads((ROOT / baseline_file).read_text()).get("client") == RUST_CLIENT)


def plan(
    engine: str,
    out: Path,
    release: str = "",
    *,
    budget_s: int | None = None,
    gates: tuple[str, ...] = tuple(tag for tag, _ in GATE_CALLS),
    baseline_file: str = "",
    loads: tuple[str, ...] = (),
) -> list[str]:
    """The device calls, in order, while the machine stays warm (30 s idle gives it back, and with
    it everything outside the checkout): one part per call, the install with the last, then two
    calls per gate on the full-depth model form (its engine started, then measured). BUDGET_S
    (status's budget_left_s) bounds the last gate call when below a session's; GATES: the gate calls
    this session holds; BASELINE_FILE: a kept baseline.json of an earlier session, for speculative
    calls on a machine without its own; LOADS: the loaders whose load on real files this session times
    (gpu_truth/loads.py: one call each, the files written and read by dd in the first)."""
    parts = sorted(p.name for p in out.glob("part-*"))
    rel = out.relative_to(ROOT)
    step = "python3 gpu_truth/on_device.py"
    calls = []
    for n, part in enumerate(parts):
        vmtouch = sorted((out.parent / "tools").glob("vmtouch_*.deb")) if loads else []
        tools = [str(d.relative_to(ROOT)) for d in vmtouch]
        carry = [f"{rel}/{part}", *([f"{rel}/SHA256SUMS", f"{rel}/manifest.json", *tools] if n == 0 else [])]
        # The first call reads status's budget; the next one the budget left in the first one's answer.
        given = {0: f" --budget {budget_s}" if budget_s is not None else "", 1: " --left LEFT"}.get(n, "")
        command = f"{step} receive{given}" + (f" && {step} install {engine}" if n == len(parts) - 1 else "")
        calls.append(f"run carry={json.dumps(carry)} command={command!r}")
    cached = out.parent / "carried-cache"
    carried_cache = (json.loads((cached / "manifest.json").read_text()) if (cached / "manifest.json").is_file()
                     else {"engine": None})  # fmt: skip
    if carried_cache["engine"] == engine:  # an earlier machine's cache: its parts travel like the payload's
        rel_cache = cached.relative_to(ROOT)
        for n, part in enumerate(sorted(p.name for p in cached.glob("part-*"))):
            carry = [
                f"{rel_cache}/{part}",
                *([f"{rel_cache}/SHA256SUMS", f"{rel_cache}/manifest.json"] if n == 0 else []),
            ]
            calls.insert(len(parts) - 1 + n, f"run carry={json.dumps(carry)} command={step + ' receive'!r}")
    # else the first measured start's cache goes back with its measuring call, for the next session
    # The dashboards' Prometheus (gpu_truth/live_panels.py, 19 MB): a call of its own before the install,
    # since a part and it together would outgrow a call's 64 MiB.
    if any(tag in gates for tag, _ in GATE_CALLS):
        for deb in sorted((out.parent / "tools").glob("prometheus_*.deb")):
            carry = [str(deb.relative_to(ROOT))]
            calls.insert(len(calls) - 1, f"run carry={json.dumps(carry)} command={step + ' receive'!r}")
    cache_out = "".join(f" --only {sub}" for sub in CARRY_CACHE.get(engine, ()))
    keep_cache = f"; {step} cache-out {engine}{cache_out}" if cache_out and carried_cache["engine"] != engine else ""
    version = f" --engine-version {release}" if release else ""
    # The first start may outrun its call (kernels built there, or a carried cache the engine rejects): a
    # second up call watches it on to its verdict, at once when it is READY.
    again = True
    carried = f" --baseline-file {baseline_file}" if baseline_file else ""
    client = " --rust-client" if engine == "vllm" and rust_measured(baseline_file) else ""
    bound = f"timeout -s INT $({step} bound {GATE_BOUND_S})"
    for tag, asked in ((t, h) for t, h in GATE_CALLS if t in gates):
        how = asked if asked == "--baseline" else asked + carried
        # SGLang: its two Marlin MoE JIT variants built at once before the start (on_device.prebuild_jit):
        # built one after the other by the engine they took ~600 s of a cold H100 start (2026-12-07).
        prebuild = " --prebuild-jit" if engine == "sglang" else ""
        gate = (f"PYTHONUNBUFFERED=1 {bound} {step} gate {engine} --inventory inventories/gpu-h200-full-depth "
                f"--form full-depth --dummy-load{version}{prebuild}{client} {how}")  # fmt: skip
        # A cold full-depth start took 442 s of a call's 570 (H100, 2026-12-05): the start gets a call
        # and leaves the engine READY (its own process session outlives the call); the next measures it.
        # `stop --keep-starting`: an engine an earlier up call left still starting is watched on, not stopped
        up = f"{step} stop --keep-starting; {gate} --phase up; rc=$?; {step} pack {tag}-up; exit $rc"
        measure = (
            f"{gate} --phase measure --repeat {REPEATS}; rc=$?; {step} stop; {step} pack {tag}{keep_cache}; exit $rc"
        )
        keep_cache = ""  # once: the first measured start built what the later ones reuse
        calls.append(f"run timeout_s=600 command={up!r}")
        if again:  # a cold first start may outrun its call: watched on to its verdict (at once when READY)
            calls.append(f"run timeout_s=600 command={up.split('; ', 1)[1]!r}")
            again = False
        calls.append(f"run timeout_s=600 command={measure!r}")
    for n, loader in enumerate(loads):
        write = " --write" if n == 0 else ""
        timed = f"PYTHONUNBUFFERED=1 {bound} {step} loads {engine}{write} --loader {loader}"
        command = f"{step} stop; {timed}; rc=$?; {step} stop; {step} pack loads-{loader}; exit $rc"
        calls.append(f"run timeout_s=600 command={command!r}")
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(RECIPES))
    parser.add_argument("--machine", type=Path, default=ROOT / "gpu_truth" / "machines" / "nvidia-h200.txt",
                        help="the GPU machine's pip freeze (gpu_truth/probe.sh reads it there)")  # fmt: skip
    parser.add_argument("--torch", help="the machine's torch (default: from --machine)")
    parser.add_argument("--release", help="the engine release (default: pins.yaml engines.<engine>_cuda)")
    parser.add_argument("--machine-torch", action="store_true",
                        help="the newest release admitting the machine's torch; torch never carried")  # fmt: skip
    parser.add_argument(
        "--resplit",
        action="store_true",
        help="cut the built payload's parts again at the current part size, fetching nothing",
    )
    parser.add_argument("--budget", type=int, help="status's budget_left_s, when less than a session's 1800 s")
    parser.add_argument("--gates", default=",".join(t for t, _ in GATE_CALLS), help="the gate calls to plan")
    parser.add_argument("--baseline-file", default="", help="a baseline.json kept in the checkout (speculative calls)")
    parser.add_argument("--loads", default="", help="loaders timed on real files: auto,fastsafetensors,runai_streamer")
    parser.add_argument("--plan-only", action="store_true", help="the device calls of the payload built before")
    args = parser.parse_args()
    if args.plan_only:
        out = OUT / args.engine
        if not (out / "manifest.json").is_file():
            raise SystemExit(f"no payload under {out.relative_to(ROOT)}: make gpu-truth ENGINE={args.engine} first")
    elif args.resplit:
        out = resplit(OUT / args.engine)
    else:
        out = build(args.engine, args.machine, args.torch, args.release, args.machine_torch)
    print(
        "\nThe device calls (docs/gpu-truth.md). Send the first ALONE: when no machine comes, each call of a\n"
        "batch is refused at 15 s of device time (2026-12-05: 32 refusals cost 645 s). Once it has answered,\n"
        "send the rest in messages of about a dozen calls, each at once when the one before has answered: the\n"
        "machine goes back 30 s after a call, and 38 calls took longer than that to send (2026-12-07). LEFT\n"
        "is the first answer's budget_left_s:"
    )
    release = json.loads((out / "manifest.json").read_text())["release"]
    gates = tuple(args.gates.split(","))
    loads = tuple(filter(None, args.loads.split(",")))
    print("\n".join(plan(args.engine, out, release, budget_s=args.budget, gates=gates,
                         baseline_file=args.baseline_file, loads=loads)))  # fmt: skip


if __name__ == "__main__":
    main()
