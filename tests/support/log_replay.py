"""Replay a recorded engine log as a live process, for the watchdog's tests and bench.

    python -m tests.support.log_replay LOG --end exit|sigkill|hang|serve [--code N] [--port P]
        [--marks FILE]

The log's lines go to stdout in bursts, as an engine writes them; then the process ends the way the
real one did: exits with a code, is SIGKILLed, hangs silently, or (for a healthy start) answers
an OpenAI-style API on 127.0.0.1:P. That API is *simulated* (fixed answers, no model): it only
stands in for a healthy engine's HTTP side so that READY can be proven through the real probe.
`--marks` gets a JSON line of wall-clock times (last write, exit) to time verdicts independently.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BURST_LINES = 25
BURST_GAP_S = 0.01
SERVED_MODEL = "replay"


def _marks(path: Path | None, **times: float) -> None:
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps({"pid": os.getpid(), **times}) + "\n")


class SimulatedApi(BaseHTTPRequestHandler):
    def _json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json({})
        elif self.path == "/v1/models":
            self._json({"data": [{"id": SERVED_MODEL}]})
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v1/completions":
            self._json({"choices": [{"text": " replayed"}], "usage": {"completion_tokens": 1}})
        else:
            self._json({"error": "not found"}, 404)

    def log_message(self, *args: object) -> None:  # the replayed log is the only output
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("log", type=Path)
    parser.add_argument("--end", choices=("exit", "sigkill", "hang", "serve"), required=True)
    parser.add_argument("--code", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--marks", type=Path)
    args = parser.parse_args()
    lines = args.log.read_bytes().splitlines(keepends=True)
    out = sys.stdout.buffer
    for start in range(0, len(lines), BURST_LINES):
        out.write(b"".join(lines[start : start + BURST_LINES]))
        out.flush()
        time.sleep(BURST_GAP_S)
    written = time.time()
    if args.end == "serve":
        server = ThreadingHTTPServer(("127.0.0.1", args.port), SimulatedApi)
        _marks(args.marks, written=written, serving=time.time())
        server.serve_forever()
    if args.end == "hang":
        _marks(args.marks, written=written)
        time.sleep(3600)
    _marks(args.marks, written=written, exited=time.time())
    if args.end == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(args.code)


if __name__ == "__main__":
    main()
