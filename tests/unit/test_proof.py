"""The proof of serving (specdeploy.proof) run here as the host runs it: its own source under
`python3 -c`, a fake `docker` CLI that names a real process tree, a real HTTP server for the
completion, real process states (a child stopped by SIGSTOP is state T in /proc)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specdeploy import proof
from specdeploy.connection import CommandHost


class Engine(BaseHTTPRequestHandler):
    """/v1/completions as an engine answers it; `mode` on the server: ok, frozen, error, empty."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.headers.get("Authorization"), body))  # type: ignore[attr-defined]
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "frozen":
            time.sleep(3)
            return
        answered = (200, {"choices": [{"text": "!!!!"}], "usage": {"completion_tokens": body["max_tokens"]}})
        empty = (200, {"choices": [], "usage": {"completion_tokens": 0}})
        code, doc = {"error": (500, {"error": "EngineCore died"}), "empty": empty}.get(mode, answered)
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    server.mode, server.seen = "ok", []  # type: ignore[attr-defined]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def engine_processes() -> Iterator[subprocess.Popen[bytes]]:
    """The 'container's process tree: a shell with a sleeping child (the engine core)."""
    tree = subprocess.Popen(["sh", "-c", "sleep 600 & wait"])
    time.sleep(0.3)
    yield tree
    for child in proof.process_states(tree.pid):
        if child != tree.pid:
            os.kill(child, signal.SIGKILL)
    tree.kill()
    tree.wait()


def host(tmp_path: Path, engine: ThreadingHTTPServer, pid: int, key: str = "k-secret") -> dict[str, str]:
    """The host's files and PATH: the serving record, and a docker CLI that inspects the container."""
    state = tmp_path / "serving"
    state.mkdir(exist_ok=True)
    config = {"port": engine.server_address[1], "served_model_name": "kimi-k2.5", "node_rank": 0}
    (state / "current.json").write_text(json.dumps({"config": config}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    env_json = json.dumps(["PATH=/usr/bin", f"VLLM_API_KEY={key}"])
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho '{pid} {env_json}'\n")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STATE": str(state)}


def run_on_host(env: dict[str, str], timeout_s: float = 2.0) -> proof.Proof:
    done = subprocess.run([sys.executable, "-c", proof.on_host_script(), "specdeploy-engine", env["STATE"],
                           str(timeout_s)], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    return proof.Proof.from_json(done.stdout.strip().splitlines()[-1])


def test_an_engine_that_answers_is_proven_with_its_own_key(tmp_path, engine, engine_processes) -> None:
    found = run_on_host(host(tmp_path, engine, engine_processes.pid))
    assert found.serves and found.said.startswith("a 4-token completion answered in"), found
    ((auth, body),) = engine.seen
    assert auth == "Bearer k-secret" and body["model"] == "kimi-k2.5" and body["max_tokens"] == proof.PROOF_TOKENS
    assert "k-secret" not in found.to_json()


def test_a_stopped_engine_process_is_named_whatever_health_says(tmp_path, engine, engine_processes) -> None:
    env = host(tmp_path, engine, engine_processes.pid)
    core = next(pid for pid in proof.process_states(engine_processes.pid) if pid != engine_processes.pid)
    os.kill(core, signal.SIGSTOP)
    try:
        time.sleep(0.2)
        engine.mode = "frozen"  # as vLLM's API does while its core is stopped: no answer
        found = run_on_host(env, timeout_s=1.0)
    finally:
        os.kill(core, signal.SIGCONT)
    assert not found.serves and found.stopped == [f"{core} sleep"], found
    assert found.said == f"engine process(es) stopped (state T): {core} sleep; no answer to a 4-token completion in 1 s"


@pytest.mark.parametrize(("mode", "said"), [("error", "the completion answered HTTP 500"),
                                            ("empty", "the completion answered 200 with no tokens")])  # fmt: skip
def test_a_completion_that_fails_is_no_proof(tmp_path, engine, engine_processes, mode, said) -> None:
    engine.mode = mode
    found = run_on_host(host(tmp_path, engine, engine_processes.pid))
    assert not found.serves and found.said.startswith(said) and found.stopped == []


def test_nothing_deployed_or_no_container_is_said_so(tmp_path, engine, engine_processes) -> None:
    env = host(tmp_path, engine, engine_processes.pid)
    (Path(env["STATE"]) / "current.json").unlink()
    assert run_on_host(env).said.startswith("no serving record at")
    host(tmp_path, engine, engine_processes.pid)
    (tmp_path / "bin" / "docker").write_text("#!/bin/sh\nexit 1\n")
    assert run_on_host(env).said == "the engine container specdeploy-engine does not exist"


def test_stuck_means_uninterruptible_at_two_readings_apart() -> None:
    first = {10: ("S", "python3"), 11: ("D", "VLLM::EngineCore"), 12: ("D", "pt_main_thread")}
    again = {10: ("S", "python3"), 11: ("D", "VLLM::EngineCore"), 12: ("R", "pt_main_thread")}
    assert proof.stopped_and_stuck(first, again) == ([], ["11 VLLM::EngineCore"])
    assert proof.stopped_and_stuck(first, None) == ([], [])  # one reading proves nothing
    verdict = proof.judge(True, "a 4-token completion answered in 0.10 s", 0.1, [], ["11 VLLM::EngineCore"])
    assert not verdict.serves and verdict.said.startswith("engine process(es) in uninterruptible sleep for 5 s")


def test_the_controller_runs_it_over_its_host_command(tmp_path, engine, engine_processes) -> None:
    """CommandHost.prove_serving as make deploy and rollouts call it (here: no target, so this machine)."""
    env = host(tmp_path, engine, engine_processes.pid)
    old = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        found = CommandHost().prove_serving(state_dir=env["STATE"], timeout_s=2.0)
        (tmp_path / "bin" / "python3").write_text("#!/bin/sh\necho 'Traceback: boom' >&2\nexit 1\n")
        (tmp_path / "bin" / "python3").chmod(0o755)
        broken = CommandHost().prove_serving(state_dir=env["STATE"], timeout_s=2.0)
    finally:
        os.environ["PATH"] = old
    assert found.serves, found
    assert not broken.serves and broken.said == "this machine: the proof of serving could not run: Traceback: boom"
