"""`make bench`: the watchdog on every real log of tests/data/real_logs/, against the ways people
judge a start-up without it, in one run.

Each log is replayed as a live process and judged by `specdeploy watch` through the CLI, as in the
tests. Our time to a verdict is measured: from the replay's exit (a crash) or from the moment it
went silent (a hang; the bench runs with a short stall window and also prints what the 300 s
default gives). The peers are judged on the same replays by their own schedules, which the bench
does not wait out (their timings are computed, not slept):

- seeds: `sleep 60`, then `grep -iE 'error|exception' | grep -v FutureWarning` on the log (run
  for real); an operator reads the first line that is not known noise; when there is none, the
  long sleep (2100 s) before looking again. A crash at F s after launch is judged at 60 - F s.
- a Kubernetes-style startup probe: `GET /health` every 10 s, failing after 60 tries (600 s after
  launch); it shows "startup probe failed", never a cause.
- a router-style health check: every 60 s, unhealthy after 3 failures; never a cause.

F, when a crash happened after launch, is the span of the log's own timestamps (0 when it has
none): a lower bound, since pasted logs are trimmed at the top.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from specdeploy.watch.loglines import noise_id, parse_line

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.support.corpus import CorpusLog, load, names_true_cause, replay_through_cli

STALL_WINDOW_S = 3.0
DEFAULT_STALL_S = 300.0
SEEDS_SLEEP_S, SEEDS_LONG_SLEEP_S = 60.0, 2100.0
PROBE_PERIOD_S, PROBE_TRIES = 10.0, 60
ROUTER_PERIOD_S, ROUTER_FAILURES = 60.0, 3
SLOW_LOAD_S = 1500.0  # vLLM loading the 547 GB target by hand took about 25 minutes
_VLLM_STAMP = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")
_SGLANG_STAMP = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def log_span_s(path: Path) -> float:
    stamps = []
    for line in path.read_text(errors="replace").splitlines():
        if m := _SGLANG_STAMP.search(line):
            stamps.append(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S"))
        elif m := _VLLM_STAMP.search(line):
            stamps.append(datetime.strptime(f"2000-{m[1]}", "%Y-%m-%d %H:%M:%S"))
    return max(0.0, (max(stamps) - min(stamps)).total_seconds()) if len(stamps) > 1 else 0.0


def seeds_line(path: Path) -> str | None:
    grep = subprocess.run(f"grep -iE 'error|exception' '{path}' | grep -v FutureWarning", shell=True,
                          capture_output=True, text=True, check=False)  # fmt: skip
    for raw in grep.stdout.splitlines():
        if noise_id(parse_line(raw).text) is None:
            return raw.strip()
    return None


def peers(log: CorpusLog, span: float) -> dict[str, tuple[float, bool]]:
    """(seconds after the failure, names the true cause) for each peer."""
    f = span  # a crash dies, and a hang goes silent, at the end of its log
    line = seeds_line(log.path)
    seeds_t = max(0.0, SEEDS_SLEEP_S - f) if line else max(0.0, SEEDS_SLEEP_S - f) + SEEDS_LONG_SLEEP_S
    # A hang has no line to show: the seeds' operator just sleeps again (no verdict is a wrong verdict).
    seeds_ok = bool(line) and names_true_cause(line, log)[0] if log.cause else False
    probe_t = max(0.0, PROBE_PERIOD_S * PROBE_TRIES - f)
    first_check = math.ceil(f / ROUTER_PERIOD_S) * ROUTER_PERIOD_S
    router_t = first_check + ROUTER_PERIOD_S * (ROUTER_FAILURES - 1) - f
    return {"seeds": (seeds_t, seeds_ok), "k8s-probe": (probe_t, False), "router": (router_t, False)}


def main() -> None:
    logs = load()
    rows: list[tuple[CorpusLog, float, bool, dict[str, tuple[float, bool]], float]] = []
    ours_by_engine: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    with tempfile.TemporaryDirectory() as tmp:
        for i, log in enumerate(logs):
            work = Path(tmp) / log.id
            work.mkdir()
            result = replay_through_cli(log, work, 18800 + i, STALL_WINDOW_S)
            right_verdict = result.first_line.startswith(log.verdict)
            ok = right_verdict and names_true_cause(result.first_line, log)[0]
            if log.verdict in ("FAILED", "STALLED") and result.latency_s is not None:
                ours_t = result.latency_s + (DEFAULT_STALL_S if log.verdict == "STALLED" else 0.0)
                span = log_span_s(log.path)
                rows.append((log, ours_t, ok, peers(log, span), result.latency_s))
            if log.verdict == "FAILED":
                ours_by_engine[log.engine][0] += ok
                ours_by_engine[log.engine][1] += 1
            print(f"{'ok ' if ok else 'MISS'} {log.id:55} {result.first_line[:110]}")
    print("\nroot-cause accuracy (FAILED logs whose first line names the true cause):")
    for engine, (good, n) in sorted(ours_by_engine.items()):
        print(f"  {engine:7} {good}/{n} = {good / n:.0%}")
    hangs = (f"hangs: time from the last line to a verdict (ours: the {DEFAULT_STALL_S:.0f} s default stall window "
             f"+ the latency measured with {STALL_WINDOW_S:.0f} s)")  # fmt: skip
    for kind, title in (("FAILED", "crashes: time from the exit to a verdict"), ("STALLED", hangs)):
        subset = [r for r in rows if r[0].verdict == kind]
        print(f"\n{title}, {len(subset)} logs")
        print(f"{'method':10} {'median s':>9} {'mean s':>9} {'right line':>11} {'peer/ours median':>17} {'mean':>7}")
        ours = sorted(r[1] for r in subset)
        for name in ("ours", "seeds", "k8s-probe", "router"):
            times = ours if name == "ours" else sorted(r[3][name][0] for r in subset)
            right = sum(r[2] for r in subset) if name == "ours" else sum(r[3][name][1] for r in subset)
            median, mean = times[len(times) // 2], sum(times) / len(times)
            ratios = (
                ""
                if name == "ours"
                else (f"{median / ours[len(ours) // 2]:>17.1f} {mean / (sum(ours) / len(ours)):>7.1f}")
            )
            print(f"{name:10} {median:>9.1f} {mean:>9.1f} {right:>5}/{len(subset):<5} {ratios}")
    healthy = sum(log.verdict == "READY" for log in logs)
    print(
        f"\nhealthy starts ({healthy} logs, all READY for us), had they loaded for {SLOW_LOAD_S:.0f} s as the "
        "target model does: the k8s probe gives up at 600 s and restarts the pod; the router marks the worker "
        f"unhealthy at {ROUTER_PERIOD_S * ROUTER_FAILURES:.0f} s; the seeds' grep shows "
        f"{sum(bool(seeds_line(log.path)) for log in logs if log.verdict == 'READY')} of them an error line"
    )
    crash = sorted(r[4] for r in rows if r[0].verdict == "FAILED")
    print(
        f"\nour crash detection, measured: median {crash[len(crash) // 2]:.2f} s, max {crash[-1]:.2f} s after the exit"
    )


if __name__ == "__main__":
    main()
