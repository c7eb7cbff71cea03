"""Patch sets per engine version: plan, atomic apply, and the manifest that records it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from specdeploy import __version__
from specdeploy.engine_releases import VLLM_EAGLE3_NATIVE, VLLM_EAGLE3_PATCHABLE
from specdeploy.errors import SpecdeployError
from specdeploy.patches import vllm_eagle3
from specdeploy.patches.codemods import Anchors
from specdeploy.patches.engine_install import EngineInstall

MANIFEST = "specdeploy-patches.json"
Transform = Callable[[cst.Module, Anchors], cst.Module]


@dataclass(frozen=True)
class FilePatch:
    name: str
    path: str  # relative to site-packages
    summary: str
    transform: Transform


@dataclass(frozen=True)
class PatchSet:
    name: str
    patches: tuple[FilePatch, ...]
    note: str

    @property
    def native(self) -> bool:
        return not self.patches


VLLM_EAGLE3 = PatchSet(
    "vllm-eagle3-deepseek-kimi",
    (
        FilePatch(
            "eagle3-target-whitelist",
            vllm_eagle3.SPECULATIVE_CONFIG,
            "add deepseek_v2, deepseek_v3, kimi_k2, kimi_k25 to SpeculativeConfig's EAGLE-3 target whitelist",
            vllm_eagle3.widen_target_whitelist,
        ),
        FilePatch(
            "deepseek-v2-supports-eagle3",
            vllm_eagle3.DEEPSEEK_V2,
            "DeepseekV2ForCausalLM gains SupportsEagle3; DeepseekV2Model captures aux hidden states",
            vllm_eagle3.deepseek_v2_supports_eagle3,
        ),
        FilePatch(
            "kimi-k25-delegates-eagle3",
            vllm_eagle3.KIMI_K25,
            "KimiK25ForConditionalGeneration gains SupportsEagle3, delegating to its language model",
            vllm_eagle3.kimi_k25_delegates_eagle3,
        ),
        FilePatch(
            "drafter-kimi-k25-placeholder",
            vllm_eagle3.EAGLE_PROPOSER,
            "the proposer's load_model gives the drafter Kimi-K2.5's media_placeholder_token_id as its image token",
            vllm_eagle3.drafter_knows_kimi_k25_placeholder,
        ),
    ),
    "vLLM 0.16/0.17 refuse EAGLE-3 for DeepSeek-V3/Kimi-K2.5 targets",
)
VLLM_NATIVE = PatchSet("vllm-native", (), "EAGLE-3 for DeepSeek-V3/Kimi-K2.5 is native from vLLM 0.18.0")
SGLANG_NATIVE = PatchSet("sglang-native", (), "Kimi-K2.5 EAGLE-3 is native in SGLang (merged 2026-03-02)")

# The newest releases whose sources these sets were checked against; newer ones are refused
# until checked, since an unknown source shape is exactly what broke things by hand.
VLLM_NEWEST_KNOWN = (0, 33)
SGLANG_OLDEST, SGLANG_NEWEST_KNOWN = (0, 5, 10), (0, 5, 23)


def select(install: EngineInstall) -> PatchSet:
    major_minor = install.release[:2]
    if install.engine == "sglang":
        if not SGLANG_OLDEST <= install.release <= SGLANG_NEWEST_KNOWN:
            raise SpecdeployError(
                f"SGLang {install.version} is outside the releases specdeploy has checked (0.5.10-0.5.23)",
                hint="Kimi-K2.5 EAGLE-3 landed in 0.5.10; check a newer source, then extend SGLANG_NEWEST_KNOWN",
            )
        return SGLANG_NATIVE
    if major_minor < VLLM_EAGLE3_PATCHABLE:
        raise SpecdeployError(
            f"vLLM {install.version} is not supported: before 0.16, KimiK25ForConditionalGeneration wraps a bare "
            "DeepseekV2Model with its own lm_head, so there is no language model to delegate EAGLE-3 to",
            hint="use vLLM 0.16.x/0.17.x (patched) or 0.18.0+ (native)",
        )
    if major_minor < VLLM_EAGLE3_NATIVE:
        return VLLM_EAGLE3
    if major_minor <= VLLM_NEWEST_KNOWN:
        return VLLM_NATIVE
    raise SpecdeployError(
        f"vLLM {install.version} is newer than the newest release checked ({'.'.join(map(str, VLLM_NEWEST_KNOWN))}.x)",
        hint="check its source, then extend VLLM_NEWEST_KNOWN in specdeploy.patches.patchset",
    )


@dataclass
class PlannedFile:
    patch: FilePatch
    path: Path
    before: str
    after: str

    @property
    def changes(self) -> bool:
        return self.before != self.after


@dataclass
class Plan:
    install: EngineInstall
    patch_set: PatchSet
    files: list[PlannedFile] = field(default_factory=list)

    @property
    def pending(self) -> list[PlannedFile]:
        return [f for f in self.files if f.changes]


def plan(install: EngineInstall) -> Plan:
    """Run every codemod in memory. Any missing anchor raises before a byte is written."""
    patch_set = select(install)
    result = Plan(install, patch_set)
    for patch in patch_set.patches:
        path = install.site_packages / patch.path
        if not path.is_file():
            raise SpecdeployError(f"refusing to patch: {path} does not exist (engine {install.version})")
        before = path.read_text()
        try:
            module = cst.parse_module(before)
        except cst.ParserSyntaxError as exc:
            raise SpecdeployError(f"refusing to patch {path}: it does not parse ({exc.message})") from exc
        after = patch.transform(module, Anchors(patch.path, install.version)).code
        try:
            compile(after, str(path), "exec")
        except SyntaxError as exc:  # a codemod bug must never reach the disk
            raise SpecdeployError(f"patch {patch.name} would write invalid Python at {path}:{exc.lineno}") from exc
        result.files.append(PlannedFile(patch, path, before, after))
    return result


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def manifest(result: Plan) -> dict[str, object]:
    files = {f.patch.path: _sha256(f.after) for f in result.files}
    body: dict[str, object] = {
        "engine": result.install.engine,
        "engine_version": result.install.version,
        "patch_set": result.patch_set.name,
        "native": result.patch_set.native,
        "patches": [{"name": f.patch.name, "file": f.patch.path, "summary": f.patch.summary} for f in result.files],
        "files_sha256": files,
        "specdeploy_version": __version__,
    }
    body["digest"] = "sha256:" + _sha256(json.dumps(body, sort_keys=True))
    return body


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.specdeploy-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def apply(result: Plan) -> list[PlannedFile]:
    """Write every pending file or none: on any failure the originals are restored."""
    written: list[PlannedFile] = []
    try:
        for planned in result.pending:
            _write_atomically(planned.path, planned.after)
            written.append(planned)
    except OSError as exc:
        for planned in written:
            _write_atomically(planned.path, planned.before)
        raise SpecdeployError(f"writing {planned.path} failed ({exc}); every file was restored") from exc
    text = json.dumps(manifest(result), indent=2, sort_keys=True) + "\n"
    target = result.install.site_packages / MANIFEST
    if not target.is_file() or target.read_text() != text:
        _write_atomically(target, text)
    return written
