"""Every serving inventory value checked once, before anything touches a host: types, ranges,
formats and secrets. Each refusal names the variable as the user wrote it, the value, and what is
allowed, so the fix is one edit away. The rules are declared with their variables (specdeploy.serve.schema)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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


def remote_code_warnings(config_text: str | None, trust_remote_code: bool) -> list[str]:
    """A model folder whose config.json maps classes to its own code (auto_map) loads only with
    --trust-remote-code; without it the engine fails late, after the image build and the rollout."""
    if not config_text or trust_remote_code:
        return []
    try:
        config = json.loads(config_text)
    except json.JSONDecodeError:
        return []
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not auto_map:
        return []
    return [f"the model's config.json maps {', '.join(sorted(auto_map))} to custom code (auto_map), but "
            "serving_trust_remote_code is false: the engine will refuse to load it; set serving_trust_remote_code: "
            "true if you trust the model's code"]  # fmt: skip
