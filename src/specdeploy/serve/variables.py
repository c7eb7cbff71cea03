"""Every serving inventory value checked once, before anything touches a host: types, ranges,
formats and secrets. Each refusal names the variable as the user wrote it, the value, and what is
allowed, so the fix is one edit away. The rules are declared with their variables (specdeploy.serve.schema)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from specdeploy.serve.engine_words import SGLANG_LANGUAGE_MODEL_ONLY_ARCHITECTURES
from specdeploy.serve.schema import RULES


def problems(values: Mapping[str, Any]) -> list[str]:
    """One sentence per bad value: `serving_port=70000: must be a whole number from 1 to 65535`."""
    out = []
    for variable, check in RULES.items():
        if variable not in values:
            continue
        allowed = check(values[variable])
        if allowed:
            secret = allowed.startswith("no secrets")
            shown = "(not shown)" if secret or isinstance(values[variable], Mapping) else repr(values[variable])
            out.append(f"{variable}={shown[:120]}: must be {allowed}")
    return out


def _model_config(config_text: str | None) -> dict[str, Any]:
    """The model's config.json as a mapping; empty when it was not read or is not JSON (the engine
    says so itself: these checks only add what is known before it starts)."""
    try:
        config = json.loads(config_text) if config_text else {}
    except json.JSONDecodeError:
        return {}
    return config if isinstance(config, dict) else {}


def remote_code_warnings(config_text: str | None, trust_remote_code: bool) -> list[str]:
    """A model folder whose config.json maps classes to its own code (auto_map) loads only with
    --trust-remote-code; without it the engine fails late, after the image build and the rollout."""
    if trust_remote_code:
        return []
    auto_map = _model_config(config_text).get("auto_map")
    if not auto_map:
        return []
    return [f"the model's config.json maps {', '.join(sorted(auto_map))} to custom code (auto_map), but "
            "serving_trust_remote_code is false: the engine will refuse to load it; set serving_trust_remote_code: "
            "true if you trust the model's code"]  # fmt: skip


def model_problems(config_text: str | None, engine: str, language_model_only: bool) -> list[str]:
    """What the engine would refuse at start-up, known from the model's config.json before the rollout:
    SGLang's --language-model-only admits only some architectures (engine_words), not Kimi-K2.5's."""
    architectures = _model_config(config_text).get("architectures") or []
    if engine != "sglang" or not language_model_only or not architectures or not isinstance(architectures, list):
        return []
    if set(architectures) & set(SGLANG_LANGUAGE_MODEL_ONLY_ARCHITECTURES):
        return []
    return [f"serving_language_model_only: true, but the pinned SGLang refuses --language-model-only for "
            f"{', '.join(map(str, architectures))} (it admits "
            f"{', '.join(SGLANG_LANGUAGE_MODEL_ONLY_ARCHITECTURES)}): set serving_language_model_only: false, "
            "or serve it with specdeploy_engine: vllm"]  # fmt: skip
