"""Thin Jinja filters: the decisions live in the specdeploy package."""

from __future__ import annotations

from typing import Any

from specdeploy import drafter
from specdeploy.platforms import platform_problems
from specdeploy.serving.config import ServingConfig


def drafter_check(
    files_sha256: dict[str, str], config_text: str, manifest_text: str | None, target_config_text: str | None
) -> dict[str, Any]:
    return {
        "problems": drafter.problems(config_text, manifest_text, files_sha256, target_config_text),
        "digest": drafter.digest(files_sha256),
    }


def serving_problems(config: dict[str, Any], api_key: str | None = None) -> list[str]:
    try:
        return ServingConfig.from_vars({**config, "api_key": api_key}).problems()
    except (TypeError, ValueError) as exc:
        return [f"serving variables: {exc}"]


def serving_command(config: dict[str, Any]) -> str:
    """The engine's command line, for the report (the API key is never part of it)."""
    return " ".join(ServingConfig.from_vars(config).command())


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "specdeploy_platform_problems": platform_problems,
            "specdeploy_drafter_check": drafter_check,
            "specdeploy_serving_problems": serving_problems,
            "specdeploy_serving_command": serving_command,
        }
