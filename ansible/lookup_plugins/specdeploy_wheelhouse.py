"""Lookup `specdeploy_wheelhouse`: the controller-side wheelhouse tar a role copies to its host.

    lookup('specdeploy_wheelhouse', 'router', python='3.11')
    lookup('specdeploy_wheelhouse', 'sentinel')   # this checkout's own wheel (the sentinel needs no more)

Made once under .state/wheelhouses (specdeploy.fleet.router.wheelhouse); the host installs from it
with --no-index.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from specdeploy.engine_image import source
from specdeploy.errors import SpecdeployError
from specdeploy.fleet import router


class LookupModule(LookupBase):  # type: ignore[misc]
    def run(self, terms: list[str], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        makers: dict[str, Callable[[str | None], Path]] = {
            "router": router.wheelhouse,
            "sentinel": lambda _python: source.specdeploy_wheel(),
        }
        out = []
        for term in terms:
            if term not in makers:
                raise AnsibleLookupError(f"specdeploy_wheelhouse: unknown wheelhouse {term!r} ({', '.join(makers)})")
            try:
                out.append(str(makers[term](kwargs.get("python") or None)))
            except SpecdeployError as exc:
                raise AnsibleLookupError(str(exc)) from exc
        return out
