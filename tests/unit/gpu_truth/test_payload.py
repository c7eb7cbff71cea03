"""The GPU truth payload builder's pure parts (no index, no device): wheel tags, markers, pip's
conflict, what is carried, the trim; and the rendering the H200 runs served with."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import yaml
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
    # SGLang 0.5.23's: each names the file of its wheel that guards the import (or imports it lazily)
    sglang = payload.RECIPES["sglang"]
    assert all(".py" in why for why in sglang.optional.values())
    assert "humming-kernels" in sglang.optional  # its cu13 extra: nvcc/NVVM 13.5 beside the machine's CUDA
    # 0.5.23 pins tokenizers==0.23.2, the machine's (0.5.17's transformers refused it): no longer let go
    assert "tokenizers" not in sglang.release


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


def test_the_same_wheels_make_the_same_payload_whatever_their_files_times(tmp_path: Path) -> None:
    """The payload's sha256 keys the GPU machine's engine cache: a rebuild of the same wheels keeps the key."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("b-1.0-py3-none-any.whl", "a-1.0-py3-none-any.whl"):
        (wheels / name).write_bytes(name.encode() * 64)
    first = payload.payload_tar(wheels)
    for whl in wheels.iterdir():
        os.utime(whl, (1_000_000, 1_000_000))
        whl.chmod(0o600)
    assert payload.payload_tar(wheels) == first
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"changed")
    assert payload.payload_tar(wheels) != first


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


def built(root: Path, engine: str, parts: int) -> Path:
    """A payload's folder under ROOT with PARTS one-byte parts (what plan() reads)."""
    out = root / ".gpu-payload" / engine
    out.mkdir(parents=True)
    for n in range(parts):
        (out / f"part-{n:02d}").write_bytes(b"x")
    return out


def test_the_device_plan_carries_one_part_a_call_then_runs_the_gate_at_full_depth(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    out = built(tmp_path, "sglang", 3)
    calls = payload.plan("sglang", out, "0.5.23")
    # each gate: its engine started, then measured; the first start (SGLang's kernels built there) may
    # outrun its call, so a second up call watches it on
    assert len(calls) == 3 + 2 * len(payload.GATE_CALLS) + 1
    assert '"SHA256SUMS"' not in calls[1] and ".gpu-payload/sglang/SHA256SUMS" in calls[0]
    assert "install sglang" in calls[2] and "install" not in calls[1]
    up, again, measure, *speculative = calls[3:]
    assert "gate sglang --inventory inventories/gpu-h200-full-depth --form full-depth --dummy-load" in up
    assert "--engine-version 0.5.23 --prebuild-jit --baseline --phase up" in up and "pack spec-off-up" in up
    assert "--prebuild-jit" not in "".join(payload.plan("vllm", out, "0.33.0"))  # SGLang's kernels only
    assert "--rust-client" not in "".join(calls) and "--rust-client --baseline --phase up" in "".join(
        payload.plan("vllm", out, "0.33.0"))  # vLLM's own Rust client; SGLang's release has none  # fmt: skip
    assert again.startswith("run timeout_s=600 command='PYTHONUNBUFFERED=1") and "--baseline --phase up" in again
    assert f"--baseline --phase measure --repeat {payload.REPEATS}" in measure and "pack spec-off;" in measure
    # the first measured start's JIT kernels go back for the next session's machine, once
    assert measure.index("pack spec-off") < measure.index("cache-out sglang --only sglang-jit")
    assert "cache-out" not in "".join(speculative)
    bounded = f"timeout -s INT $(python3 gpu_truth/on_device.py bound {payload.GATE_BOUND_S})"
    assert all(bounded in call for call in calls[3:])
    # the up call stops what ran before it and leaves its engine; the measure call stops it after
    for up, measure in zip([calls[3], *calls[6::2]], calls[5::2], strict=True):
        assert up.index("stop") < up.index("gate") and "stop" not in up[up.index("gate") :]
        assert "stop" not in measure[: measure.index("gate")] and "stop" in measure[measure.index("gate") :]
    assert ["--acceptance 2.3" in speculative[0], "--acceptance 1.6" in speculative[2]] == [True, True]
    budgeted = payload.plan("sglang", out, "0.5.23", budget_s=1_200)
    assert "receive --budget 1200 &&" not in budgeted[0] and "receive --budget 1200" in budgeted[0]
    assert "--budget" not in "".join(budgeted[1:])
    assert "receive --left LEFT" in budgeted[1] and "--left" not in "".join(budgeted[2:])  # the first answer's
    # an earlier machine's cache carried: its parts travel before the install, nothing goes back, one up call
    cached = tmp_path / ".gpu-payload" / "carried-cache"
    cached.mkdir()
    (cached / "manifest.json").write_text('{"engine": "sglang", "key": "sglang-0123456789ab-sm90"}')
    for name in ("SHA256SUMS", "part-00", "part-01"):
        (cached / name).write_text("")
    seeded = payload.plan("sglang", out, "0.5.23")
    assert len(seeded) == 3 + 2 + 2 * len(payload.GATE_CALLS) + 1 and "cache-out" not in "".join(seeded)
    assert ".gpu-payload/carried-cache/part-00" in seeded[2] and ".gpu-payload/carried-cache/SHA256SUMS" in seeded[2]
    assert ".gpu-payload/carried-cache/part-01" in seeded[3] and "install sglang" in seeded[4]
    assert "carried-cache" not in "".join(payload.plan("vllm", out, "0.5.23"))  # another engine's: not carried
    later = payload.plan("sglang", out, "0.5.23", gates=("acc2.3",), baseline_file="kept/baseline.json")
    assert len(later) == 3 + 2 + 3 and all("--acceptance 2.3 --baseline-file kept/baseline.json --phase" in c
                                       for c in later[-3:])  # fmt: skip


def test_a_vllm_plan_keeps_the_client_its_carried_baseline_was_measured_with(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    out = built(tmp_path, "vllm", 1)
    (tmp_path / "python.json").write_text(json.dumps({"key": "sha256:0", "sweep": []}))  # before the Rust client
    (tmp_path / "rust.json").write_text(json.dumps({"key": "sha256:1", "client": on_device.RUST_CLIENT}))
    older = payload.plan("vllm", out, "0.33.0", gates=("acc2.3",), baseline_file="python.json")
    assert "--rust-client" not in "".join(older) and "--baseline-file python.json" in older[-1]
    rust = payload.plan("vllm", out, "0.33.0", gates=("acc2.3",), baseline_file="rust.json")
    assert all("--rust-client --acceptance 2.3 --baseline-file rust.json" in c for c in rust[-3:])


def test_the_gate_plan_carries_the_dashboards_prometheus_in_a_call_of_its_own(tmp_path: Path, monkeypatch) -> None:
    """The measuring call asks the dashboards' queries of a live Prometheus (gpu_truth/live_panels.py). Its
    .deb (19 MB) travels alone before the install: with a 48 MiB part it would outgrow a call's 64 MiB.
    Nor does it ride with the loads' vmtouch."""
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    out = built(tmp_path, "sglang", 3)
    tools = tmp_path / ".gpu-payload" / "tools"
    tools.mkdir()
    (tools / "prometheus_2.42.0+ds-5+deb12u1_amd64.deb").write_bytes(b"deb")
    (tools / "vmtouch_1.3.1-2_amd64.deb").write_bytes(b"deb")
    calls = payload.plan("sglang", out, "0.5.23", gates=("acc1.6",))
    assert len(calls) == 3 + 1 + 3
    assert "install sglang" in calls[3] and calls[4].startswith("run timeout_s=600")  # then the gate
    carried = calls[2]
    assert carried == ("run carry=[\".gpu-payload/tools/prometheus_2.42.0+ds-5+deb12u1_amd64.deb\"] "
                       "command='python3 gpu_truth/on_device.py receive'")  # fmt: skip
    assert "prometheus" not in "".join(c for c in calls if c is not carried)
    loads = payload.plan("sglang", out, "0.5.23", gates=(), loads=("auto",))
    assert "prometheus" not in "".join(loads) and "vmtouch" in loads[0]  # no gate: no panels asked


def test_the_loads_plan_carries_vmtouch_first_and_times_one_loader_a_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    out = built(tmp_path, "vllm", 2)
    (tmp_path / ".gpu-payload" / "tools").mkdir()
    (tmp_path / ".gpu-payload" / "tools" / "vmtouch_1.3.1-2_amd64.deb").write_bytes(b"deb")
    calls = payload.plan("vllm", out, "0.33.0", gates=(), loads=("auto", "runai_streamer"))
    assert len(calls) == 2 + 2
    assert ".gpu-payload/tools/vmtouch_1.3.1-2_amd64.deb" in calls[0] and "vmtouch" not in calls[1]
    first, second = calls[2:]
    assert "loads vllm --write --loader auto;" in first and "pack loads-auto" in first
    assert "loads vllm --loader runai_streamer;" in second and "--write" not in second
    assert all(f"bound {payload.GATE_BOUND_S})" in c and c.index("stop") < c.index("loads vllm") for c in calls[2:])
    assert "vmtouch" not in "".join(payload.plan("vllm", out, "0.33.0", gates=()))  # no loads, no tools


def test_what_is_carried_beside_the_engine_is_pinned_in_pins_yaml() -> None:
    assert payload.pinned("py-spy") == payload.PINS["tools"]["py_spy"]
    assert payload.pinned("runai-model-streamer") == payload.PINS["loaders"]["runai_model_streamer"]
    with pytest.raises(SystemExit, match="no pin"):
        payload.pinned("left-pad")
    assert "runai-model-streamer" in payload.RECIPES["vllm"].also
    assert all(payload.deb_pin(d) for r in payload.RECIPES.values() for d in r.debs)
    assert payload.deb_pin("prometheus") == payload.PINS["host"]["monitoring_prometheus_version"]  # the role's
    assert payload.deb_pin("vmtouch") == payload.PINS["host"]["serving_vmtouch_version"]
    with pytest.raises(SystemExit, match="no pin"):
        payload.deb_pin("left-pad")


def test_parts_cut_again_rejoin_into_the_same_payload(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(payload, "CHUNK", 4)
    data = bytes(range(10))
    (tmp_path / "manifest.json").write_text('{"parts": 1}')
    assert payload.write_parts(tmp_path, data) == 3
    monkeypatch.setattr(payload, "CHUNK", 6)
    payload.resplit(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("part-*")) == ["part-00", "part-01"]
    assert json.loads((tmp_path / "manifest.json").read_text())["parts"] == 2
    assert b"".join(p.read_bytes() for p in sorted(tmp_path.glob("part-*"))) == data
    (tmp_path / "part-01").write_bytes(b"??")
    with pytest.raises(SystemExit, match="do not join"):
        payload.resplit(tmp_path)


# ---------------------------------------------------------------- the release and torch (a fake index)

PINNED = payload.pinned_release("vllm")
H200 = {"torch": "2.11.0", "triton": "3.6.0", "nvidia-nccl-cu13": "2.28.9", "nvidia-cudnn-cu13": "9.19.0.56",
        "cuda-toolkit": "13.0.2", "nvidia-cublas": "13.1.0.3", "sympy": "1.14.0", "numpy": "2.3.5",
        "cuda-bindings": "13.3.1"}  # fmt: skip
TORCH_2_14 = [
    "sympy>=1.13.3",
    'cuda-toolkit[cublas]==13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
    'triton~=3.8.0; platform_system == "Linux" and python_version < "3.15"',
]


def _index(monkeypatch, nccl: tuple[str, ...] = ("2.28.9", "2.30.7", "2.32.6")) -> None:
    """PyPI as far as the builder asks: wheels by name, each one's METADATA by its url."""
    packages: dict[str, dict[str, list[str]]] = {
        "vllm": {PINNED: ["torch==2.14.0", "numpy"]},
        "torch": {"2.11.0": [], "2.14.0": TORCH_2_14, "2.14.1": TORCH_2_14},
        "triton": {"3.6.0": [], "3.8.0": [], "3.9.0": []},
        "nvidia-nccl-cu13": {v: [] for v in nccl},
        "cuda-toolkit": {"13.0.2": [], "13.0.3": ['nvidia-cublas==13.1.1.3.*; extra == "cublas"']},
    }

    def wheels(client: object, name: str) -> list[dict[str, object]]:
        return [{"filename": f"{name.replace('-', '_')}-{v}-py3-none-any.whl", "url": f"fake://{name}/{v}", "size": 1,
                 "hashes": {"sha256": "0" * 64}} for v in packages[name]]  # fmt: skip

    def metadata(client: object, url: str, size: int) -> str:
        name, version = url.removeprefix("fake://").split("/")
        return "".join(f"Requires-Dist: {r}\n" for r in packages[name][version])

    monkeypatch.setattr(payload, "_wheels", wheels)
    monkeypatch.setattr(payload, "_remote_metadata", metadata)


def test_the_release_is_the_one_pins_yaml_deploys_unless_told(monkeypatch) -> None:
    pins = yaml.safe_load((ROOT / "src" / "specdeploy" / "pins.yaml").read_text())["engines"]
    assert payload.choose_release(None, "vllm", None, None)[0] == pins["vllm_cuda"]  # type: ignore[arg-type]
    assert payload.choose_release(None, "sglang", None, None)[0] == pins["sglang_cuda"]  # type: ignore[arg-type]
    assert payload.choose_release(None, "vllm", "0.26.0", None)[0] == "0.26.0"  # type: ignore[arg-type]
    monkeypatch.setattr(payload, "pick_release", lambda client, package, torch: ("0.34.0", [f"admits {torch}"]))
    assert payload.choose_release(None, "vllm", None, "2.14.0") == ("0.34.0", ["admits 2.14.0"])  # type: ignore[arg-type]


def test_torch_is_carried_where_the_releases_pin_refuses_the_machines(monkeypatch) -> None:
    _index(monkeypatch)
    plan = payload.plan_torch(None, payload.RECIPES["vllm"], PINNED, dict(H200), may_carry=True)  # type: ignore[arg-type]
    assert (plan.machine, plan.carried) == ("2.11.0", "2.14.0")
    # triton at torch's own pin (~=3.8.0: 3.9.0 refused), NCCL at torch's pin, not the newest
    assert plan.carry == {"torch": "2.14.0", "triton": "3.8.0", "nvidia-nccl-cu13": "2.30.7"}
    assert "ncclCommResume" in plan.carried_why["nvidia-nccl-cu13==2.30.7"]
    # kept from the machine with the recipe's reason; cuda-toolkit's extras are compared one by one
    assert set(plan.kept) == {"cuda-toolkit", "nvidia-cublas", "nvidia-cudnn-cu13"}
    assert "decode path makes none" in plan.kept["nvidia-cudnn-cu13"]
    assert plan.specs == ["sympy>=1.13.3"]  # torch's pure-Python needs go to pip with the engine's set


def test_torch_is_not_carried_where_the_machines_is_admitted_nor_ever_in_machine_torch_mode(monkeypatch) -> None:
    _index(monkeypatch)
    recipe = payload.RECIPES["vllm"]
    plan = payload.plan_torch(None, recipe, PINNED, {**H200, "torch": "2.14.0+cu130"}, may_carry=True)  # type: ignore[arg-type]
    assert plan.carried is None and plan.carry == {} and plan.kept == {} and "admits" in plan.why
    with pytest.raises(SystemExit, match="never carries torch"):
        payload.plan_torch(None, recipe, PINNED, dict(H200), may_carry=False)  # type: ignore[arg-type]


def test_a_torch_pin_the_index_lacks_takes_the_nearest_later_release_of_its_major(monkeypatch) -> None:
    _index(monkeypatch, nccl=("2.28.9", "2.31.2", "2.32.6", "3.0.1"))
    plan = payload.plan_torch(None, payload.RECIPES["vllm"], PINNED, dict(H200), may_carry=True)  # type: ignore[arg-type]
    assert plan.carry["nvidia-nccl-cu13"] == "2.31.2"
    assert "not on the index" in plan.carried_why["nvidia-nccl-cu13==2.31.2"]


def test_a_cuda_library_torch_refuses_that_the_recipe_does_not_name_stops_the_build(monkeypatch) -> None:
    _index(monkeypatch)
    recipe = payload.Recipe(package="vllm", torch_kept={"cuda-toolkit": "a metapackage"})
    with pytest.raises(SystemExit, match="nvidia-cublas"):
        payload.plan_torch(None, recipe, PINNED, dict(H200), may_carry=True)  # type: ignore[arg-type]


def test_unmet_requirements_are_named_and_excused_ones_are_not() -> None:
    reqs = [payload.Requirement(r) for r in ("torch==2.14.0", "numpy<2.5", "tilelang==0.1.12", "xgrammar==0.2.8")]
    have = {"torch": "2.14.0", "numpy": "2.5.1"}
    assert payload.unmet(reqs, have, {"tilelang"}) == ["numpy<2.5 (there: 2.5.1)", "xgrammar==0.2.8 (there: nothing)"]


def test_the_manifest_says_what_torch_carries_and_what_the_machine_keeps(tmp_path: Path, monkeypatch) -> None:
    _index(monkeypatch)
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    monkeypatch.setattr(payload, "OUT", tmp_path / ".gpu-payload")
    machine = tmp_path / "machine.txt"
    machine.write_text("".join(f"{n}=={v}\n" for n, v in H200.items()))
    resolved: dict[str, object] = {}

    def resolve_releasing(specs, held, optional, released, carried):  # type: ignore[no-untyped-def]
        resolved.update(specs=specs, carried=carried)
        return [{"metadata": {"name": "vllm", "version": PINNED}, "download_info": {"url": "fake://vllm.whl"}},
                {"metadata": {"name": "torch", "version": "2.14.0+carried"}}]  # fmt: skip

    def fetch(client: object, item: dict[str, dict[str, str]], folder: Path) -> Path:
        path = folder / f"{item['metadata']['name']}-{item['metadata']['version']}.whl"
        path.write_bytes(b"wheel")
        return path

    monkeypatch.setattr(payload, "resolve_releasing", resolve_releasing)
    monkeypatch.setattr(payload, "optional_versions", lambda client, recipe, release: {})
    monkeypatch.setattr(payload, "fetch", fetch)
    monkeypatch.setattr(payload, "trim", lambda path, members: 0)
    out = payload.build("vllm", machine, None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["release"] == PINNED
    assert manifest["torch"]["machine"] == "2.11.0" and manifest["torch"]["carried"] == "2.14.0"
    assert resolved["carried"] == {"torch": "2.14.0", "triton": "3.8.0", "nvidia-nccl-cu13": "2.30.7"}
    assert "ncclCommResume" in manifest["carried_cuda_libraries"]["nvidia-nccl-cu13==2.30.7"]
    assert "cuDNN" in manifest["kept_from_machine"]["nvidia-cudnn-cu13"]
    assert manifest["carried"] == ["nvidia-nccl-cu13==2.30.7", "torch==2.14.0", "triton==3.8.0", f"vllm=={PINNED}"]
    assert manifest["requirements_unmet"] == [] and (out / "SHA256SUMS").is_file()


def test_a_machine_package_built_against_the_machines_torch_is_let_go_when_torch_is_carried(monkeypatch) -> None:
    """SGLang 0.5.23 asks torchvision unpinned: pip kept the machine's 0.26.0 (torch==2.11.0, its _C.so that
    torch's) beside the carried torch 2.14.1. Its own Requires-Dist says so; it is let go and pip carries one
    admitting the carried torch."""
    packages = {"torchvision": {"0.26.0": ["torch==2.11.0", "numpy"], "0.29.2": ["torch>=2.14.0"]},
                "numpy": {"2.3.5": []}, "einops": {"0.8.2": ["torch>=1.10; extra == 'torch'"]}}  # fmt: skip

    def wheels(client: object, name: str) -> list[dict[str, object]]:
        if name not in packages:
            raise KeyError(name)
        return [{"filename": f"{name}-{v}-py3-none-any.whl", "url": f"fake://{name}/{v}", "size": 1}
                for v in packages[name]]  # fmt: skip

    def metadata(client: object, url: str, size: int) -> str:
        name, version = url.removeprefix("fake://").split("/")
        return "".join(f"Requires-Dist: {r}\n" for r in packages[name][version])

    monkeypatch.setattr(payload, "_wheels", wheels)
    monkeypatch.setattr(payload, "_remote_metadata", metadata)
    on_machine = ["einops==0.8.2", "numpy==2.3.5", "torchvision==0.26.0", "nvidia-cublas==13.1.0.3", "local==1"]
    bound = payload.torch_bound(None, on_machine, "2.14.1")  # type: ignore[arg-type]
    assert bound == {"torchvision": "torchvision 0.26.0 asks torch==2.11.0, refusing the carried torch 2.14.1"}
    assert payload.torch_bound(None, ["torchvision==0.29.2"], "2.14.1") == {}  # type: ignore[arg-type]

    # the set is resolved again without it: torchvision is carried at pip's choice, the reason recorded
    def resolve_releasing(specs, held, optional, released, carried):  # type: ignore[no-untyped-def]
        tv = "0.29.2" if "torchvision" in released else "0.26.0+machine"
        return [{"metadata": {"name": "sglang", "version": "0.5.23"}},
                {"metadata": {"name": "torchvision", "version": tv}}]  # fmt: skip

    monkeypatch.setattr(payload, "resolve_releasing", resolve_releasing)
    plan = payload.TorchPlan("2.11.0", "2.14.1", "carried", carry={"torch": "2.14.1"})
    released: dict[str, str] = {}
    chosen = payload.resolve_set(None, [], {"torchvision": "0.26.0"}, optional={}, released=released,  # type: ignore[arg-type]
                                 recipe=payload.RECIPES["sglang"], torch_plan=plan)  # fmt: skip
    assert [i["metadata"]["version"] for i in chosen["carry"]] == ["0.5.23", "0.29.2"]
    assert chosen["on_machine"] == [] and "torch==2.11.0" in released["torchvision"]
    # the machine's torch kept (not carried): nothing is read, nothing let go
    kept = payload.TorchPlan("2.11.0", None, "admits")
    chosen = payload.resolve_set(None, [], {}, optional={}, released={}, recipe=payload.RECIPES["sglang"],  # type: ignore[arg-type]
                                 torch_plan=kept)  # fmt: skip
    assert chosen["on_machine"] == ["torchvision==0.26.0"]
