"""Preflight checks on GpuFacts: pure functions, each problem says what to do about it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TypedDict

from specdeploy.gpu.facts import Gpu, GpuFacts, GpuProcess, query_gpu_rows

MIN_BLACKWELL_BRANCH = 570  # the first branch with SM100/SM120 support
RECOMMENDED_BRANCH = 580
MIN_BLACKWELL_CUDA = (12, 8)  # the first CUDA with sm_100/sm_120 targets
DRIVER_FIX = (
    f"install nvidia-driver-{RECOMMENDED_BRANCH}-open "
    f"(inventory: nvidia_driver_branch: {RECOMMENDED_BRANCH} with the open kernel modules) and reboot"
)
# Kernel command-line tokens that keep the IOMMU from translating (and so breaking) PCIe peer-to-peer.
IOMMU_OFF_TOKENS = frozenset({"iommu=pt", "intel_iommu=off", "amd_iommu=off"})


class NcclAdvice(TypedDict):
    env: dict[str, str]
    vllm_args: list[str]
    sglang_args: list[str]
    reason: str


def gpu_count_problems(facts: GpuFacts, tp: int, pp: int = 1) -> list[str]:
    """The engine needs tp * pp GPUs on this host."""
    if tp < 1 or pp < 1:
        return [f"tensor/pipeline parallel sizes must be >= 1, got tp={tp} pp={pp}; fix the inventory"]
    need = tp * pp
    if facts.count >= need:
        return []
    problem = (
        f"tp={tp} x pp={pp} needs {need} GPUs but nvidia-smi sees {facts.count}; "
        f"lower tensor_parallel/pipeline_parallel in the inventory or use a host with {need} GPUs"
    )
    if facts.count == 0:
        # A Blackwell GPU under the proprietary module is not enumerated at all.
        problem += (
            "; if the host has Blackwell GPUs, check `dmesg` for 'requires use of the NVIDIA open kernel modules' "
            f"and {DRIVER_FIX}"
        )
    return [problem]


def _blackwell_major(major: int) -> bool:
    """Blackwell: SM100 data centre (10.x) and SM120 RTX PRO/GeForce (12.x)."""
    return major >= 12 or major == 10


def _needs_open_modules(gpu: Gpu) -> bool:
    """Blackwell runs only on the open kernel modules."""
    if gpu.compute_capability is not None:
        return _blackwell_major(gpu.compute_capability[0])
    return gpu.architecture == "Blackwell"


def planned_driver_problems(
    compute_capabilities: Iterable[str], branch: int, open_modules: bool, package: str, version: str
) -> list[str]:
    """What the nvidia_driver role is about to install, judged before it installs anything."""
    blackwell = sorted({cc for cc in compute_capabilities if _blackwell_major(int(str(cc).split(".")[0]))})
    problems: list[str] = []
    what = f"GPUs with compute capability {'/'.join(blackwell)} (Blackwell)"
    if blackwell and not open_modules:
        problems.append(f"{what} need the NVIDIA open kernel modules, but nvidia_driver_open is false: the "
                        "proprietary module fails with 'requires use of the NVIDIA open kernel modules'")  # fmt: skip
    if blackwell and int(branch) < MIN_BLACKWELL_BRANCH:
        problems.append(f"{what} need driver branch R{MIN_BLACKWELL_BRANCH} or newer (R{RECOMMENDED_BRANCH} "
                        f"recommended), but nvidia_driver_branch is {branch}")  # fmt: skip
    if blackwell and open_modules and "open" not in package:
        problems.append(f"{what} need an open-module package, but nvidia_driver_package is {package}")
    if not str(version).startswith(f"{branch}."):
        problems.append(f"nvidia_driver_version {version} is not a release of branch {branch}")
    return problems


def _describe(gpus: list[Gpu]) -> str:
    names = sorted({gpu.name for gpu in gpus})
    ccs = sorted({f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" for gpu in gpus if gpu.compute_capability})
    label = "GPU" if len(gpus) == 1 else "GPUs"
    cc = f", compute capability {'/'.join(ccs)}" if ccs else ""
    return f"{label} {', '.join(str(gpu.index) for gpu in gpus)} ({', '.join(names)}{cc})"


def driver_problems(facts: GpuFacts) -> list[str]:
    """Blackwell needs the open kernel module, driver >= R570 (R580 recommended) and CUDA >= 12.8.

    An "unknown" module is not flagged: the proprietary module cannot enumerate Blackwell GPUs, so facts
    that list one came from a working (open) module.
    """
    blackwell = [gpu for gpu in facts.gpus if _needs_open_modules(gpu)]
    if not blackwell:
        return []
    what = _describe(blackwell)
    problems: list[str] = []
    if facts.kernel_module == "proprietary":
        problems.append(
            f"{what} need the NVIDIA open kernel module but the proprietary one is loaded (the driver fails with "
            f"'requires use of the NVIDIA open kernel modules'); {DRIVER_FIX}"
        )
    if facts.driver_branch < MIN_BLACKWELL_BRANCH:
        problems.append(
            f"{what} need driver branch >= R{MIN_BLACKWELL_BRANCH} (R{RECOMMENDED_BRANCH} recommended) but "
            f"{facts.driver_version} (R{facts.driver_branch}) is installed; {DRIVER_FIX}"
        )
    cuda = facts.cuda_version_tuple
    if cuda is None or cuda < MIN_BLACKWELL_CUDA:
        need = ".".join(map(str, MIN_BLACKWELL_CUDA))
        problems.append(
            f"{what} need CUDA >= {need} but the driver supports CUDA {facts.cuda_version or 'unknown'}; {DRIVER_FIX}"
        )
    return problems


def foreign_process_problems(facts: GpuFacts, allowed_pids: Iterable[int] = ()) -> list[str]:
    """One problem per process (not in allowed_pids) holding GPU memory, naming every GPU it is on."""
    allowed = set(allowed_pids)
    by_pid: dict[int, list[GpuProcess]] = {}
    for process in facts.processes:
        if process.pid not in allowed:
            by_pid.setdefault(process.pid, []).append(process)
    problems: list[str] = []
    for pid, held in sorted(by_pid.items()):
        where = ", ".join(
            f"{'unknown' if p.used_mib is None else p.used_mib} MiB on GPU {p.gpu_index}"
            for p in sorted(held, key=lambda p: p.gpu_index)
        )
        problems.append(
            f"PID {pid} ({held[0].name}) holds {where}; stop it (or its container) before starting the engine, "
            f"e.g. `kill {pid}` after checking `ps -fp {pid}`"
        )
    return problems


def iommu_fixed_by_cmdline(cmdline: str) -> bool:
    """Whether /proc/cmdline puts the IOMMU in pass-through or turns it off."""
    return bool(IOMMU_OFF_TOKENS.intersection(cmdline.split()))


def nccl_recommendations(facts: GpuFacts, iommu_fixed: bool, cmdline: str = "") -> NcclAdvice:
    """Engine settings for PCIe-only hosts whose IOMMU/ACS would break GPU peer-to-peer.

    With ACS redirect or a translating IOMMU, P2P over PCIe hangs or corrupts data; NCCL_P2P_DISABLE makes
    NCCL go through host memory, and the engines' custom all-reduce (CUDA IPC P2P) must be turned off too.
    """
    fixed = iommu_fixed or iommu_fixed_by_cmdline(cmdline)
    if facts.pcie_only and facts.count > 2 and not fixed:
        return {
            "env": {"NCCL_P2P_DISABLE": "1"},
            "vllm_args": ["--disable-custom-all-reduce"],
            "sglang_args": ["--disable-custom-all-reduce"],
            "reason": (
                f"{facts.count} GPUs joined only by PCIe and the IOMMU/ACS is not set up for peer-to-peer; "
                "disabling P2P avoids NCCL hangs. To get P2P back, boot with iommu=pt (or disable ACS) "
                "and verify with nccl-tests"
            ),
        }
    if not facts.pcie_only:
        reason = "GPUs are joined by NVLink; NCCL defaults are right"
    elif fixed:
        reason = "IOMMU is in pass-through or off; PCIe peer-to-peer can stay on"
    else:
        reason = f"{facts.count} PCIe GPU(s): no peer-to-peer settings needed"
    return {"env": {}, "vllm_args": [], "sglang_args": [], "reason": reason}


# The oldest driver branch each CUDA major release runs on (NVIDIA's CUDA release notes, table 3).
CUDA_MIN_DRIVER_BRANCH = {12: 525, 13: 580}


def cuda_toolkit_problems(version: str, package_version: str, driver_version: str) -> list[str]:
    """The CUDA toolkit the cuda_toolkit role is about to install, against the release and the driver."""
    found: list[str] = []
    if not re.match(rf"^{re.escape(version)}[.][0-9]+-[0-9]+$", package_version):
        found.append(f"cuda_toolkit_package_version {package_version} is not a CUDA {version} release")
    major = int(version.split(".", maxsplit=1)[0])
    need = CUDA_MIN_DRIVER_BRANCH.get(major, max(CUDA_MIN_DRIVER_BRANCH.values()))
    if driver_version and int(driver_version.split(".", maxsplit=1)[0]) < need:
        found.append(f"CUDA {version} needs driver R{need} or newer, but the driver is {driver_version}; "
                     f"install R{need} (nvidia_driver_branch: {need}) or pick cuda_toolkit_version 12.9")  # fmt: skip
    return found


def installed_driver_problems(
    smi_rc: int, smi_stdout: str, smi_stderr: str, *, version: str, expected_gpus: int, open_modules: bool,
    nvrm_text: str, version_file: str, may_be_silent: bool,
) -> list[str]:  # fmt: skip
    """What nvidia-smi and the kernel say after the nvidia_driver role installed the pinned driver."""
    if smi_rc != 0:
        if may_be_silent:  # the new driver loads at the reboot; a dry run may not have installed it
            return []
        return [f"nvidia-smi does not answer: {smi_stderr.strip()}; check dmesg for NVRM errors"]
    rows = query_gpu_rows(smi_stdout)
    found: list[str] = []
    reported = sorted({row.get("driver_version", "") for row in rows})
    if reported != [version]:
        found.append(f"nvidia-smi reports driver {', '.join(reported)}, not the pinned {version}")
    if expected_gpus > 0 and len(rows) != expected_gpus:
        found.append(f"nvidia-smi lists {len(rows)} GPUs, expected {expected_gpus}")
    if open_modules and nvrm_text and "Open Kernel Module" not in nvrm_text:
        first = nvrm_text.splitlines()[0] if nvrm_text.splitlines() else ""
        found.append(f"the loaded kernel module is not the open one ({version_file}: {first})")
    return found
