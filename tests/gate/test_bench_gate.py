"""The benchmark gate on the test bed, with the real engine and vLLM's own `vllm bench serve`: a
rollout records its figures (on the host, with the version, and in .state/runs); a second rollout
whose drafter has a random output layer instead of the zeroed one (so its proposals are rejected)
is READY, then refused by the gate for its fall in acceptance, and the previous version serves again."""

from __future__ import annotations

import json
import re

import pytest

from specdeploy.paths import state_dir
from specdeploy_testbed import testbed
from tests.integration.helpers import record_timing, specdeploy

pytestmark = pytest.mark.integration
ENGINE = "specdeploy-engine"
DRAFTER = "/srv/specdeploy/models/tiny-kimi_k25/drafter"
RANDOM_DRAFTER = "/srv/specdeploy/drafter-random-head"
RECORD = "/var/lib/specdeploy/serving/rollout.json"

# Run on the test-bed host: the drafter copied, its lm_head.weight (bf16) refilled with N(0, 0.05)
# values, SHA256SUMS rewritten. Standard library only (the host's python3).
RANDOM_HEAD = r"""
import hashlib, json, pathlib, random, shutil, struct, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
shutil.rmtree(out, ignore_errors=True)
shutil.copytree(src, out)
path = out / "model.safetensors"
data = bytearray(path.read_bytes())
size = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + size])
entry = header["lm_head.weight"]
assert entry["dtype"] == "BF16", entry
start, end = (8 + size + o for o in entry["data_offsets"])
rng = random.Random(0)
data[start:end] = b"".join(struct.pack("<f", rng.gauss(0, 0.05))[2:] for _ in range((end - start) // 2))
path.write_bytes(bytes(data))
sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out)}"
        for p in sorted(out.rglob("*")) if p.is_file() and p.name != "SHA256SUMS"]
(out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
"""


def newest_bench() -> dict:
    runs = sorted((state_dir() / "runs" / "testbed-1").glob("*/bench.json"), key=lambda p: p.parent.name)
    assert runs, "no bench.json under .state/runs/testbed-1"
    return json.loads(runs[-1].read_text())


def on_host(container, *argv: str) -> str:
    code, out = container.exec_run(list(argv))
    assert code == 0, (argv, out.decode(errors="replace"))
    return out.decode(errors="replace")


def test_a_rollout_records_its_figures_and_a_worse_drafter_is_refused_and_rolled_back(testbed_up, docker_client):
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    host.exec_run(["sh", "-c", f"docker rm -f {ENGINE} {ENGINE}-previous {ENGINE}-failed"])
    first = specdeploy("deploy", timeout=2400)
    assert first.returncode == 0, first.output[-4000:]
    assert "benchmark gate passed: " in first.output, first.output[-4000:]
    bench = newest_bench()
    figures = bench["figures"]
    assert bench["gate"]["passed"] and figures["completed"] == 36 and figures["failed"] == 0
    assert figures["acceptance_length"] > 2.0, figures  # the always-accept pair: nearly all 3 drafts kept
    record = json.loads(on_host(host, "cat", RECORD))
    assert record["last_ready"]["bench"]["figures"] == figures
    record_timing("benchmark gate: seconds added to a rollout", bench["gate"]["seconds"])
    record_timing("  first deploy (all phases), for the ratio", first.seconds)

    serving = on_host(host, "docker", "inspect", "-f", "{{.Image}}", ENGINE).strip()
    on_host(host, "python3", "-c", RANDOM_HEAD, DRAFTER, RANDOM_DRAFTER)
    worse = specdeploy("deploy", "-e", f"engine_image_drafter_path={RANDOM_DRAFTER}", timeout=2400)
    assert worse.returncode != 0, worse.output[-4000:]
    message = " ".join(worse.output.split())
    fell = re.search(r"benchmark gate refused: mean acceptance length fell from ([\d.]+) to ([\d.]+)", message)
    assert fell, worse.output[-4000:]
    assert float(fell[1]) == pytest.approx(figures["acceptance_length"], abs=0.01) and float(fell[2]) < 1.5
    assert "rolled back to the previous engine" in message
    assert on_host(host, "docker", "inspect", "-f", "{{.Image}}", ENGINE).strip() == serving
    refused = newest_bench()
    assert refused["gate"]["passed"] is False and refused["previous"] == figures
    assert on_host(host, "docker", "inspect", "-f", "{{.State.Status}}", f"{ENGINE}-failed").strip() == "exited"
    # The restored version keeps its figures, so the next rollout is compared with them.
    assert json.loads(on_host(host, "cat", RECORD))["last_ready"]["bench"]["figures"] == figures
