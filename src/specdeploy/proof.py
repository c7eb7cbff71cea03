"""The proof of serving: a host serves when its engine answers a real completion in bounded time and
no process of the engine is stopped (state T) or stuck in uninterruptible sleep (D) past a bound.

`/health` is not proof: with vLLM's engine core frozen by SIGSTOP, its API process still answers
/health 200 while a 4-token completion times out (measured on the test bed, issue 35). So every place
that calls a host serving asks this instead: the converged ledger (specdeploy.converged), `make
verify` (verify/check_serving.py), a rollout that finds its version already running and a rollback
(serve/rollout.py), and the sentinel's probe of an idle engine (fleet/sentinel.py).

Standard library only, and runnable as a script: `on_host_script()` is this module's own source,
run on the engine's host by `python3 -c` over SSH as root (it reads the engine's API key from the
container's environment there, so the key never crosses the connection or reaches a log), printing
one JSON object (`Proof`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROOF_TOKENS = 4  # a few tokens: a decode step, not only the prefill, must run
PROOF_TIMEOUT_S = 15.0  # the completion's bound; a READY engine here answers in well under a second
STUCK_D_S = 5.0  # a process in uninterruptible sleep at two readings this far apart is stuck
DOCKER_TIMEOUT_S = 20.0  # a Docker engine that hangs is named, not waited on
API_KEY_ENV = ("VLLM_API_KEY", "SGLANG_API_KEY")


@dataclass(frozen=True)
class Proof:
    """serves: the completion answered and no engine process is stopped or stuck; said: one sentence
    naming what answered, or what did not; seconds: the completion's round trip."""

    serves: bool
    said: str
    seconds: float = 0.0
    stopped: list[str] = field(default_factory=list)  # "pid name" of processes in state T
    stuck: list[str] = field(default_factory=list)  # "pid name" of processes in D past STUCK_D_S

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Proof:
        doc = json.loads(text)
        return cls(bool(doc["serves"]), str(doc["said"]), float(doc.get("seconds") or 0.0),
                   list(doc.get("stopped") or []), list(doc.get("stuck") or []))  # fmt: skip


def complete(
    url: str,
    model: str,
    api_key: str = "",
    *,
    tokens: int = PROOF_TOKENS,
    timeout_s: float = PROOF_TIMEOUT_S,
) -> tuple[bool, str, float]:
    """A real completion of TOKENS tokens at URL (the engine's base): (answered, what happened, seconds)."""
    body = {"model": model, "prompt": "ping", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    sent = {"Content-Type": "application/json"}
    if api_key:
        sent["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(f"{url.rstrip('/')}/v1/completions", json.dumps(body).encode(), sent)
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, text = int(resp.status), resp.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read(1024).decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        took = time.monotonic() - start
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return False, f"no answer to a {tokens}-token completion in {timeout_s:.0f} s", took
        return False, f"the completion's connection failed: {type(reason).__name__}: {reason}", took
    took = time.monotonic() - start
    if status != 200:
        return False, f"the completion answered HTTP {status}: {text.strip()[:200]}", took
    try:
        generated = int((json.loads(text).get("usage") or {}).get("completion_tokens") or 0)
    except (ValueError, AttributeError):
        generated = 0
    if generated < 1:
        return False, f"the completion answered 200 with no tokens: {text.strip()[:200]}", took
    return True, f"a {generated}-token completion answered in {took:.2f} s", took


def process_states(root_pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[str, str]]:
    """The state letter and name of ROOT_PID and every process under it (from /proc/PID/stat)."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while read
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        try:  # comm is cut at 15 characters ("VLLM::EngineCor"); the command line says the whole name
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").strip()
        except OSError:
            argv0 = ""
        table[int(entry.name)] = (int(ppid), state, argv0.split()[0] if argv0 and len(name) >= 15 else name)
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found[pid] = table[pid][1:]
            todo += [child for child, (parent, _, _) in table.items() if parent == pid]
    return found


def stopped_and_stuck(
    read: dict[int, tuple[str, str]], again: dict[int, tuple[str, str]] | None
) -> tuple[list[str], list[str]]:
    """Processes stopped (T, or t: traced) in READ, and those in D in both READ and AGAIN (taken
    STUCK_D_S later; None: no second reading, so none is stuck)."""
    stopped = [f"{pid} {name}" for pid, (state, name) in sorted(read.items()) if state in "Tt"]
    stuck = [f"{pid} {name}" for pid, (state, name) in sorted(read.items())
             if state == "D" and again is not None and again.get(pid, ("", ""))[0] == "D"]  # fmt: skip
    return stopped, stuck


def judge(answered: bool, said: str, seconds: float, stopped: list[str], stuck: list[str]) -> Proof:
    """The one rule: serving is a completion answered and no engine process stopped or stuck."""
    if stopped:
        return Proof(False, f"engine process(es) stopped (state T): {', '.join(stopped)}; {said}", seconds,
                     stopped, stuck)  # fmt: skip
    if stuck:
        return Proof(False, f"engine process(es) in uninterruptible sleep for {STUCK_D_S:.0f} s or more: "
                     f"{', '.join(stuck)}; {said}", seconds, stopped, stuck)  # fmt: skip
    return Proof(answered, said, seconds, stopped, stuck)


class DockerHangs(Exception):
    """The host's Docker engine gave no answer within DOCKER_TIMEOUT_S."""


def _docker(*args: str) -> str | None:
    try:
        done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DockerHangs(
            f"docker {args[0]} gave no answer in {DOCKER_TIMEOUT_S:.0f} s: the host's Docker engine hangs"
        ) from None
    return done.stdout if done.returncode == 0 else None


def on_host(container: str, state_dir: str, timeout_s: float = PROOF_TIMEOUT_S) -> Proof:
    """Run on the engine's host: the proof of its engine container, as the serving record names it."""
    try:
        config = json.loads(Path(state_dir, "current.json").read_text()).get("config") or {}
    except (OSError, ValueError):
        return Proof(False, f"no serving record at {state_dir}/current.json: nothing was deployed here")
    try:
        inspected = _docker("inspect", "--format", "{{.State.Pid}} {{json .Config.Env}}", container)
    except DockerHangs as exc:
        return Proof(False, str(exc))
    if inspected is None:
        return Proof(False, f"the engine container {container} does not exist")
    pid_text, _, env_json = inspected.strip().partition(" ")
    pid = int(pid_text or 0)
    if pid <= 0:
        return Proof(False, f"the engine container {container} runs no process")
    env = dict(item.split("=", 1) for item in json.loads(env_json or "[]") if "=" in item)
    key = next((env[name] for name in API_KEY_ENV if env.get(name)), "")
    read = process_states(pid)
    if int(config.get("node_rank") or 0) > 0:  # a headless rank: its API is rank 0's
        answered, said, took = True, f"rank {config.get('node_rank')} runs headless (its API is rank 0's)", 0.0
    else:
        url = f"http://127.0.0.1:{int(config.get('port') or 8000)}"
        answered, said, took = complete(url, str(config.get("served_model_name") or ""), key, timeout_s=timeout_s)
    again = None
    if any(state == "D" for state, _ in read.values()):
        time.sleep(max(0.0, STUCK_D_S - took))
        again = process_states(pid)
    return judge(answered, said, took, *stopped_and_stuck(read, again))


def as_root(*argv: str) -> str:
    """A shell line running ARGV as root: directly when the user is root, else through `sudo -n` (the
    serving records and `docker` are root's)."""
    line = " ".join(shlex.quote(a) for a in argv)
    return f'if [ "$(id -u)" = 0 ]; then {line}; else sudo -n {line}; fi'


def on_host_script() -> str:
    """This module's source, to run on a host with `python3 -c SCRIPT CONTAINER STATE_DIR [TIMEOUT]`."""
    return Path(__file__).read_text()


def main(argv: list[str]) -> int:
    timeout_s = float(argv[2]) if len(argv) > 2 else PROOF_TIMEOUT_S
    proof = on_host(argv[0], argv[1], timeout_s)
    print(proof.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
