"""gpu_truth/live_panels.py: the dashboards' queries asked of a Prometheus beside the GPU machine's engine.
Prometheus is faked here (an HTTP server answering its query API; a script standing in for its binary)."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_truth import live_panels

from specdeploy.monitoring import dashboards


def test_prometheus_scrapes_the_engine_with_the_products_own_configuration() -> None:
    config = live_panels.configuration("sglang", 8000)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["engine"]["static_configs"] == [
        {"targets": ["127.0.0.1:8000"], "labels": {"host": "gpu", "engine": "sglang"}}
    ]
    assert jobs["prometheus"]["static_configs"][0]["targets"] == [f"127.0.0.1:{live_panels.PORT}"]
    assert set(jobs) == {"engine", "prometheus"}  # no Alertmanager here
    assert config["rule_files"] == [] and "alerting" not in config
    assert config["global"]["scrape_interval"] == f"{live_panels.INTERVAL_S}s"


@pytest.fixture
def prometheus() -> Iterator[tuple[str, list[str]]]:
    """A query API that answers one series for the token-rate query, none for the others, and refuses the
    queue's query: (its base URL, the queries asked)."""
    asked: list[str] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            expr = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
            asked.append(expr)
            if "num_queue_reqs" in expr:
                self.send_response(400)
                self.end_headers()
                return
            result = [{"metric": {"host": "gpu"}, "value": [0, "12.5"]}] if "generation_tokens" in expr else []
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"status": "success", "data": {"result": result}}).encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", asked
    server.shutdown()


def test_every_dashboard_query_is_asked_and_those_without_series_are_named(
    prometheus: tuple[str, list[str]], tmp_path: Path
) -> None:
    base, asked = prometheus
    answers = live_panels.ask("sglang", base)
    assert asked == dashboards.queries("sglang") and list(answers) == asked
    rate = next(q for q in asked if "generation_tokens" in q)
    assert answers[rate]["series"] == 1 and answers[rate]["first"][0]["metric"] == {"host": "gpu"}
    queue = next(q for q in asked if "num_queue_reqs" in q)
    assert answers[queue]["series"] == 0 and "400" in answers[queue]["error"]
    said: list[str] = []
    assert live_panels.record(tmp_path / "speculative", "sglang", answers, said.append) == 1
    doc = json.loads((tmp_path / "speculative" / "panels.json").read_text())
    assert doc["engine"] == "sglang" and doc["answered"] == 1 and doc["queries"] == answers
    assert said[0].startswith(f"panels: 1 of {len(asked)} sglang dashboard queries returned series; none from: ")
    assert queue in said[0] and rate not in said[0]


def test_without_a_carried_prometheus_the_gate_goes_on_and_says_why(tmp_path: Path) -> None:
    said: list[str] = []
    with live_panels.watching("vllm", 8000, tmp_path / "out", tmp_path / "store", said.append) as ask:
        assert ask() is None
    assert "no prometheus carried" in said[0] and not (tmp_path / "out").exists()
    broken = tmp_path / "store" / "tools" / "prometheus_2.42.0+ds-5+deb12u1_amd64.deb"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a deb")  # a torn transfer: dpkg -x fails, the gate goes on
    with live_panels.watching("vllm", 8000, tmp_path / "out", tmp_path / "store", said.append) as ask:
        assert ask() is None
    assert "could not be unpacked" in said[1] and "not asked" in said[1]
    unrunnable = tmp_path / "store" / "tools-root" / "usr" / "bin" / "prometheus"
    unrunnable.parent.mkdir(parents=True)
    unrunnable.write_text("not a program")  # not executable
    with live_panels.watching("vllm", 8000, tmp_path / "out", tmp_path / "store", said.append) as ask:
        assert ask() is None
    assert said[2].startswith("panels: prometheus did not start (") and "not asked" in said[2]


def test_the_carried_prometheus_runs_for_the_block_with_its_configuration(tmp_path: Path) -> None:
    """A script stands in for the binary `dpkg -x` would have unpacked: it is started with the written
    configuration on its own loopback port, and stopped when the block ends; its log comes back."""
    fake = tmp_path / "store" / "tools-root" / "usr" / "bin" / "prometheus"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho "started with $*"\nwhile :; do sleep 0.2; done\n')  # named as it runs
    fake.chmod(0o755)
    said: list[str] = []
    with live_panels.watching("sglang", 8000, tmp_path / "out", tmp_path / "store", said.append):
        pid = int(said[0].rsplit("pid ", 1)[1].rstrip(")"))
        time.sleep(0.5)
        assert Path(f"/proc/{pid}").exists()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    log = (tmp_path / "out" / "prometheus.log").read_text()
    config = tmp_path / "store" / "prometheus" / "prometheus.yml"
    assert f"--config.file={config}" in log and f"--web.listen-address=127.0.0.1:{live_panels.PORT}" in log
    assert json.loads(config.read_text()) == live_panels.configuration("sglang", 8000)
    # one an earlier call left running (its call cut before the stop) is ended before the next starts
    left = subprocess.Popen([str(fake), "--left"], start_new_session=True)
    for _ in range(100):  # Popen can return while the exec is still under way
        if Path(f"/proc/{left.pid}/comm").read_text().strip() == "prometheus":
            break
        time.sleep(0.02)
    (tmp_path / "store" / "prometheus" / "prometheus.pid").write_text(str(left.pid))
    with live_panels.watching("sglang", 8000, tmp_path / "out", tmp_path / "store", said.append):
        assert left.wait(timeout=10) is not None
