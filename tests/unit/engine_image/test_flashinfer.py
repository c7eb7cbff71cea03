"""FlashInfer's kernels in the engine image: the three ways rendered hadolint-clean, a wrong choice
refused before any build, the operator's wheels carried into the context and counted in its inputs,
and the in-image lister's report (run by the build in the engine's interpreter)."""

from __future__ import annotations

import pytest

from specdeploy.engine_image import flashinfer, profiles
from specdeploy.engine_side.flashinfer_kernels import report
from specdeploy.errors import SpecdeployError
from tests.unit.engine_image.test_profiles import hadolint, render


@pytest.mark.parametrize("mode", ["", "download", "folder"])
def test_each_way_renders_hadolint_clean_and_the_build_lists_the_kernels(mode, tmp_path):
    text = render("vllm-cuda", flashinfer_kernels=mode)
    assert hadolint(text, tmp_path).returncode == 0
    assert "-m specdeploy.engine_side.flashinfer_kernels" in text  # every image says what it carries
    assert ("RUN vllm download-kernels" in text) == (mode == "download")
    assert ("COPY flashinfer-kernels/" in text) == (mode == "folder")
    if mode:  # before the patch layer: a patch change never re-downloads GBs of kernels
        assert text.index("flashinfer") < text.index("specdeploy.patches apply")


def test_a_choice_that_cannot_work_is_refused_before_any_build(tmp_path):
    assert flashinfer.problems(profiles.profile("vllm-cuda"), "download") == []
    assert "CPU build" in flashinfer.problems(profiles.profile("vllm-cpu"), "download")[0]
    assert "vllm download-kernels" in flashinfer.problems(profiles.profile("sglang-cuda"), "download")[0]
    with pytest.raises(SpecdeployError, match="neither 'download' nor a folder"):
        flashinfer.wheels(str(tmp_path / "missing"))
    (tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(SpecdeployError, match="holds no flashinfer_cubin"):
        flashinfer.wheels(str(tmp_path))


def test_the_operators_wheels_go_into_the_context_and_change_its_inputs(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "flashinfer_cubin-0.7.2.post1-py3-none-any.whl").write_bytes(b"cubins")
    (mirror / "README").write_text("not a wheel")
    context = tmp_path / "context"
    first = flashinfer.fill(context, str(mirror))
    assert sorted(p.name for p in (context / "flashinfer-kernels").iterdir()) == [
        "flashinfer_cubin-0.7.2.post1-py3-none-any.whl"
    ]
    copied = context / "flashinfer-kernels" / "flashinfer_cubin-0.7.2.post1-py3-none-any.whl"
    copied.write_bytes(b"cubins")  # (a mark: a converged fill must not copy again)
    before = copied.stat().st_mtime_ns
    assert flashinfer.fill(context, str(mirror)) == first and copied.stat().st_mtime_ns == before
    (mirror / "flashinfer_jit_cache-0.7.2.post1+cu129-cp39-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"jit")
    assert flashinfer.fill(context, str(mirror)) != first and len(list((context / "flashinfer-kernels").iterdir())) == 2
    assert flashinfer.fill(context, "") == "" and list((context / "flashinfer-kernels").iterdir()) == []


def test_the_lister_names_each_kernel_package_and_refuses_another_flashinfer_version():
    installed = {"flashinfer-python": "0.7.2.post1"}
    lines, problems = report(installed.get, lambda name: 0)
    assert lines[0] == "FlashInfer: flashinfer-python 0.7.2.post1" and problems == []
    assert "flashinfer-cubin: not carried" in lines[1] and "no ahead-of-time kernels" in lines[-1]
    installed |= {"flashinfer-cubin": "0.7.2.post1", "flashinfer-jit-cache": "0.7.2.post1+cu129"}
    lines, problems = report(installed.get, lambda name: {"flashinfer-cubin": 812, "flashinfer-jit-cache": 97}[name])
    assert lines[1:] == ["  flashinfer-cubin 0.7.2.post1: 812 kernel files",
                         "  flashinfer-jit-cache 0.7.2.post1+cu129: 97 kernel files"]  # fmt: skip
    assert problems == []
    # PyPI's newest cubin package beside vLLM 0.33's FlashInfer: refused at build time, not at the first request.
    lines, problems = report({**installed, "flashinfer-cubin": "0.6.13"}.get, lambda name: 1)
    assert problems == ["flashinfer-cubin 0.6.13 is not FlashInfer 0.7.2.post1's: FlashInfer refuses it at run time"]
    assert report({}.get, lambda name: 0) == (
        ["FlashInfer: flashinfer-python is not installed (no FlashInfer kernels to carry)"],
        [],
    )
