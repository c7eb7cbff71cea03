"""Preflight checks on facts parsed from the real captures and from the simulated RTX PRO 6000 host."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdeploy.gpu.checks import (
    driver_problems,
    foreign_process_problems,
    gpu_count_problems,
    iommu_fixed_by_cmdline,
    nccl_recommendations,
)
from specdeploy.gpu.facts import GpuFacts, collect
from specdeploy_testbed import simulated_gpu as simulated
from specdeploy_testbed.simulated_gpu import capture_dir

CAPTURES = capture_dir()
pytestmark = pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"real nvidia-smi captures not found at {CAPTURES}")


def h200_x1() -> GpuFacts:
    d = CAPTURES / "h200-x1"
    return collect(
        (d / "nvidia-smi-q.xml").read_text(),
        (d / "topo.txt").read_text(),
        query_gpu=(d / "query-gpu.csv").read_text(),
        apps=(d / "query-apps.csv").read_text(),
        driver_version_file=(d / "versions.txt").read_text(),
    )


def h200_x2_busy(with_apps_csv: bool = True) -> GpuFacts:
    d = CAPTURES / "h200-x2-busy"
    return collect(
        (d / "nvidia-smi-q-x2-busy.xml").read_text(),
        (d / "topo-x2.txt").read_text(),
        query_gpu=(d / "query-gpu-x2-busy.csv").read_text(),
        apps=(d / "query-apps-x2-busy.csv").read_text() if with_apps_csv else None,
    )


def rtx_pro(**kwargs) -> GpuFacts:
    files = simulated.render_all(**kwargs)
    return collect(
        files["nvidia-smi-q.xml"], files["topo.txt"], files["query-gpu.csv"], files["query-apps.csv"], files["version"]
    )


# --- foreign processes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_apps_csv", [True, False])
def test_the_stale_process_in_the_busy_capture_is_reported(with_apps_csv):
    (problem,) = foreign_process_problems(h200_x2_busy(with_apps_csv))
    assert "PID 566" in problem and "python3" in problem
    assert "10758 MiB on GPU 0" in problem and "10758 MiB on GPU 1" in problem
    assert "kill 566" in problem


def test_allowed_processes_and_idle_gpus_are_fine():
    assert foreign_process_problems(h200_x2_busy(), allowed_pids=[566]) == []
    assert foreign_process_problems(h200_x1()) == []


# --- GPU count ---------------------------------------------------------------------------------------------------


def test_tp8_does_not_fit_on_two_gpus():
    (problem,) = gpu_count_problems(h200_x2_busy(), tp=8, pp=1)
    assert "needs 8 GPUs" in problem and "sees 2" in problem
    assert gpu_count_problems(h200_x2_busy(), tp=2, pp=1) == []
    assert gpu_count_problems(h200_x2_busy(), tp=1, pp=2) == []
    assert gpu_count_problems(rtx_pro(), tp=4, pp=2) == []
    assert gpu_count_problems(h200_x2_busy(), tp=2, pp=2) != []


def test_bad_parallel_sizes_and_no_gpus_say_what_to_do():
    assert "must be >= 1" in gpu_count_problems(h200_x1(), tp=0, pp=1)[0]
    no_gpus = replace(h200_x1(), gpus=())
    (problem,) = gpu_count_problems(no_gpus, tp=1, pp=1)
    assert "requires use of the NVIDIA open kernel modules" in problem and "nvidia-driver-580-open" in problem


# --- driver ------------------------------------------------------------------------------------------------------


def test_open_580_on_blackwell_and_any_driver_on_hopper_pass():
    assert driver_problems(rtx_pro()) == []
    assert driver_problems(h200_x1()) == []
    assert driver_problems(replace(h200_x1(), kernel_module="proprietary")) == []  # Hopper runs on either


def test_proprietary_550_on_sm120_is_flagged_with_the_fix():
    facts = rtx_pro(driver_version="550.163.01", cuda_version="12.4", kernel_module="proprietary")
    problems = driver_problems(facts)
    assert len(problems) == 3
    module, branch, cuda = problems
    assert "open kernel module" in module and "requires use of the NVIDIA open kernel modules" in module
    assert "550.163.01" in branch and ">= R570" in branch and "R580" in branch
    assert "CUDA >= 12.8" in cuda and "12.4" in cuda
    assert all("nvidia-driver-580-open" in p and "nvidia_driver_branch: 580" in p for p in problems)
    assert "GPUs 0, 1, 2, 3, 4, 5, 6, 7" in module and "compute capability 12.0" in module


def test_each_blackwell_requirement_is_checked_on_its_own():
    assert len(driver_problems(rtx_pro(kernel_module="proprietary"))) == 1
    assert len(driver_problems(rtx_pro(driver_version="565.57.01", cuda_version="12.7"))) == 2
    assert driver_problems(rtx_pro(driver_version="570.195.03", cuda_version="12.8")) == []


@pytest.mark.parametrize(
    ("cc", "architecture", "flagged"),
    [((10, 0), None, True), ((12, 1), None, True), ((9, 0), "Hopper", False), (None, "Blackwell", True)],
)
def test_which_gpus_need_the_open_module(cc, architecture, flagged):
    base = h200_x1()
    gpu = replace(base.gpus[0], compute_capability=cc, architecture=architecture)
    assert bool(driver_problems(replace(base, gpus=(gpu,), kernel_module="proprietary"))) is flagged


# --- NCCL --------------------------------------------------------------------------------------------------------


def test_pcie_only_8_gpus_get_p2p_disabled_unless_the_iommu_is_fixed():
    facts = rtx_pro()
    advice = nccl_recommendations(facts, iommu_fixed=False)
    assert advice["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert advice["vllm_args"] == ["--disable-custom-all-reduce"] == advice["sglang_args"]
    assert "iommu=pt" in advice["reason"]
    assert "VLLM_DISABLE_P2P" not in repr(advice)  # not a real vLLM variable
    assert nccl_recommendations(facts, iommu_fixed=True)["env"] == {}


@pytest.mark.parametrize(
    ("cmdline", "fixed"),
    [
        ("BOOT_IMAGE=/vmlinuz-6.8.0 root=UUID=x ro intel_iommu=on iommu=pt", True),
        ("BOOT_IMAGE=/vmlinuz root=/dev/sda1 amd_iommu=off quiet", True),
        ("intel_iommu=off", True),
        ("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on quiet", False),
        ("noiommu=pt", False),
        ("", False),
    ],
)
def test_iommu_state_is_read_from_the_kernel_cmdline(cmdline, fixed):
    assert iommu_fixed_by_cmdline(cmdline) is fixed
    advice = nccl_recommendations(rtx_pro(), iommu_fixed=False, cmdline=cmdline)
    assert (advice["env"] == {}) is fixed


def test_nvlink_and_small_pcie_hosts_keep_nccl_defaults():
    assert nccl_recommendations(h200_x2_busy(), iommu_fixed=False)["env"] == {}
    two = rtx_pro(count=2)
    assert two.pcie_only
    assert nccl_recommendations(two, iommu_fixed=False) == {
        "env": {},
        "vllm_args": [],
        "sglang_args": [],
        "reason": "2 PCIe GPU(s): no peer-to-peer settings needed",
    }


def test_planned_driver_for_sm120_needs_open_modules_and_r570_plus():
    from specdeploy.gpu.checks import planned_driver_problems  # noqa: PLC0415

    ok = planned_driver_problems(["12.0"], 580, True, "nvidia-driver-580-open", "580.95.05")
    assert ok == []
    closed = planned_driver_problems(["12.0"], 580, False, "nvidia-driver-580", "580.95.05")
    assert len(closed) == 1 and "open kernel modules" in closed[0]
    old = planned_driver_problems(["12.0"], 550, True, "nvidia-driver-550-open", "550.54.15")
    assert len(old) == 1 and "R570 or newer" in old[0] and "550" in old[0]
    assert planned_driver_problems(["9.0"], 550, False, "nvidia-driver-550", "550.54.15") == []  # Hopper: fine
    mismatch = planned_driver_problems(["9.0"], 580, True, "nvidia-driver-580-open", "575.1")
    assert mismatch == ["nvidia_driver_version 575.1 is not a release of branch 580"]


# --- the provision roles' rules (once, here; the roles call them through filters) -------------------------


def test_query_gpu_rows_are_read_by_field_name_with_or_without_a_header():
    from specdeploy.gpu.facts import QUERY_GPU_FIELDS, query_gpu_command, query_gpu_rows  # noqa: PLC0415

    assert query_gpu_command("/usr/bin/nvidia-smi")[1] == f"--query-gpu={','.join(QUERY_GPU_FIELDS)}"
    line = ("0, NVIDIA RTX PRO 6000 Blackwell, GPU-1, 00000000:01:00.0, 580.95.05, 12.0, 97887, 0, 97887, "
            "Enabled, 600.00, 30, 0")  # fmt: skip
    rows = query_gpu_rows(line + "\n" + line.replace("0, NVIDIA", "1, NVIDIA", 1))
    assert [r["driver_version"] for r in rows] == ["580.95.05", "580.95.05"] and rows[0]["compute_cap"] == "12.0"
    header = "index, driver_version, compute_cap\n0, 575.57.08, 12.0\n"
    assert query_gpu_rows(header) == [{"index": "0", "driver_version": "575.57.08", "compute_cap": "12.0"}]


def test_cuda_13_needs_r580_and_the_package_must_belong_to_the_release():
    from specdeploy.gpu.checks import cuda_toolkit_problems  # noqa: PLC0415

    assert cuda_toolkit_problems("12.9", "12.9.1-1", "575.57.08") == []
    assert cuda_toolkit_problems("13.0", "13.0.2-1", "") == []  # no driver yet: judged after it is installed
    old = cuda_toolkit_problems("13.0", "13.0.2-1", "575.57.08")
    assert old == ["CUDA 13.0 needs driver R580 or newer, but the driver is 575.57.08; install R580 "
                   "(nvidia_driver_branch: 580) or pick cuda_toolkit_version 12.9"]  # fmt: skip
    assert cuda_toolkit_problems("12.9", "12.8.1-1", "") == [
        "cuda_toolkit_package_version 12.8.1-1 is not a CUDA 12.9 release"
    ]


def test_the_installed_driver_is_judged_by_what_nvidia_smi_and_the_kernel_report():
    from specdeploy.gpu.checks import installed_driver_problems  # noqa: PLC0415

    row = "{i}, NVIDIA RTX PRO 6000 Blackwell, GPU-{i}, 0000:0{i}:00.0, {v}, 12.0, 97887, 0, 97887, Enabled, 600, 30, 0"
    eight = "\n".join(row.format(i=i, v="580.95.05") for i in range(8))
    nvrm = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
    opts = {"version": "580.95.05", "expected_gpus": 8, "open_modules": True, "nvrm_text": nvrm,
            "version_file": "/proc/driver/nvidia/version", "may_be_silent": False}  # fmt: skip
    assert installed_driver_problems(0, eight, "", **opts) == []
    wrong = "\n".join(row.format(i=i, v="575.57.08") for i in range(7))
    assert installed_driver_problems(0, wrong, "", **opts) == [
        "nvidia-smi reports driver 575.57.08, not the pinned 580.95.05",
        "nvidia-smi lists 7 GPUs, expected 8",
    ]
    proprietary = {**opts, "nvrm_text": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05"}
    assert "is not the open one" in installed_driver_problems(0, eight, "", **proprietary)[0]
    assert installed_driver_problems(9, "", "NVIDIA-SMI has failed", **opts) == [
        "nvidia-smi does not answer: NVIDIA-SMI has failed; check dmesg for NVRM errors"
    ]
    assert installed_driver_problems(9, "", "", **{**opts, "may_be_silent": True}) == []
