"""The verify phase: testinfra checks of a host over real SSH (host keys verified), shipped in the
package so that an installed specdeploy verifies a host without the checkout. The Verify play runs
them per host (action specdeploy_verify); `specdeploy verify` runs them for an inventory.

The checks use testinfra's OpenSSH backend with the connection settings the deploy uses (one
multiplexed session per host: a check is one SSH round trip, not one ansible run), and read the
host's non-secret variables from a file this module writes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.connection import HostConnection

CHECKS_DIR = Path(__file__).resolve().parent
VARS_ENV = "SPECDEPLOY_VERIFY_VARS"
# The variables the checks read; secrets (API keys, passwords) never reach them.
CHECKED_PREFIXES = ("serving_", "engine_image_", "nvidia_driver_", "cuda_toolkit_", "container_runtime_")
_SECRET = re.compile(r"api_key|password|secret|token|vault", re.IGNORECASE)


@dataclass(frozen=True)
class HostUnderCheck:
    name: str  # the inventory hostname
    connection: HostConnection
    variables: Mapping[str, Any]


def checked_variables(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The non-secret variables the checks read. A value still holding Jinja (`ansible-inventory
    --list` does not template) is left out: the checks then use what the deploy recorded."""
    return {k: v for k, v in hostvars.items() if k.startswith(CHECKED_PREFIXES) and not _SECRET.search(k)
            and not (isinstance(v, str) and "{{" in v)}  # fmt: skip


def ssh_config(hosts: list[HostUnderCheck], control_dir: Path) -> str:
    blocks = []
    for h in hosts:
        target, ssh = h.connection.target, h.connection.ssh
        options = [ssh.options()[i + 1] for i in range(0, len(ssh.options()), 2)]  # the values of -o pairs
        lines = [f"Host {h.name}", f"  HostName {target.host}", f"  Port {target.port}", "  BatchMode yes",
                 "  ControlMaster auto", f"  ControlPath {control_dir}/%C", "  ControlPersist 60s"]  # fmt: skip
        lines += [f"  User {target.user}"] if target.user else []
        lines += ["  " + option.replace("=", " ", 1) for option in options]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def run(
    hosts: list[HostUnderCheck], capture: bool = False, checks: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """pytest over the shipped checks (check_*.py, or only CHECKS) for HOSTS, from the checks' own
    folder (short node ids), with no pytest configuration but ours and no bytecode written into
    site-packages."""
    with tempfile.TemporaryDirectory(prefix="specdeploy-verify-") as tmp:
        config, variables = Path(tmp) / "ssh_config", Path(tmp) / "vars.json"
        config.write_text(ssh_config(hosts, Path(tmp)))
        variables.write_text(json.dumps({h.name: checked_variables(h.variables) for h in hosts}))
        cmd = [
            sys.executable, "-m", "pytest", *(checks or (str(CHECKS_DIR),)),
            "-c", os.devnull, "--rootdir", str(CHECKS_DIR), "-o", "python_files=check_*.py",
            "-p", "no:cacheprovider", "-v", "--tb=short",
            f"--hosts={','.join('ssh://' + h.name for h in hosts)}", f"--ssh-config={config}",
        ]  # fmt: skip
        env = {**os.environ, VARS_ENV: str(variables), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            return subprocess.run(cmd, cwd=CHECKS_DIR, env=env, text=True, capture_output=capture, check=False)
        finally:
            for h in hosts:  # close the multiplexed sessions
                subprocess.run(["ssh", "-F", str(config), "-O", "exit", h.name], capture_output=True, check=False)
