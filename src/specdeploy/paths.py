"""Where the project's files and its git-ignored state live."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout that holds `ansible/site.yml` (SPECDEPLOY_ROOT overrides)."""
    override = os.environ.get("SPECDEPLOY_ROOT")
    if override:
        return Path(override).resolve()
    here = Path(__file__).resolve()
    for candidate in (*here.parents, Path.cwd()):
        if (candidate / "ansible" / "site.yml").is_file():
            return candidate
    return Path.cwd()


def state_dir() -> Path:
    """Everything generated at run time: keys, known_hosts, fact cache, run logs."""
    override = os.environ.get("SPECDEPLOY_STATE")
    return Path(override).resolve() if override else project_root() / ".state"
