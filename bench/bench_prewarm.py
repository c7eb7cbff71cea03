"""`make bench` (also `make bench-prewarm`): the prewarm's read rate against `dd` on the same files.

On testbed-1 (the test bed must be up: `make testbed`), a synthetic safetensors checkpoint of random
shards is made on the host (specdeploy_testbed.checkpoint, no hub). Each round empties the page
cache of those files (vmtouch -e), reads them with one `dd` stream, empties it again and runs the
prewarm (specdeploy.serve.prewarm, its default readers); the ratio of the two rates is printed per
round and as the median, with the residency the prewarm measured afterwards. Then a bounded run
(half the checkpoint) shows a partial prewarm's report. Figures of this run only.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

from specdeploy.connection import CommandHost
from specdeploy.serve.prewarm import GIB, Prewarmer
from specdeploy.targets import Target
from specdeploy_testbed import checkpoint, testbed

FOLDER, SHARDS, SHARD_BYTES, ROUNDS = "/var/tmp/specdeploy-bench-checkpoint", 4, 512 * 1024**2, 3
DD = ('start=$(date +%s.%N); for f in "$@"; do dd if="$f" of=/dev/null bs=16M status=none || exit 1; done; '
      'end=$(date +%s.%N); echo "dd $start $end"')  # fmt: skip


def dd_rate(host: CommandHost, warmer: Prewarmer) -> float:
    files = warmer.files()
    proc = subprocess.run(host.command("sh", "-c", DD, "dd", *(f.path for f in files)), capture_output=True,
                          text=True, check=True)  # fmt: skip
    match = re.search(r"^dd (\S+) (\S+)$", proc.stdout, re.MULTILINE)
    assert match, proc.stdout + proc.stderr
    return sum(f.size for f in files) / (float(match[2]) - float(match[1])) / 1e9


def main() -> int:
    host = CommandHost(Target("127.0.0.1", testbed.SSH_USER, testbed.port_base()), testbed.paths().ssh())
    if subprocess.run(host.command("true"), capture_output=True, check=False).returncode != 0:
        print("bench_prewarm: testbed-1 does not answer over SSH: run `make testbed` (or make deploy) first")
        return 1
    subprocess.run(host.command("sh", "-c", "command -v vmtouch || sudo apt-get install -y -q vmtouch"), check=True,
                   capture_output=True)  # fmt: skip
    checkpoint.make(host, FOLDER, SHARDS, SHARD_BYTES)
    try:
        warmer = Prewarmer(host, FOLDER)
        ratios = []
        print(f"prewarm vs dd on testbed-1: {SHARDS} x {SHARD_BYTES // 1024**2} MiB random safetensors shards, "
              f"page cache emptied before each read")  # fmt: skip
        for i in range(1, ROUNDS + 1):
            checkpoint.evict(host, FOLDER)
            dd = dd_rate(host, warmer)
            checkpoint.evict(host, FOLDER)
            report = warmer.warm()
            assert report.warmed and not report.partial, report.message
            ratios.append(report.gb_per_s / dd)
            print(f"  round {i}: dd {dd:.2f} GB/s, prewarm {report.gb_per_s:.2f} GB/s ({report.readers} readers) "
                  f"= {ratios[-1]:.2f}x; resident afterwards {report.resident_fraction:.1%}")  # fmt: skip
        print(f"  median prewarm/dd: {statistics.median(ratios):.2f} (the issue asks >= 0.8)")
        checkpoint.evict(host, FOLDER)
        half = Prewarmer(host, FOLDER, max_bytes=SHARDS * SHARD_BYTES // 2).warm()
        print(f"  bounded at {SHARDS * SHARD_BYTES / 2 / GIB:.1f} GiB: {half.message}")
    finally:
        checkpoint.remove(host, FOLDER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
