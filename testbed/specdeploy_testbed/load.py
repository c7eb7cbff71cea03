"""A bounded load loop through the test-bed fleet's router: concurrent completions, each outcome recorded
(the fleet tests and `make bench` share it)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    failed_sent_at: list[float] = field(default_factory=list)  # time.monotonic() each failed request left

    @property
    def sent(self) -> int:
        return len(self.latencies_s) + len(self.failures)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Load:
    """WORKERS threads, each sending completions one after another (PAUSE_S apart) until stopped.

    Bounded in rate and time (MAX_S): on the test bed's 2 cores a harder load starves the restarting
    engine's start-up, which the watchdog then rightly calls STALLED."""

    def __init__(self, base_url: str, model: str, api_key: str, *, workers: int = 1, pause_s: float = 0.5,
                 max_s: float = 900, max_tokens: int = 8) -> None:  # fmt: skip
        self.base_url, self.model, self.api_key, self.workers, self.max_s = base_url, model, api_key, workers, max_s
        self.pause_s, self.max_tokens = pause_s, max_tokens
        self.result = LoadResult()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_s
        headers = {"Authorization": f"Bearer {self.api_key}"}
        body = {
            "model": self.model,
            "prompt": "the fleet",
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        with httpx.Client(timeout=120, headers=headers) as http:
            while not self._stop.is_set() and time.monotonic() < deadline:
                start = time.monotonic()
                try:
                    resp = http.post(f"{self.base_url}/v1/completions", json=body)
                    ok = resp.status_code == 200 and bool(resp.json()["choices"][0]["text"])
                    outcome = None if ok else f"{resp.status_code} {resp.text[:200]}"
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    if outcome is None:
                        self.result.latencies_s.append(time.monotonic() - start)
                    else:
                        self.result.failures.append(f"{time.strftime('%H:%M:%S')} {outcome}")
                        self.result.failed_sent_at.append(start)
                self._stop.wait(self.pause_s)

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.workers)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)
