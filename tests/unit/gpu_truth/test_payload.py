"""The GPU truth payload builder's pure parts (no index, no device): wheel tags, markers, pip's
conflict, what is carried, the trim; and the rendering the H200 runs served with."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from gpu_truth import on_device, payload

ROOT = Path(__file__).parents[3]
RUNS = ROOT / "tests" / "data" / "gpu_truth"


@pytest.mark.parametrize(
    ("filename", "fits"),
    [
        ("vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", True),
        ("sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl", True),
        ("six-1.16.0-py2.py3-none-any.whl", False),  # py2.py3 tags are read as one: not 'py3'
        ("openai-2.6.1-py3-none-any.whl", True),
        ("sglang-0.5.17-cp313-cp313-manylinux_2_34_x86_64.whl", False),
        ("vllm-0.26.0-cp38-abi3-manylinux_2_28_aarch64.whl", False),
    ],
)
def test_wheels_the_machines_cpython_312_on_x86_64_installs(filename: str, fits: bool) -> None:
    assert payload._fits(filename) is fits


def test_requirements_are_read_with_the_machines_markers() -> None:
    metadata = "\n".join([
        "Name: vllm",
        "Requires-Dist: torch==2.11.0",
        'Requires-Dist: humming-kernels[cu13]==0.1.10; platform_machine == "x86_64"',
        'Requires-Dist: pytest; extra == "test"',
        'Requires-Dist: aarch64-only; platform_machine == "aarch64"',
        'Requires-Dist: old-python; python_version < "3.10"',
    ])  # fmt: skip
    assert [r.name for r in payload.requires(metadata)] == ["torch", "humming-kernels"]
    assert [r.name for r in payload.requires(metadata, ("test",))] == ["torch", "humming-kernels", "pytest"]


def test_a_machine_package_the_engine_pins_elsewhere_is_named_from_pips_own_words() -> None:
    text = (RUNS / "pip-conflict-numba.txt").read_text()
    assert payload.Conflict(text).machine_package() == ("numba", "vllm 0.26.0 depends on numba==0.65.0")
    assert payload.Conflict("ERROR: No matching distribution found for foo").machine_package() is None


def test_torch_and_the_cuda_stack_are_never_let_go() -> None:
    for name in ("torch", "triton", "nvidia-nccl-cu13", "cuda-bindings"):
        assert payload.NEVER_RELEASED.match(name)
    assert not payload.NEVER_RELEASED.match("numba")


def test_stubs_carry_nothing_and_the_rest_of_the_set_is_carried(tmp_path: Path) -> None:
    payload._stub(tmp_path, "torch", "2.11.0")
    (wheel,) = tmp_path.iterdir()
    assert wheel.name == "torch-2.11.0+machine-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        meta = whl.read("torch-2.11.0+machine.dist-info/METADATA").decode()
    assert "Version: 2.11.0+machine" in meta and "Requires-Dist" not in meta

    def item(name: str, version: str) -> dict[str, object]:
        return {"metadata": {"name": name, "version": version}}

    items = [item("vllm", "0.26.0"), item("torch", "2.11.0+machine"), item("tilelang", "0.1.9+optional"),
             item("pycountry", "26.2.16")]  # fmt: skip
    chosen = payload.select(items, payload.RECIPES["vllm"])  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in chosen["carry"]] == ["vllm", "pycountry"]
    assert chosen["on_machine"] == ["torch==2.11.0"]
    assert "tilelang" in chosen["left_out"]


def test_every_left_out_package_says_why_from_the_engines_own_source() -> None:
    for recipe in payload.RECIPES.values():
        assert all(len(why) > 10 for why in recipe.optional.values())
        for members, why in recipe.trim.values():
            assert members and len(why) > 20


def test_a_trim_drops_the_member_and_its_record_line_and_refuses_a_missing_one(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("vllm/__init__.py", "")
        whl.writestr("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", b"\0" * 4096)
        whl.writestr("vllm-0.26.0.dist-info/RECORD",
                     "vllm/__init__.py,,\nvllm/vllm_flash_attn/_vllm_fa2_C.abi3.so,,\n")  # fmt: skip
    saved = payload.trim(wheel, ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",))
    assert saved > 0
    with zipfile.ZipFile(wheel) as whl:
        assert whl.namelist() == ["vllm/__init__.py", "vllm-0.26.0.dist-info/RECORD"]
        assert b"_vllm_fa2_C" not in whl.read("vllm-0.26.0.dist-info/RECORD")
    with pytest.raises(SystemExit, match="not there"):
        payload.trim(wheel, ("vllm/missing.so",))


@pytest.mark.parametrize("run", ["vllm-ready", "sglang-ds3-triton", "sglang-ds3-default", "sglang-gate"])
def test_the_project_renders_the_command_that_served_on_the_h200(run: str) -> None:
    """If the rendering of the GPU inventory changes, this fails: run `make gpu-truth` again."""
    record = json.loads((RUNS / run / "command.json").read_text())
    overrides = [f"specdeploy_engine={record['engine']}", *record["overrides"]]
    config = on_device.render(on_device.inventory_vars(ROOT / record["inventory"], overrides))
    assert config.command() == record["rendered_command"]
    assert on_device.engine_argv(config.command())[1:3] in (
        ["-m", "vllm.entrypoints.cli.main"],
        ["-m", "sglang.launch_server"],
    )


def test_the_served_runs_reached_ready_with_acceptance() -> None:
    vllm = json.loads((RUNS / "vllm-ready" / "result.json").read_text())
    assert vllm["verdict"].startswith("READY") and vllm["bench"]["figures"]["acceptance_rate"] > 0
    sglang = json.loads((RUNS / "sglang-ds3-default" / "result.json").read_text())
    assert sglang["verdict"].startswith("READY") and sglang["sglang_avg_spec_accept_length"] > 1


def test_the_device_plan_carries_one_part_a_call_and_serves_after_the_last(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    out = tmp_path / ".gpu-payload" / "sglang"
    out.mkdir(parents=True)
    for n in range(3):
        (out / f"part-{n:02d}").write_bytes(b"x")
    calls = payload.plan("sglang", out)
    assert len(calls) == 3
    assert '"SHA256SUMS"' not in calls[1] and ".gpu-payload/sglang/SHA256SUMS" in calls[0]
    assert "serve sglang --architecture deepseek_v3" in calls[-1] and "serve" not in calls[0]
