"""The engine payload for the lent GPU machine, made here (it has PyPI; the GPU machine has no network).

    python gpu_truth/payload.py vllm      # or sglang; writes .gpu-payload/<engine>/

1. The release: the newest release of the engine whose wheel's own `Requires-Dist` admits the GPU
   machine's torch (read from each wheel's METADATA by HTTP range requests, newest first).
2. The wheel set: pip's resolver (`--dry-run --report`) for that release on the machine's platform
   (CPython 3.12, manylinux x86_64), with the machine's own packages as constraints, so the set
   fits what is installed there; a package the engine pins to another version is let go (it is
   carried and shadows the machine's copy on PYTHONPATH).
3. Left out: what the machine already has at the resolved version, and what the engine itself
   treats as optional (each with the reason, in the recipe below), with whatever only they need.
4. Chunks of <= 60 MiB (the device tool carries 64 MiB a run, the checkout included) and their
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
CHUNK = 60 * 1024**2
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
    # carried beside the engine: py-spy, so a stalled engine is dumped there too (the watchdog's stacks)
    also: tuple[str, ...] = ("py-spy",)
    # packages the machine has in another form (a metapackage whose content it holds): name -> of
    assume: dict[str, str] = field(default_factory=dict)


RECIPES = {
    "vllm": Recipe(
        package="vllm",
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
        optional={  # read in sglang 0.5.17's own source
            "tilelang": "TileLang kernels (NSA, DeepSeek-V3.2 only): imported lazily",
            "decord2": "video decoding: imported when a video arrives",
            "torchcodec": "video decoding, as above",
            "nvidia-cutlass-dsl": "CuTe DSL kernels: guarded imports",
        },
        assume={"cuda-python": "cuda-bindings"},
        release={
            "tokenizers": "SGLang's pinned transformers refuses the machine's tokenizers 0.23.2 at import "
            "(seen on the H200: 'tokenizers>=0.22.0,<=0.23.0 is required')"
        },
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
    out = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[canonicalize_name(name)] = version.strip()
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


def resolve(specs: list[str], machine: dict[str, str], optional: dict[str, str], work: Path) -> list[dict[str, Any]]:
    """pip's own resolver for the machine's platform, the machine's packages held at their
    versions and the optional ones left empty (both as stubs: their own needs are never walked);
    returns the report's install items."""
    stubs = work / "machine"
    stubs.mkdir()
    for name, version in machine.items():
        _stub(stubs, name, version.split("+")[0])
    for name, version in optional.items():
        _stub(stubs, name, version, "optional")
    cfile = work / "constraints.txt"
    held = {**machine, **optional}
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
        return name, "; ".join(needs) or "pip's conflict"


# The machine's CUDA stack is torch's: carrying another copy would shadow what torch was built with.
NEVER_RELEASED = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")


def resolve_releasing(specs: list[str], machine: dict[str, str], optional: dict[str, str],
                      released: dict[str, str]) -> list[dict[str, Any]]:  # fmt: skip
    """Resolve; a machine package the engine's set needs at another version is let go (carried at
    that version, shadowing the machine's on PYTHONPATH) and the reason recorded in `released`."""
    for _ in range(20):
        held = {n: v for n, v in machine.items() if n not in released}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return resolve(specs, held, optional, Path(tmp))
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
    that version) nor an optional one's stub. Optional packages were stubs during the resolution,
    so whatever only they need never entered the set."""
    carry, on_machine = [], []
    for item in items:
        version = item["metadata"]["version"]
        if version.endswith("+machine"):
            on_machine.append(f"{canonicalize_name(item['metadata']['name'])}=={version.split('+')[0]}")
        elif not version.endswith("+optional"):
            carry.append(item)
    return {"carry": carry, "on_machine": sorted(on_machine), "left_out": dict(recipe.optional)}


def optional_versions(client: httpx.Client, recipe: Recipe, release: str) -> dict[str, str]:
    """For each optional package the engine asks for by name: the newest version its requirement
    admits (the stub pip is given in its place)."""
    engine = next(
        f for f in _wheels(client, recipe.package) if _fits(f["filename"]) and f"-{release}-" in f["filename"]
    )
    wanted = {canonicalize_name(r.name): r for r in requires(_remote_metadata(client, engine["url"], engine["size"]))}
    out = {}
    for name in map(canonicalize_name, recipe.optional):
        if name in wanted:
            versions = sorted({Version(f["filename"].split("-")[1]) for f in _wheels(client, name)}, reverse=True)
            fits = [v for v in versions if wanted[name].specifier.contains(v, prereleases=True)]
            out[name] = str(fits[0] if fits else versions[0])
    return out


def fetch(client: httpx.Client, item: dict[str, Any], folder: Path) -> Path:
    url = item["download_info"]["url"]
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


def build(engine: str, machine_file: Path, torch_version: str | None) -> Path:
    recipe = RECIPES[engine]
    machine = machine_packages(machine_file)
    torch = torch_version or machine["torch"].split("+")[0]
    out = OUT / engine
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with httpx.Client(timeout=120, follow_redirects=True) as client:
        version, why = pick_release(client, recipe.package, torch)
        print("\n".join(why))
        released = {canonicalize_name(n): why for n, why in recipe.release.items()}
        machine |= {canonicalize_name(n): machine[canonicalize_name(of)] for n, of in recipe.assume.items()}
        optional = optional_versions(client, recipe, version)
        specs = [f"{recipe.package}=={version}", *(f"{n}=={PINS['tools'][n.replace('-', '_')]}" for n in recipe.also)]
        items = resolve_releasing(specs, machine, optional, released)
        chosen = select(items, recipe)
        for old in wheels.iterdir():
            old.unlink()
        trimmed = {}
        for item in chosen["carry"]:
            path = fetch(client, item, wheels)
            name = canonicalize_name(item["metadata"]["name"])
            if name in recipe.trim:
                members, reason = recipe.trim[name]
                trimmed[path.name] = {"members": list(members), "saved_bytes": trim(path, members), "why": reason}
    for old in out.glob("part-*"):
        old.unlink()
    tar_path = out / "payload.tar"
    with tarfile.open(tar_path, "w") as tar:
        for whl in sorted(wheels.iterdir()):
            tar.add(whl, arcname=f"wheels/{whl.name}")
    data = tar_path.read_bytes()
    sums = [f"{hashlib.sha256(data).hexdigest()}  payload.tar"]
    for n, start in enumerate(range(0, len(data), CHUNK)):
        part = out / f"part-{n:02d}"
        part.write_bytes(data[start : start + CHUNK])
        sums.append(f"{hashlib.sha256(part.read_bytes()).hexdigest()}  {part.name}")
    tar_path.unlink()
    (out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    manifest = {
        "engine": engine, "release": version, "torch": torch, "release_choice": why,
        "carried": sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in chosen["carry"]),
        "on_machine": chosen["on_machine"], "left_out": chosen["left_out"], "trimmed": trimmed,
        "released_from_machine": released, "bytes": len(data), "parts": len(sums) - 1,
    }  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"{engine} {version}: {len(chosen['carry'])} wheels, {len(data) / 1024**2:.0f} MiB in {len(sums) - 1} "
          f"parts under {out.relative_to(ROOT)} (left out: {', '.join(chosen['left_out']) or 'nothing'})")  # fmt: skip
    return out


def plan(engine: str, out: Path) -> list[str]:
    """The device calls, in order, while the machine stays warm (30 s idle gives it back, and with
    it everything outside the checkout): one part per call, then install and serve."""
    parts = sorted(p.name for p in out.glob("part-*"))
    rel = out.relative_to(ROOT)
    calls = []
    for n, part in enumerate(parts):
        carry = [f"{rel}/{part}", *([f"{rel}/SHA256SUMS", f"{rel}/manifest.json"] if n == 0 else [])]
        command = "python3 gpu_truth/on_device.py receive"
        if n == len(parts) - 1:
            architecture = " --architecture deepseek_v3" if engine == "sglang" else ""
            step = "python3 gpu_truth/on_device.py"
            command += f" && {step} install {engine} && {step} serve {engine}{architecture}"
        calls.append(f"run carry={json.dumps(carry)} command={command!r}")
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(RECIPES))
    parser.add_argument("--machine", type=Path, default=ROOT / "gpu_truth" / "machines" / "nvidia-h200.txt",
                        help="the GPU machine's pip freeze (gpu_truth/probe.sh reads it there)")  # fmt: skip
    parser.add_argument("--torch", help="the machine's torch (default: from --machine)")
    args = parser.parse_args()
    out = build(args.engine, args.machine, args.torch)
    print("\nThe device calls (docs/gpu-truth.md), each within 30 s of the last:")
    print("\n".join(plan(args.engine, out)))


if __name__ == "__main__":
    main()
