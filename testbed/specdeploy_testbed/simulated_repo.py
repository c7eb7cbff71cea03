"""A local apt repository of *simulated* stand-in packages for provisioning a simulated SM120 host.

Nothing here is NVIDIA software. The packages carry the real names and pinned versions, so the
nvidia_driver, cuda_toolkit and container_runtime roles install, pin and hold them exactly as they
would the real ones, but what they ship is simulated:

- `nvidia-driver-580-open`: the simulated nvidia-smi replayer (`specdeploy_testbed.simulated_gpu`) with its
  files for 8x RTX PRO 6000 Blackwell on the open kernel module, and
  /usr/share/specdeploy-simulated/driver-version, shaped like /proc/driver/nvidia/version (which
  only a loaded kernel module provides). `nvidia-driver-580` (proprietary module) and
  `nvidia-driver-550-open` (a branch too old for SM120) exist for the negative tests.
- `nvidia-persistenced`: a unit whose daemon sleeps, so the service really runs.
- `cuda-toolkit-12-9`: a simulated nvcc that "compiles" for known architectures only.
- `nvidia-container-toolkit` (+ `-base`, `libnvidia-container1`, `libnvidia-container-tools`): a
  simulated nvidia-ctk that merges the nvidia runtime into daemon.json as the real one does, and
  writes a small CDI spec.

The .debs are made with `dpkg-deb --build`, indexed with `dpkg-scanpackages`, and cached by content
under state_dir()/simulated-apt/<hash>.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy import pins
from specdeploy.controller_packages import ensure_command
from specdeploy.errors import SpecdeployError
from specdeploy.gpu.facts import KernelModule
from specdeploy.paths import state_dir
from specdeploy_testbed.simulated_gpu import render_all, replayer_script

# The pins the roles' defaults use (specdeploy/pins.yaml, real releases); the simulation ships them.
DRIVER_VERSION: str = pins.host_pin("nvidia_driver_version")
OLD_DRIVER_VERSION = "550.163.01"  # R550: predates Blackwell support
CUDA_VERSION: str = pins.host_pin("cuda_toolkit_version")
CUDA_PACKAGE_VERSION: str = pins.host_pin("cuda_toolkit_package_version")
TOOLKIT_VERSION: str = pins.host_pin("container_runtime_nvidia_toolkit_version")
GPU_COUNT = 8
SIMULATED_DIR = "/usr/share/specdeploy-simulated"
# Fixed timestamps, so the same inputs give byte-identical .debs and index.
_EPOCH = 1767225600  # 2026-01-01T00:00:00Z
_RELEASE_DATE = "Thu, 01 Jan 2026 00:00:00 UTC"
_FORMAT = "specdeploy-simulated-apt/1"  # bump when the build itself changes
_MAINTAINER = "specdeploy simulated stand-ins <simulated@specdeploy.invalid>"
_DRIVERS = ("nvidia-driver-580-open", "nvidia-driver-580", "nvidia-driver-550-open")


@dataclass(frozen=True)
class SimulatedFile:
    text: str
    mode: int = 0o644


@dataclass(frozen=True)
class SimulatedPackage:
    name: str
    version: str
    summary: str
    files: dict[str, SimulatedFile] = field(default_factory=dict)
    depends: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.name}_{self.version}_amd64.deb"

    def control(self) -> str:
        lines = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            "Architecture: amd64",
            f"Maintainer: {_MAINTAINER}",
            "Section: simulated",
            "Priority: optional",
        ]
        if self.depends:
            lines.append(f"Depends: {', '.join(self.depends)}")
        if self.conflicts:
            lines += [f"Conflicts: {', '.join(self.conflicts)}", f"Replaces: {', '.join(self.conflicts)}"]
        lines += [
            f"Description: SIMULATED stand-in: {self.summary}",
            " Built by specdeploy_testbed.simulated_repo for tests on a simulated SM120 host.",
            " It contains no NVIDIA software and drives no GPU.",
        ]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- simulated programs

NVCC = r"""#!/bin/sh
# Simulated nvcc (CUDA @CUDA@): checks the arguments like the real one and writes an executable
# stub that prints "simulated <arch> kernel ran". No compiler, no GPU code.
set -eu
known="sm_75 sm_80 sm_86 sm_87 sm_89 sm_90 sm_90a sm_100 sm_100a sm_100f sm_101 sm_101a sm_103 sm_103a"
known="$known sm_120 sm_120a sm_120f sm_121 sm_121a"
arch=sm_75 out=a.out src=
while [ $# -gt 0 ]; do
  case "$1" in
    --version|-V)
      echo "nvcc: NVIDIA (R) Cuda compiler driver (simulated stand-in)"
      echo "Cuda compilation tools, release @CUDA@ (simulated)"
      exit 0 ;;
    -arch=*|--gpu-architecture=*) arch=${1#*=} ;;
    -arch|--gpu-architecture) shift; arch=${1:-} ;;
    -o|--output-file) shift; out=${1:-} ;;
    -*) ;;
    *.cu) src=$1 ;;
    *) echo "nvcc fatal   : Don't know what to do with '$1'" >&2; exit 1 ;;
  esac
  shift
done
[ -n "$src" ] || { echo "nvcc fatal   : No input files specified" >&2; exit 1; }
[ -r "$src" ] || { echo "nvcc fatal   : Could not open input file '$src'" >&2; exit 1; }
case " $known " in
  *" $arch "*) ;;
  *) echo "nvcc fatal   : Unsupported gpu architecture '$arch' (simulated nvcc @CUDA@)" >&2; exit 1 ;;
esac
grep -q '__global__' "$src" || { echo "simulated nvcc: $src defines no __global__ kernel" >&2; exit 1; }
printf '#!/bin/sh\necho "simulated %s kernel ran"\n' "$arch" > "$out"
chmod 0755 "$out"
"""

NVIDIA_CTK = r'''#!/usr/bin/python3
"""Simulated nvidia-ctk (NVIDIA Container Toolkit @VERSION@): the two commands provisioning uses.

`runtime configure --runtime=docker` merges the nvidia runtime into daemon.json, keeping every other
key, as the real one does. `cdi generate` writes a CDI spec for the GPUs the (simulated) nvidia-smi
lists; `cdi list` prints the devices of the specs in /etc/cdi and /var/run/cdi.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")


def fail(message):
    print(f"ERRO[0000] {message}", file=sys.stderr)
    return 1


def write_atomically(path, text):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nvidia-ctk-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def runtime_configure(args):
    if args.runtime != "docker":
        return fail(f"the simulated nvidia-ctk only configures docker, not {args.runtime}")
    path = args.config or "/etc/docker/daemon.json"
    try:
        with open(path) as handle:
            config = json.load(handle)
    except FileNotFoundError:
        config = {}
    except ValueError as error:
        return fail(f"unable to load config {path}: {error}")
    if not isinstance(config, dict):
        return fail(f"unable to load config {path}: not a JSON object")
    runtimes = config.setdefault("runtimes", {})
    runtimes[args.nvidia_runtime_name] = {"args": [], "path": args.nvidia_runtime_path}
    if args.set_as_default:
        config["default-runtime"] = args.nvidia_runtime_name
    if args.cdi_enabled:
        config.setdefault("features", {})["cdi"] = True
    text = json.dumps(config, indent=4) + "\n"
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    write_atomically(path, text)
    print(f"INFO[0000] Wrote updated config to {path}")
    print("INFO[0000] It is recommended that docker daemon be restarted.")
    return 0


def listed_gpus():
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi -L failed: {done.stderr.strip()}")
    return [m.groups() for m in re.finditer(r"^GPU (\d+): .* \(UUID: (\S+)\)$", done.stdout, re.M)]


def cdi_generate(args):
    try:
        gpus = listed_gpus()
    except (OSError, RuntimeError) as error:
        return fail(f"failed to generate CDI spec: {error}")
    if not gpus:
        return fail("failed to generate CDI spec: no GPUs found")
    lines = [
        "---",
        "# Simulated CDI spec, written by the simulated nvidia-ctk @VERSION@ (no real device nodes).",
        "cdiVersion: 0.5.0",
        "kind: nvidia.com/gpu",
        "devices:",
    ]
    for index, uuid in gpus:
        lines += [
            f'  - name: "{index}"  # {uuid}',
            "    containerEdits:",
            "      deviceNodes:",
            f"        - path: /dev/nvidia{index}",
        ]
    lines += ["  - name: all", "    containerEdits:", "      deviceNodes:"]
    lines += [f"        - path: /dev/nvidia{index}" for index, _ in gpus]
    lines += [
        "containerEdits:",
        "  deviceNodes:",
        "    - path: /dev/nvidiactl",
        "    - path: /dev/nvidia-uvm",
        "  env:",
        "    - NVIDIA_VISIBLE_DEVICES=void",
    ]
    write_atomically(args.output, "\n".join(lines) + "\n")
    print(f"INFO[0000] Generated CDI spec with version 0.5.0 for {len(gpus)} GPUs")
    return 0


def cdi_list(_args):
    devices = []
    for directory in SPEC_DIRS:
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            if not name.endswith((".yaml", ".yml")):
                continue
            with open(os.path.join(directory, name)) as handle:
                text = handle.read()
            kind = re.search(r"^kind: *(\S+)", text, re.M)
            if kind:
                names = re.findall(r'^  - name: *"?([^"\s]+)"?', text, re.M)
                devices += [f"{kind.group(1)}={device}" for device in names]
    print(f"INFO[0000] Found {len(devices)} CDI devices")
    for device in devices:
        print(device)
    return 0


def main():
    parser = argparse.ArgumentParser(prog="nvidia-ctk", description="simulated nvidia-ctk @VERSION@")
    version = "NVIDIA Container Toolkit CLI version @VERSION@ (simulated)"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", required=True)
    runtime = commands.add_parser("runtime").add_subparsers(dest="sub", required=True)
    configure = runtime.add_parser("configure")
    configure.add_argument("--runtime", default="docker")
    configure.add_argument("--config")
    configure.add_argument("--nvidia-runtime-name", default="nvidia")
    configure.add_argument("--nvidia-runtime-path", default="nvidia-container-runtime")
    configure.add_argument("--set-as-default", action="store_true")
    configure.add_argument("--cdi.enabled", dest="cdi_enabled", action="store_true")
    configure.add_argument("--dry-run", action="store_true")
    configure.set_defaults(func=runtime_configure)
    cdi = commands.add_parser("cdi").add_subparsers(dest="sub", required=True)
    generate = cdi.add_parser("generate")
    generate.add_argument("--output", default="/dev/stdout")
    generate.set_defaults(func=cdi_generate)
    cdi.add_parser("list").set_defaults(func=cdi_list)
    args = parser.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
'''

PERSISTENCED = """#!/bin/sh
# Simulated nvidia-persistenced: there is no GPU to keep initialised, so it only stays alive.
exec sleep infinity
"""

PERSISTENCED_UNIT = """# Simulated nvidia-persistenced unit (specdeploy stand-in): the daemon only sleeps.
[Unit]
Description=NVIDIA Persistence Daemon (simulated)

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

CONTAINER_RUNTIME = """#!/bin/sh
# Simulated nvidia-container-runtime: no GPU hook to add, so it hands over to runc unchanged.
for runc in /usr/sbin/runc /usr/bin/runc; do
  [ -x "$runc" ] && exec "$runc" "$@"
done
echo "simulated nvidia-container-runtime: runc not found" >&2
exit 1
"""


def _doc(name: str) -> dict[str, SimulatedFile]:
    return {f"/usr/share/doc/{name}/README.simulated": SimulatedFile(f"{name}: a simulated stand-in, no content.\n")}


def _driver(name: str, driver: str, cuda: str, module: KernelModule, summary: str) -> SimulatedPackage:
    data_dir = f"{SIMULATED_DIR}/nvidia-smi"
    rendered = render_all(GPU_COUNT, driver_version=driver, cuda_version=cuda, kernel_module=module)
    files = {f"{data_dir}/{file}": SimulatedFile(text) for file, text in rendered.items()}
    files["/usr/bin/nvidia-smi"] = SimulatedFile(replayer_script(data_dir), 0o755)
    # What /proc/driver/nvidia/version says once the module is loaded (a simulated host has no module).
    files[f"{SIMULATED_DIR}/driver-version"] = SimulatedFile(rendered["version"])
    others = tuple(other for other in _DRIVERS if other != name)
    return SimulatedPackage(name, f"{driver}-1", summary, files, conflicts=others)


def packages() -> tuple[SimulatedPackage, ...]:
    """Every simulated package, in a fixed order."""
    cuda_dir = f"/usr/local/cuda-{CUDA_VERSION}"
    toolkit = TOOLKIT_VERSION.split("-", maxsplit=1)[0]
    return (
        _driver(
            "nvidia-driver-580-open",
            DRIVER_VERSION,
            "13.0",
            "open",
            f"NVIDIA driver {DRIVER_VERSION}, open kernel modules, {GPU_COUNT}x RTX PRO 6000 Blackwell",
        ),
        _driver(
            "nvidia-driver-580",
            DRIVER_VERSION,
            "13.0",
            "proprietary",
            f"NVIDIA driver {DRIVER_VERSION}, proprietary kernel module (cannot drive Blackwell)",
        ),
        _driver(
            "nvidia-driver-550-open",
            OLD_DRIVER_VERSION,
            "12.4",
            "open",
            f"NVIDIA driver {OLD_DRIVER_VERSION}, open kernel modules (R550 predates Blackwell)",
        ),
        SimulatedPackage(
            "nvidia-persistenced",
            f"{DRIVER_VERSION}-1",
            "NVIDIA persistence daemon (sleeps)",
            {
                "/usr/bin/nvidia-persistenced": SimulatedFile(PERSISTENCED, 0o755),
                "/lib/systemd/system/nvidia-persistenced.service": SimulatedFile(PERSISTENCED_UNIT),
            },
        ),
        SimulatedPackage(
            f"cuda-toolkit-{CUDA_VERSION.replace('.', '-')}",
            CUDA_PACKAGE_VERSION,
            f"CUDA toolkit {CUDA_VERSION} (a simulated nvcc)",
            {
                f"{cuda_dir}/bin/nvcc": SimulatedFile(NVCC.replace("@CUDA@", CUDA_VERSION), 0o755),
                f"{cuda_dir}/version.json": SimulatedFile(
                    json.dumps({"cuda": {"name": "CUDA SDK (simulated)", "version": CUDA_PACKAGE_VERSION[:-2]}}) + "\n"
                ),
            },
        ),
        SimulatedPackage("libnvidia-container1", TOOLKIT_VERSION, "libnvidia-container", _doc("libnvidia-container1")),
        SimulatedPackage(
            "libnvidia-container-tools",
            TOOLKIT_VERSION,
            "nvidia-container-cli",
            _doc("libnvidia-container-tools"),
            depends=(f"libnvidia-container1 (= {TOOLKIT_VERSION})",),
        ),
        SimulatedPackage(
            "nvidia-container-toolkit-base",
            TOOLKIT_VERSION,
            f"NVIDIA Container Toolkit {toolkit} CLI (a simulated nvidia-ctk)",
            {"/usr/bin/nvidia-ctk": SimulatedFile(NVIDIA_CTK.replace("@VERSION@", toolkit), 0o755)},
            depends=("python3",),
        ),
        SimulatedPackage(
            "nvidia-container-toolkit",
            TOOLKIT_VERSION,
            f"NVIDIA Container Toolkit {toolkit} (a simulated nvidia-container-runtime)",
            {"/usr/bin/nvidia-container-runtime": SimulatedFile(CONTAINER_RUNTIME, 0o755)},
            depends=(
                f"nvidia-container-toolkit-base (= {TOOLKIT_VERSION})",
                f"libnvidia-container-tools (= {TOOLKIT_VERSION})",
            ),
        ),
    )


def content_hash(pkgs: Sequence[SimulatedPackage]) -> str:
    """What the repository is made of: every package's control data and files."""
    digest = hashlib.sha256(_FORMAT.encode())
    for pkg in pkgs:
        digest.update(pkg.control().encode())
        for path, file in sorted(pkg.files.items()):
            digest.update(f"\0{path}\0{file.mode:o}\0".encode())
            digest.update(file.text.encode())
    return digest.hexdigest()[:16]


def _build_deb(pkg: SimulatedPackage, work: Path, out: Path) -> None:
    root = work / pkg.name
    control = root / "DEBIAN" / "control"
    control.parent.mkdir(parents=True)
    control.write_text(pkg.control())
    for path, file in pkg.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file.text)
        target.chmod(file.mode)
    for item in [root, *root.rglob("*")]:
        if item.is_dir():
            item.chmod(0o755)
        os.utime(item, (_EPOCH, _EPOCH))
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(_EPOCH)}
    done = subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out / pkg.filename)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SpecdeployError(f"dpkg-deb --build {pkg.name} failed: {done.stderr.strip()[-500:]}")


def _release(out: Path) -> str:
    """A Release file for the flat repository (unsigned: apt reads it with [trusted=yes] only)."""
    lines = [
        "Origin: specdeploy-simulated",
        "Label: specdeploy simulated stand-ins",
        f"Date: {_RELEASE_DATE}",
        "Architectures: amd64",
        "Description: SIMULATED NVIDIA/CUDA stand-in packages for tests; not NVIDIA software",
    ]
    for label, algorithm in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{label}:")
        for name in ("Packages", "Packages.gz"):
            data = (out / name).read_bytes()
            lines.append(f" {hashlib.new(algorithm, data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def build(out: Path) -> Path:
    """Build the repository into `out` (.debs, Packages, Packages.gz, Release); returns `out`."""
    ensure_command("dpkg-deb", "dpkg")
    ensure_command("dpkg-scanpackages", "dpkg-dev")
    out.mkdir(parents=True, exist_ok=True)
    pkgs = packages()
    with tempfile.TemporaryDirectory(prefix="simulated-apt-") as tmp:
        for pkg in pkgs:
            _build_deb(pkg, Path(tmp), out)
    scanned = subprocess.run(
        ["dpkg-scanpackages", "--multiversion", ".", "/dev/null"],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    if scanned.returncode != 0 or not scanned.stdout.strip():
        raise SpecdeployError(f"dpkg-scanpackages failed in {out}: {scanned.stderr.strip()[-500:]}")
    (out / "Packages").write_text(scanned.stdout)
    with gzip.GzipFile(out / "Packages.gz", "wb", mtime=0) as packed:
        packed.write(scanned.stdout.encode())
    (out / "Release").write_text(_release(out))
    (out / "README.simulated").write_text(
        "A local apt repository of SIMULATED stand-in packages (specdeploy_testbed.simulated_repo).\n"
        "They carry real NVIDIA/CUDA package names and versions but contain no NVIDIA software.\n"
    )
    return out


def ensure_repo() -> Path:
    """The cached repository for the current package definitions, built when missing."""
    cache = state_dir() / "simulated-apt"
    final = cache / content_hash(packages())
    if (final / "Release").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
    try:
        build(staging)
        staging.chmod(0o755)
        staging.rename(final)
    except OSError:
        if not (final / "Release").is_file():  # not a concurrent build that won
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdeploy_testbed.simulated_repo",
        description="Build the local apt repository of SIMULATED NVIDIA/CUDA stand-in packages.",
    )
    parser.add_argument("--out", type=Path, help=f"build into DIR (default: the cache under {state_dir()})")
    args = parser.parse_args(argv)
    try:
        path = build(args.out) if args.out else ensure_repo()
    except SpecdeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    names = ", ".join(f"{pkg.name}={pkg.version}" for pkg in packages())
    print(f"simulated apt repository: {path.resolve()}\n  {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
