"""`make bench`: a newcomer's first `make deploy`, from a fresh clone with everything cold, then a
converged `make deploy`, each as the user runs it, beside issue 27's figures as ratios (this run).

Cold means: no test bed, none of specdeploy's images or the test-bed hosts' engine volumes, empty pip
and uv caches, a fresh clone of HEAD (so its own .venv and .state). The Docker engine itself stays
installed and running, as on a machine that has been used before. This removes the local test bed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specdeploy import docker_engine
from specdeploy.paths import project_root, state_dir
from specdeploy_testbed import testbed

# Issue 27's figures, measured on a bare machine following only the README (its "Why").
BEFORE_COLD_S = 21 * 60 + 44.0
BEFORE_CONVERGED_S = 22.7
GOAL_COLD_S = 600.0
GOAL_CONVERGED_S = 15.0
SPECDEPLOY_IMAGES = ("specdeploy/debian-base", testbed.HOST_IMAGE_REPO)


def make_cold() -> None:
    """Remove what a first deploy makes on this machine's Docker engine: the test-bed hosts with their
    engine volumes (the engine image's layers live there), the base and host images."""
    testbed.down(purge=True)
    client = docker_engine.ensure_engine(state_dir())
    for image in client.images.list():
        if any(tag.split(":")[0] in SPECDEPLOY_IMAGES for tag in image.tags):
            client.images.remove(image.id, force=True)


def make_deploy(clone: Path, env: dict[str, str], log: Path) -> tuple[float, str]:
    """`make deploy` in CLONE, timed from outside; its output goes to LOG and is returned."""
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(["make", "deploy"], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                              check=False)  # fmt: skip
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"make deploy exited {proc.returncode} (log: {log}):\n{text[-4000:]}")
    return seconds, text


def table(text: str) -> list[str]:
    """The time table `make deploy` ends with."""
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("where the time went")), None)
    if first is None:
        return ["(no time table in the output)"]
    end = next((i for i in range(first + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[first:end]


def row(what: str, seconds: float, before: float, goal: float) -> str:
    verdict = "met" if seconds <= goal else "MISSED"
    return (f"  {what:44} {seconds:7.1f} s   before {before:7.1f} s   {seconds / before:5.2f}x   "
            f"goal <= {goal:.0f} s: {verdict}")  # fmt: skip


def main() -> None:
    root = project_root()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    logs = state_dir() / "bench" / "first-deploy"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"first make deploy from a fresh clone of {head}, cold (this removes the local test bed) ...", flush=True)
    make_cold()
    with tempfile.TemporaryDirectory(prefix="specdeploy-bench-") as tmp:
        clone, caches = Path(tmp) / "clone", Path(tmp) / "caches"
        subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECDEPLOY_", "VIRTUAL_ENV"))}
        env |= {"PIP_CACHE_DIR": str(caches / "pip"), "UV_CACHE_DIR": str(caches / "uv")}
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p)
        cold, cold_text = make_deploy(clone, env, logs / "cold.log")
        converged, converged_text = make_deploy(clone, env, logs / "converged.log")
    if not re.search(r"deploy ok: \d+ host\(s\), changed=0\b", converged_text):
        sys.exit(f"the second make deploy was not converged (changed != 0); log: {logs / 'converged.log'}")
    print("\n".join(table(cold_text)))
    print("\n".join(table(converged_text)))
    print(f"a newcomer's make deploy on this machine ({os.cpu_count()} cores; commit {head}; logs in {logs})")
    print(row("first, from a fresh clone, cold, to READY", cold, BEFORE_COLD_S, GOAL_COLD_S))
    print(row("converged (changed=0)", converged, BEFORE_CONVERGED_S, GOAL_CONVERGED_S))


if __name__ == "__main__":
    main()
