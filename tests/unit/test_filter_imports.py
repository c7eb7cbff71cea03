"""Every Ansible worker loads the filter plugin: it composes from pure modules alone, never Docker's
client, SSH or an HTTP stack (docs/architecture.md). Read in a fresh interpreter, as a worker would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("docker", "paramiko", "httpx", "requests", "rich")

PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("specdeploy_filters", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def loaded_by(plugin: Path) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(plugin)], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_importing_the_filters_loads_no_docker_ssh_or_http_client() -> None:
    loaded = loaded_by(ROOT / "ansible" / "filter_plugins" / "specdeploy_filters.py")
    assert "specdeploy" in loaded  # the probe really imported the plugin
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import specdeploy.serve.group\n")  # the group rollout drives Docker
    assert "docker" in loaded_by(plugin)
