"""`make bench`: the watchdog's death-detection latency and its polling overhead, measured now.

Detection latency: a real child process prints a traceback and exits; we time from its exit
(seen by an independent waiter thread) to the FAILED verdict. Overhead: CPU seconds the watch
loop spends per poll while a quiet process runs, as a fraction of the poll interval.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from specdeploy.watch.sources import ProcessSource
from specdeploy.watch.watchdog import Watch, WatchOptions

CRASH = "import time; time.sleep({delay}); raise RuntimeError('boom')"


def detection_latency(tmp: Path, interval: float, runs: int = 5) -> list[float]:
    latencies = []
    for i in range(runs):
        log = tmp / f"crash-{interval}-{i}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", CRASH.format(delay=0.3 + 0.137 * i)], stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        exited: list[float] = []
        waiter = threading.Thread(target=lambda p=proc, e=exited: (p.wait(), e.append(time.monotonic())))
        waiter.start()
        options = WatchOptions(url=None, interval_s=interval, diagnostics=tmp / "diag", progress=False)
        verdict = Watch(ProcessSource(proc.pid, log, proc), options).run()
        decided = time.monotonic()
        waiter.join()
        assert verdict.status == "FAILED"
        latencies.append(decided - exited[0])
    return latencies


def polling_overhead(tmp: Path, interval: float, seconds: float = 5.0) -> float:
    log = tmp / "quiet.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"], stdout=out)
    options = WatchOptions(url=None, interval_s=interval, diagnostics=tmp / "diag", progress=False)
    cpu0, wall0 = time.process_time(), time.monotonic()
    Watch(ProcessSource(proc.pid, log, proc), options).run()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    polls = wall / interval
    return cpu / polls


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        print(f"{'interval s':>10} {'median detect s':>16} {'max detect s':>13} {'detect/interval':>16} "
              f"{'cpu ms/poll':>12} {'cpu/interval':>13}")  # fmt: skip
        for interval in (0.5, 0.25, 0.1):
            lat = detection_latency(tmp, interval)
            per_poll = polling_overhead(tmp, interval)
            median = statistics.median(lat)
            print(f"{interval:>10.2f} {median:>16.3f} {max(lat):>13.3f} {median / interval:>16.2f} "
                  f"{per_poll * 1000:>12.2f} {per_poll / interval:>13.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
