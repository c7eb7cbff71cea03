"""EAGLE-3 drafter checks, run before an image build: is it a drafter vLLM/SGLang can load,
does it fit the target model, and are its files the ones its sha256 manifest names?"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy.engine_releases import VLLM_EAGLE3_NATIVE, release_text

MANIFEST = "SHA256SUMS"  # `sha256sum` format: "<hex>  <relative path>" per line
LLAMA_EAGLE3 = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
MLA_EAGLE3 = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
# vLLM loads MLA EAGLE-3 drafters from 0.18 (docs/engine-facts.md); before, Llama-style only.
MLA_EAGLE3_VLLM = VLLM_EAGLE3_NATIVE
# The EAGLE-3 drafter classes the pinned SGLang registers (EntryClass of sglang/srt/models/*eagle3*.py
# in 0.5.23; tests/integration/test_patch_releases.py reads them from the real release). SGLang has no
# reader for the speculators format.
SGLANG_EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
AUX_KEY = "eagle_aux_hidden_state_layer_ids"
# Targets whose EAGLE-3 capture is deepseek_v2.py's in both engines (Kimi-K2.5's text model is a DeepSeek-V3).
DEEPSEEK_TARGETS = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
PORTABLE_AUX = "use ids that start above 1 and end below the last layer, read alike by vLLM and SGLang"


def drafter_kind(config: Mapping[str, Any]) -> str | None:
    """'speculators', 'llama-eagle3' or 'mla-eagle3'; None when this is not an EAGLE-3 drafter."""
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    architectures = set(config.get("architectures") or [])
    if architectures & set(LLAMA_EAGLE3):
        return "llama-eagle3"
    if architectures & set(MLA_EAGLE3):
        return "mla-eagle3"
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    # Kimi-K2.5 (multimodal) nests the language model's config under text_config.
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def _drafter_dims(config: Mapping[str, Any], kind: str) -> tuple[int | None, int | None]:
    """(hidden size it expects from the target, full vocabulary size)."""
    layer = config.get("transformer_layer_config") or {} if kind == "speculators" else config
    hidden = config.get("target_hidden_size") or layer.get("hidden_size")
    vocab = layer.get("vocab_size") or config.get("vocab_size")
    return (int(hidden) if hidden else None, int(vocab) if vocab else None)


def aux_layer_readings(ids: Sequence[int], engine: str) -> list[int]:
    """The target layers whose input (the residual stream after that many layers) ENGINE's DeepSeek-V2/V3
    model captures for a drafter's eagle_aux_hidden_state_layer_ids IDS, in their order.

    vLLM (vllm/model_executor/models/deepseek_v2.py, DeepseekV2Model.forward; read in 0.32.0 and 0.33.0):
    as written, `hidden_states + residual` before layer i. Id 0 crashes (no residual yet); id
    num_hidden_layers is the last layer's output (captured after the loop).
    SGLang (sglang/srt/models/deepseek_v2.py, DeepseekV2ForCausalLM.set_eagle3_layers_to_capture; read in
    0.5.17 and 0.5.23): ids whose first is 1 are shifted by +1 (`if layer_ids[0] == 1`), others taken as
    written; DeepseekV2Model.forward captures layer i's input for i < num_hidden_layers only, so a reading
    at or past it is never captured ("captured 2 of 3 aux hidden states"). Id 0 is the embedding.
    (Its Llama model shifts every id by +1: sglang/srt/models/llama.py; not mirrored here.)
    """
    if engine == "sglang" and ids and ids[0] == 1:
        return [i + 1 for i in ids]
    return list(ids)


def _aux_ids_at(config: Mapping[str, Any]) -> tuple[list[Any] | None, list[Any] | None]:
    """(top-level ids, eagle_config's ids)."""
    nested = config.get("eagle_config")
    top, inner = config.get(AUX_KEY), nested.get(AUX_KEY) if isinstance(nested, Mapping) else None
    return (list(top) if top is not None else None, list(inner) if inner is not None else None)


def _aux_problems(
    config: Mapping[str, Any], engine: tuple[str, str] | None, target: Mapping[str, Any] | None
) -> list[str]:
    """Aux layer ids the image's engine does not read, or reads other than written, or crashes on."""
    found: list[str] = []
    name, version = engine or ("", "")
    top, nested = _aux_ids_at(config)
    if top is not None and nested is not None and top != nested:
        found.append(f"{AUX_KEY} {top} differs from eagle_config.{AUX_KEY} {nested}: vLLM reads the first, "
                     "SGLang the second; make them the same")  # fmt: skip
    if name == "sglang" and top is not None and nested is None:
        # sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py (0.5.17, 0.5.23)
        return [*found, f"SGLang {version} reads the aux layer ids only from eagle_config.{AUX_KEY}, which this "
                        f"drafter lacks: it would capture its default layers, not {top}; copy them there"]  # fmt: skip
    if name == "vllm" and top is None and nested is not None:
        # vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, get_eagle3_aux_layers_from_config (0.32.0, 0.33.0):
        # the V2 model runner, the default where Triton is (CUDA), reads only the top-level key.
        found.append(f"vLLM {version}'s V2 model runner (its default on CUDA) reads the aux layer ids only from the "
                     f"top-level {AUX_KEY}, which this drafter lacks: it would capture its default layers, not "
                     f"{nested}; copy them there")  # fmt: skip
    ids = nested if name == "sglang" else (top if top is not None else nested)
    if ids is None:
        return found
    layers = target.get("num_hidden_layers") if target else None
    top_layer = int(layers) - 1 if layers else None
    # SGLang takes layer 0's input (the embedding); vLLM crashes there. vLLM 0.32/0.33 would also take
    # id num_hidden_layers (the last layer's output); SGLang and the patched 0.16/0.17 never capture it.
    lowest = 0 if name == "sglang" else 1
    allowed = f"{lowest} … {top_layer}" if top_layer is not None else f">= {lowest}"
    why = (f"SGLang {version} captures only its layers' inputs: others die with 'captured … of … aux hidden states'"
           if name == "sglang"
           else "layer 0 has no residual yet: the target crashes with 'Tensor' + 'NoneType'")  # fmt: skip
    if any(not isinstance(i, int) or isinstance(i, bool) for i in ids) or len(set(ids)) != len(ids):
        return [*found, f"{AUX_KEY} {ids}: each must be a distinct layer index in {allowed} ({why}): {PORTABLE_AUX}"]
    model_type = target.get("model_type") if target else None
    readings = aux_layer_readings(ids, name) if model_type in (None, *DEEPSEEK_TARGETS) else list(ids)
    past = [r for r in readings if r < lowest or (top_layer is not None and r > top_layer)]
    if readings != ids:
        crash = (f", and the target has layers 0 … {top_layer}: it dies with 'captured {len(ids) - len(past)} of "
                 f"{len(ids)} aux hidden states'") if past else ""  # fmt: skip
        found.append(f"SGLang {version} reads {AUX_KEY} {ids} as layers {readings} (its DeepSeek model shifts ids "
                     f"that start at 1 by one: sglang/srt/models/deepseek_v2.py, set_eagle3_layers_to_capture)"
                     f"{crash}; vLLM reads them as written: {PORTABLE_AUX}")  # fmt: skip
    elif past:
        found.append(f"{AUX_KEY} {ids}: each must be a distinct layer index in {allowed} ({why}): {PORTABLE_AUX}")
    return found


def _version(text: str) -> tuple[int, int]:
    major, minor = [*text.split("+", maxsplit=1)[0].split("."), "0"][:2]
    return int(major), int(minor)


def _sglang_problems(config: Mapping[str, Any], kind: str, version: str) -> list[str]:
    known = ", ".join(SGLANG_EAGLE3_ARCHITECTURES)
    if kind == "speculators":
        return [f"the drafter is in the speculators format (speculators_model_type), which SGLang {version} cannot "
                f"read: use a drafter whose config.json architectures is one of {known}"]  # fmt: skip
    architectures = list(config.get("architectures") or [])
    if not set(architectures) & set(SGLANG_EAGLE3_ARCHITECTURES):
        return [f"config.json architectures {architectures} is not an EAGLE-3 drafter SGLang {version} registers "
                f"({known}): rename it if the weights match (vLLM's "
                "Eagle3LlamaForCausalLM is SGLang's LlamaForCausalLMEagle3), or use the vllm-cuda profile"]  # fmt: skip
    return []


def engine_problems(
    config: Mapping[str, Any], kind: str, engine: tuple[str, str] | None, target: Mapping[str, Any] | None
) -> list[str]:
    """What the pinned engine (name, version) cannot load, and aux layer ids it reads out of the target's
    range or other than written (see aux_layer_readings)."""
    found = []
    name, version = engine or ("", "0")
    if kind == "mla-eagle3" and name == "vllm" and _version(version) < MLA_EAGLE3_VLLM:
        found.append(f"the MLA EAGLE-3 drafter ({', '.join(config.get('architectures') or [])}) loads only on vLLM "
                     f">= {release_text(MLA_EAGLE3_VLLM)}, and this image has vLLM {version}: use a Llama-style "
                     "EAGLE-3 drafter, or a profile with a newer vLLM")  # fmt: skip
    if name == "sglang":
        found += _sglang_problems(config, kind, version)
    return found + _aux_problems(config, engine, target)


def parse_manifest(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip():
            digest, _, name = line.strip().partition("  ")
            entries[name.lstrip("*").removeprefix("./")] = digest.lower()
    return entries


def problems(
    config_text: str,
    manifest_text: str | None,
    files_sha256: Mapping[str, str],
    target_config_text: str | None = None,
    engine: tuple[str, str] | None = None,  # (engine, version) the image will run
) -> list[str]:
    """Every reason to refuse this drafter (empty when it is fine)."""
    found: list[str] = []
    try:
        config = json.loads(config_text)
    except json.JSONDecodeError as exc:
        return [f"config.json is not JSON: {exc}"]
    kind = drafter_kind(config)
    if kind is None:
        found.append(
            f"config.json is not an EAGLE-3 drafter (architectures {config.get('architectures')}); expected the "
            f"speculators format (speculators_model_type: eagle3), {' / '.join(LLAMA_EAGLE3)} or {MLA_EAGLE3[0]}"
        )
    target = _text_config(json.loads(target_config_text)) if target_config_text is not None else None
    if kind is not None:
        found += engine_problems(config, kind, engine, target)
    if kind is not None and target is not None:
        hidden, vocab = _drafter_dims(config, kind)
        if hidden is not None and hidden != target.get("hidden_size"):
            found.append(f"drafter expects target hidden size {hidden}, the target has {target.get('hidden_size')}")
        if vocab is not None and vocab != target.get("vocab_size"):
            found.append(f"drafter vocabulary {vocab} differs from the target's {target.get('vocab_size')}")
    if manifest_text is None:
        make = f"find . -type f ! -name {MANIFEST} -exec sha256sum {{}} + > {MANIFEST}"  # subfolders too, not itself
        found.append(f"no {MANIFEST} manifest in the drafter folder (make one in it: {make})")
        return found
    expected = parse_manifest(manifest_text)
    actual = {name: digest for name, digest in files_sha256.items() if name != MANIFEST}
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            found.append(f"{MANIFEST} lists {name}, which is missing")
        elif name not in expected:
            found.append(f"{name} is not in {MANIFEST}")
        elif expected[name] != actual[name]:
            found.append(f"{name}: sha256 {actual[name][:12]}… does not match {MANIFEST} ({expected[name][:12]}…)")
    return found


def digest(files_sha256: Mapping[str, str]) -> str:
    """One digest for the drafter: over its files' names and sha256s (the manifest excluded)."""
    body = "".join(f"{name}\0{files_sha256[name]}\n" for name in sorted(files_sha256) if name != MANIFEST)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


# One SSH round trip reads everything the check needs: each file's sha256 (sha256sum lines) and
# the two config files and the manifest, base64 on lines of their own ("=name <b64>").
READ_SCRIPT = r"""
cd "$1" 2>/dev/null || { echo "=nodir"; exit 0; }
{ find . -type f -print0 | xargs -0 -r sha256sum -- 2>&1 1>&3 | sed 's/^/=error /'; } 3>&1
for f in config.json SHA256SUMS; do [ -r "$f" ] && printf '=%s %s\n' "$f" "$(base64 -w0 "$f")"; done
[ -n "$2" ] && [ -r "$2/config.json" ] && printf '=target %s\n' "$(base64 -w0 "$2/config.json")"
exit 0
"""


@dataclass(frozen=True)
class DrafterOnHost:
    files_sha256: dict[str, str]
    documents: dict[str, str]  # config.json, SHA256SUMS, target (the target's config.json)
    unreadable: list[str]
    exists: bool


def parse_read(output: str) -> DrafterOnHost:
    files: dict[str, str] = {}
    docs: dict[str, str] = {}
    unreadable: list[str] = []
    exists = True
    for line in output.splitlines():
        if line == "=nodir":
            exists = False
        elif line.startswith("=error "):
            # sha256sum: ./weights.bin: Permission denied
            unreadable.append(line.removeprefix("=error ").split(": ", 2)[1].removeprefix("./"))
        elif line.startswith("="):
            name, _, b64 = line[1:].partition(" ")
            docs[name] = base64.b64decode(b64).decode(errors="replace")
        elif "  " in line:
            sha, name = line.split("  ", 1)
            files[name.removeprefix("./")] = sha
    return DrafterOnHost(files, docs, unreadable, exists)


def check_on_host(read: DrafterOnHost, path: str, user: str, engine: tuple[str, str] | None) -> list[str]:
    """Every reason to refuse the drafter read from PATH on the host."""
    if not read.exists:
        return [f"{path} is not a folder on the host: set engine_image_drafter_path"]
    if read.unreadable:
        return [f"cannot read {', '.join(read.unreadable)} as {user}: make the drafter's files readable "
                f"(chmod -R a+rX {path})"]  # fmt: skip
    return problems(read.documents.get("config.json", "{}"), read.documents.get(MANIFEST), read.files_sha256,
                    read.documents.get("target"), engine)  # fmt: skip
