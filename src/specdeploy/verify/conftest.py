"""testinfra's `host` fixture comes from the pytest-testinfra plugin (--hosts=ssh://...); `hostvars`
is the host's non-secret inventory variables, written by specdeploy.verify.run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from testinfra.host import Host

from specdeploy.verify import VARS_ENV


@pytest.fixture
def hostvars(host: Host) -> dict[str, Any]:
    path = os.environ.get(VARS_ENV)
    if not path:
        return {}
    name = host.backend.get_hostname()
    return dict(json.loads(Path(path).read_text()).get(name, {}))
