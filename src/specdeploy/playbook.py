"""Run ansible-playbook against an inventory and read its PLAY RECAP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.paths import project_root

_RECAP_LINE = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>(?:\w+=\d+\s*)+)$")


@dataclass(frozen=True)
class PlaybookRun:
    returncode: int
    output: str
    recap: dict[str, dict[str, int]]

    @property
    def changed(self) -> int:
        return sum(counts.get("changed", 0) for counts in self.recap.values())


def parse_recap(output: str) -> dict[str, dict[str, int]]:
    """{host: {ok, changed, unreachable, failed, ...}} from the last PLAY RECAP block."""
    _, _, tail = output.rpartition("PLAY RECAP")
    recap: dict[str, dict[str, int]] = {}
    for line in tail.splitlines():
        match = _RECAP_LINE.match(line.strip())
        if match:
            pairs = (item.split("=") for item in match["counts"].split())
            recap[match["host"]] = {key: int(value) for key, value in pairs}
    return recap


def unreachable_sentence(recap: dict[str, dict[str, int]]) -> str | None:
    """What a run that lost a host's SSH says first: the host, that the run stopped there (the preflight
    play is fatal to all, a rollout batch stops the rollout), and the next command. None if none was lost."""
    lost = sorted(host for host, counts in recap.items() if counts.get("unreachable", 0))
    if not lost:
        return None
    names = ", ".join(lost)
    return (f"{names}: unreachable over SSH, so the run stopped at {'them' if len(lost) > 1 else 'it'}: hosts of "
            "earlier batches keep what their rollout proved, and no later batch was started. When "
            f"`ssh` to {names} works again, run make deploy again: what serves and is converged is kept")  # fmt: skip


def ansible_env() -> dict[str, str]:
    config = project_root() / "ansible.cfg"
    # An installed specdeploy outside a checkout has no ansible.cfg: the inventory carries the SSH
    # settings (known_hosts, key) itself.
    env = {**os.environ, **({"ANSIBLE_CONFIG": str(config)} if config.is_file() else {})}
    # The venv's bin dir first, so plugins import this very specdeploy.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_playbook(inventory: Path, *extra: str, playbook: str = "ansible/site.yml") -> PlaybookRun:
    root = project_root()
    binary = Path(sys.executable).parent / "ansible-playbook"
    cmd = [str(binary if binary.exists() else "ansible-playbook"), "-i", str(inventory), playbook, *extra]
    try:
        proc = subprocess.Popen(
            cmd, cwd=root, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except FileNotFoundError as exc:
        raise SpecdeployError("ansible-playbook is not installed", hint="run `make setup`") from exc
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # stream, so long phases show progress live
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    output = "".join(lines)
    return PlaybookRun(proc.wait(), output, parse_recap(output))
