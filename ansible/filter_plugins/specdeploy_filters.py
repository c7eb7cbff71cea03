"""Thin Jinja filters: the decisions live in the specdeploy package."""

from __future__ import annotations

from typing import Any

from specdeploy.platforms import platform_problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"specdeploy_platform_problems": platform_problems}
