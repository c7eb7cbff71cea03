"""Thin Jinja filters: the decisions live in the specdeploy package."""

from __future__ import annotations

from typing import Any

from specdeploy import drafter
from specdeploy.platforms import platform_problems


def drafter_check(
    files_sha256: dict[str, str], config_text: str, manifest_text: str | None, target_config_text: str | None
) -> dict[str, Any]:
    return {
        "problems": drafter.problems(config_text, manifest_text, files_sha256, target_config_text),
        "digest": drafter.digest(files_sha256),
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"specdeploy_platform_problems": platform_problems, "specdeploy_drafter_check": drafter_check}
