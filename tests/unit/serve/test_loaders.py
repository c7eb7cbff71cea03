"""serving_load_format: each value renders its engine flags for both engines, an unsupported one
is refused before any host is touched, and the image bakes in the package its loader needs."""

from __future__ import annotations

import pytest

from specdeploy import pins
from specdeploy.serve import loaders, schema
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.variables import problems
from tests.unit.engine_image.test_profiles import hadolint, render

BASE = {"image": "i", "model_path": "/m", "served_model_name": "m"}
CASES = [(name, engine) for name, loader in loaders.LOADERS.items() for engine in loader.engines]


def flags(cfg: ServingConfig) -> list[str]:
    cmd = cfg.command()
    if "--load-format" not in cmd:
        return []
    at = cmd.index("--load-format")
    extra = cmd[at + 2 : at + 4] if cmd[at + 2 : at + 3] == ["--model-loader-extra-config"] else []
    return [*cmd[at : at + 2], *extra]


@pytest.mark.parametrize(("name", "engine"), CASES, ids=[f"{e}-{n}" for n, e in CASES])
def test_each_value_renders_the_engines_flag(name, engine):
    cfg = ServingConfig.from_vars({**BASE, "engine": engine, "load_format": name})
    assert cfg.problems() == []
    expected = ["--load-format", name]
    if (engine, name) == ("sglang", "fastsafetensors"):  # GDS is SGLang's default, without fallback
        expected += ["--model-loader-extra-config", '{"enable_gds":false}']
    assert flags(cfg) == expected
    assert problems({"serving_load_format": name}) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_default_renders_no_flag(engine):
    assert flags(ServingConfig.from_vars({**BASE, "engine": engine})) == []
    assert flags(ServingConfig.from_vars({**BASE, "engine": engine, "load_format": ""})) == []


@pytest.mark.parametrize(("name", "engine", "gpus", "says"), [
    ("tensorizer2", "vllm", "cdi", "must be empty (the engine's default) or one of auto, safetensors"),
    ("runai_streamer_sharded", "sglang", "cdi", "the pinned sglang has no such loader; it offers auto"),
    ("fastsafetensors", "vllm", "none", "needs GPUs (it loads straight to CUDA devices"),
    ("instanttensor", "vllm", "none", "needs GPUs"),
    ("fastsafetensors", "sglang", "none", "needs GPUs"),
])  # fmt: skip
def test_an_unsupported_combination_is_refused_with_what_is_offered(name, engine, gpus, says):
    (problem,) = ServingConfig.from_vars({**BASE, "engine": engine, "load_format": name, "gpus": gpus}).problems()
    assert problem.startswith(f"serving_load_format={name!r}") and says in problem, problem


def test_the_variable_check_names_the_choices():
    (problem,) = problems({"serving_load_format": "fast"})
    assert problem.startswith("serving_load_format='fast': must be empty") and "runai_streamer" in problem


def test_the_loaders_package_is_baked_into_the_image_pinned(tmp_path):
    runai = f"runai-model-streamer=={pins.LOADERS['runai_model_streamer']}"
    assert loaders.image_requirements("runai_streamer", "vllm-cpu") == [runai]
    assert loaders.image_requirements("fastsafetensors", "sglang-cuda") == [
        f"fastsafetensors=={pins.LOADERS['fastsafetensors']}"]  # fmt: skip
    # The vllm 0.33.0 wheel requires fastsafetensors and instanttensor itself.
    assert loaders.image_requirements("fastsafetensors", "vllm-cuda") == []
    assert loaders.image_requirements("", "vllm-cpu") == [] == loaders.image_requirements("auto", "sglang-cuda")
    plain, baked = render("vllm-cpu"), render("vllm-cpu", loader_requirements=(runai,))
    assert "runai" not in plain and f"pip install --no-cache-dir {runai}" in baked
    # In the engine's layers, before the patches and the drafter.
    assert baked.index(runai) < baked.index("specdeploy.patches apply")
    assert hadolint(baked, tmp_path).returncode == 0


def test_fastsafetensors_reads_buffered_from_a_warmed_page_cache_and_direct_otherwise():
    warm = ServingConfig.from_vars({**BASE, "engine": "vllm", "load_format": "fastsafetensors",
                                    "page_cache_warmed": "True"})  # fmt: skip
    cold = ServingConfig.from_vars({**BASE, "engine": "vllm", "load_format": "fastsafetensors"})
    assert warm.environment()["FASTSAFETENSORS_ODIRECT"] == "0"
    assert "FASTSAFETENSORS_ODIRECT" not in cold.environment() and warm.digest() != cold.digest()
    default = ServingConfig.from_vars({**BASE, "engine": "vllm", "page_cache_warmed": True})
    assert "FASTSAFETENSORS_ODIRECT" not in default.environment()


def test_upgrading_specdeploy_alone_changes_no_digest():
    """The fields added with the loaders (and the recipe's since) stay out of the digest at their
    defaults: the digest of a configuration from before them is what it was (recomputed without them)."""
    import hashlib  # noqa: PLC0415
    import json  # noqa: PLC0415
    from dataclasses import asdict  # noqa: PLC0415

    cfg = ServingConfig.from_vars({**BASE, "engine": "vllm", "page_cache_warmed": True})
    # The knobs declared late (schema.Knob.late), the warmed page cache (an input only through the loader)
    # the engine cache's folder (it follows from the image, compared apart) and what auto chose (the
    # container is made of the declared `auto`).
    late = {k.field for k in schema.KNOBS if k.late} | {"page_cache_warmed", "cache_dir", "resolved_schedule"}
    assert {"load_format", "kv_cache_dtype", "language_model_only", "multi_node"} <= late
    before = {k: v for k, v in asdict(cfg).items() if k not in late}
    before["api_key"] = None
    assert cfg.digest() == "sha256:" + hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert ServingConfig.from_vars({**BASE, "engine": "vllm", "load_format": "safetensors"}).digest() != cfg.digest()
