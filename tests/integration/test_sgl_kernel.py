"""The `auto` decision on the real sglang-kernel wheel the pinned SGLang requires, read with the real
cuobjdump from the package index; and a wheel without SM120 code, which must give `build`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.engine_image import profiles, sgl_kernel, wheels
from specdeploy.paths import state_dir

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def kernel_wheel() -> Path:
    requirement = profiles.sglang_kernel_requirement(profiles.profile("sglang-cuda"))
    dest = state_dir() / "wheels" / "sglang-kernel"
    if not list(dest.glob("sglang_kernel-*.whl")):
        wheels.pip_download([requirement], dest, "3.12", no_deps=True)
    return sorted(dest.glob(f"sglang_kernel-{requirement.split('==')[1]}-*.whl"))[0]


@pytest.fixture(scope="module")
def cuobjdump(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("cuobjdump")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    f"nvidia-cuda-cuobjdump=={pins.CUOBJDUMP}"], check=True)  # fmt: skip
    return next(target.glob("nvidia/cu*/bin/cuobjdump"))


def test_the_real_wheel_is_kept_with_the_attention_backends_set_for_sm120(kernel_wheel, cuobjdump):
    report = sgl_kernel.wheel_report(kernel_wheel, cuobjdump)
    arches = report.libraries
    common = [a for n, a in arches.items() if Path(n).name.startswith("common_ops")]
    assert common and all("sm_120a" in a for a in common), arches
    assert not any(a.startswith("sm_120") for a in arches["sgl_kernel/flash_ops.abi3.so"]), arches
    assert not any(a.startswith("sm_120") for a in arches["sgl_kernel/flashmla_ops.abi3.so"]), arches
    assert report.action == "keep"
    assert report.advice["attention_backend"] == "triton", report.advice
    assert "flash_ops.abi3.so" in report.advice["reason"] and "flashmla_ops.abi3.so" in report.advice["reason"]


def test_a_wheel_without_sm120_code_gives_build(kernel_wheel, cuobjdump, tmp_path):
    """The real FA3 library (no sm_120) standing in as the common library: the CLI exits 10."""
    old = tmp_path / "sglang_kernel-0.0.0-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(kernel_wheel) as real, zipfile.ZipFile(old, "w") as fake:
        fake.writestr("sgl_kernel/sm90/common_ops.abi3.so", real.read("sgl_kernel/flash_ops.abi3.so"))
    proc = subprocess.run([sys.executable, "-m", "specdeploy.engine_image.sgl_kernel", "--cuobjdump", str(cuobjdump),
                           "--wheel", str(old)], capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == sgl_kernel.BUILD_EXIT, proc.stdout + proc.stderr
    assert "sgl_kernel/sm90/common_ops.abi3.so: NO sm_120" in proc.stdout
    assert "decision (auto): build: no common_ops library carries sm_120 code" in proc.stdout
