"""`specdeploy watch`: argument handling and the output contract.

stdout line 1: `READY|FAILED|STALLED|TIMEOUT|LOST <elapsed>s <cause or summary>`.
Exit codes: 0 ready, 1 failed, 2 stalled, 3 overall --timeout, 4 bad input, 5 contact with the
engine's host lost for longer than the grace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.watch.sources import ContainerSource, ProcessSource, Source
from specdeploy.watch.watchdog import Watch, WatchOptions

BAD_INPUT = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("source (one of)")
    src.add_argument("--pid", type=int, help="engine process id on this machine (with --log-file)")
    src.add_argument("--log-file", type=Path, help="file the engine's stdout+stderr go to")
    src.add_argument("--container", help="engine container name or id")
    src.add_argument("--docker-host", help="engine's Docker host, e.g. ssh://deploy@gpu-1 (default: local)")
    src.add_argument("--known-hosts", type=Path, action="append", default=[], help="extra known_hosts for ssh://")
    src.add_argument("--ssh-key", type=Path, help="private key for ssh:// (default: ssh's own)")
    parser.add_argument("--url", help="engine base URL for readiness, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens in the readiness completion (default 8)")
    parser.add_argument("--speculative", action="store_true", help="require spec-decode counters to grow")
    parser.add_argument("--interval", type=float, default=0.5, help="poll interval in s (default 0.5, max 0.5)")
    parser.add_argument("--stall-timeout", type=float, default=300.0, help="s without progress => STALLED")
    parser.add_argument("--timeout", type=float, default=3600.0, help="overall s before giving up (exit 3)")
    parser.add_argument("--api-key-env", default="SPECDEPLOY_API_KEY", help="env var holding the API key")
    parser.add_argument("--json", type=Path, help="also write the verdict as JSON to this file")
    parser.add_argument("--diagnostics", type=Path, help="folder for logs/stack dumps (default .state/watch)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- CMD...: start CMD (output to --log-file) and watch it"
    )


def build_source(args: argparse.Namespace) -> Source:
    if args.container:
        if args.pid or args.log_file:
            raise SpecdeployError("use either --container or --pid/--log-file, not both")
        from specdeploy.connection import docker_client  # noqa: PLC0415 (SSH client only when needed)

        client = docker_client(args.docker_host, tuple(args.known_hosts), args.ssh_key)
        try:
            return ContainerSource(client.containers.get(args.container))
        except Exception as exc:
            raise SpecdeployError(
                f"no container {args.container!r} on {args.docker_host or 'the local engine'}"
            ) from exc
    command = [c for c in args.command if c != "--"]
    if command:
        if args.pid or args.log_file is None:
            raise SpecdeployError("-- CMD needs --log-file (where its output goes) and no --pid")
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
        with args.log_file.open("ab") as log:
            try:
                proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise SpecdeployError(f"cannot start {command[0]!r}: {exc}") from exc
        return ProcessSource(proc.pid, args.log_file, proc)
    if args.pid is None or args.log_file is None:
        raise SpecdeployError("say what to watch: --pid PID --log-file FILE, or --container NAME")
    if not Path(f"/proc/{args.pid}").exists() and not args.log_file.is_file():
        raise SpecdeployError(f"--pid {args.pid}: no such process, and no log at {args.log_file} to read its end from")
    # A pid that has already died is still judged: FAILED, with the cause its log holds.
    return ProcessSource(args.pid, args.log_file)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.interval <= 0.5:
        raise SpecdeployError(f"--interval {args.interval}: must be in (0, 0.5] so a death is seen within a poll")
    if args.stall_timeout <= 0 or args.timeout <= 0 or args.tokens < 1:
        raise SpecdeployError("--stall-timeout, --timeout and --tokens must be positive")
    options = WatchOptions(
        url=args.url,
        model=args.model,
        tokens=args.tokens,
        speculative=args.speculative,
        interval_s=args.interval,
        stall_timeout_s=args.stall_timeout,
        timeout_s=args.timeout,
        api_key=os.environ.get(args.api_key_env) or None,
        diagnostics=args.diagnostics or state_dir() / "watch",
        progress=not args.no_progress,
    )
    verdict = Watch(build_source(args), options).run()
    print(verdict.first_line(), flush=True)
    print(f"diagnostics: {verdict.diagnostics}")
    if verdict.noise:
        print("known noise (ignored): " + ", ".join(f"{k}={v}" for k, v in sorted(verdict.noise.items())))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(verdict), indent=2) + "\n")
    return {"READY": 0, "FAILED": 1, "STALLED": 2, "TIMEOUT": 3, "LOST": 5}[verdict.status]
