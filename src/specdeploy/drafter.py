"""EAGLE-3 drafter checks, run before an image build: is it a drafter vLLM/SGLang can load,
does it fit the target model, and are its files the ones its sha256 manifest names?"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

MANIFEST = "SHA256SUMS"  # `sha256sum` format: "<hex>  <relative path>" per line
LLAMA_EAGLE3 = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
MLA_EAGLE3 = ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")


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


def parse_manifest(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip():
            digest, _, name = line.strip().partition("  ")
            entries[name.lstrip("*").removeprefix("./")] = digest.lower()
    return entries


def problems(
    config_text: str, manifest_text: str | None, files_sha256: Mapping[str, str], target_config_text: str | None = None
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
    elif target_config_text is not None:
        target = _text_config(json.loads(target_config_text))
        hidden, vocab = _drafter_dims(config, kind)
        if hidden is not None and hidden != target.get("hidden_size"):
            found.append(f"drafter expects target hidden size {hidden}, the target has {target.get('hidden_size')}")
        if vocab is not None and vocab != target.get("vocab_size"):
            found.append(f"drafter vocabulary {vocab} differs from the target's {target.get('vocab_size')}")
    if manifest_text is None:
        found.append(f"no {MANIFEST} manifest in the drafter folder (make one: sha256sum * > {MANIFEST})")
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
