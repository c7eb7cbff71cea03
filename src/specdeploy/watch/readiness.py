"""Readiness, proven in order: /health, /v1/models lists the model, a real completion, and (with
speculative decoding) spec-decode counters that grow across that completion."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import httpx

from specdeploy.names import DP_RANK_HEADER

SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
_METRIC = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*?)(?:_total)?(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>[-+0-9.eE]+|NaN)$")


class NotReady(Exception):
    """A readiness step failed; the message carries the HTTP detail."""


@dataclass(frozen=True)
class Acceptance:
    drafts: float
    draft_tokens: float
    accepted_tokens: float

    @property
    def rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


@dataclass(frozen=True)
class Readiness:
    model: str
    completion_tokens: int
    completion_text: str
    acceptance: Acceptance | None
    completion_s: float = 0.0  # the completion's round trip, kept in the verdict


def spec_counters(metrics_text: str) -> dict[str, float]:
    """Sum each spec-decode counter over its label sets (engines, models)."""
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _METRIC.match(line.strip())
        if match and match["name"] in SPEC_COUNTERS and not line.startswith("#"):
            if "_created" in line.split("{")[0]:
                continue
            totals[match["name"]] = totals.get(match["name"], 0.0) + float(match["value"])
    return totals


def _detail(resp: httpx.Response) -> str:
    return f"HTTP {resp.status_code} from {resp.request.method} {resp.request.url.path}: {resp.text[:300]!r}"


class ReadinessProbe:
    def __init__(
        self,
        base_url: str,
        model: str | None,
        tokens: int,
        api_key: str | None,
        timeout_s: float,
        *,
        data_parallel_ranks: int = 1,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.model, self.tokens, self.data_parallel_ranks = model, tokens, data_parallel_ranks

    def health(self) -> int | None:
        """The /health status code, or None while nothing answers (loading, or dead)."""
        try:
            return self.client.get("/health", timeout=2.0).status_code
        except httpx.HTTPError:
            return None

    def prove(self, speculative: bool) -> Readiness:
        models = self.client.get("/v1/models")
        if models.status_code != 200:
            raise NotReady(_detail(models))
        served = [m.get("id") for m in models.json().get("data", [])]
        model = self.model or (served[0] if served else None)
        if model is None or model not in served:
            raise NotReady(f"/v1/models does not list {self.model or 'any model'} (it lists {served})")
        before = self._counters() if speculative else {}
        body = {"model": model, "prompt": "the quick brown fox", "max_tokens": self.tokens, "temperature": 0}
        sent = time.monotonic()
        resp = self.client.post("/v1/completions", json={**body, "ignore_eos": True},
                                headers={DP_RANK_HEADER: "0"} if self.data_parallel_ranks > 1 else None)  # fmt: skip
        took = time.monotonic() - sent
        if resp.status_code != 200:
            raise NotReady(_detail(resp))
        payload = resp.json()
        generated = int(payload.get("usage", {}).get("completion_tokens", 0))
        if generated < 1:
            raise NotReady(f"the completion returned no tokens: {resp.text[:300]!r}")
        acceptance = None
        for rank in range(1, self.data_parallel_ranks):  # rank 0 answered above; each replica answers too
            try:
                each = self.client.post("/v1/completions", json={**body, "max_tokens": 1},
                                        headers={DP_RANK_HEADER: str(rank)})  # fmt: skip
            except httpx.HTTPError as exc:  # a rank that died after its handshake: the request hangs
                raise NotReady(f"data-parallel rank {rank}: {type(exc).__name__}: {exc}") from exc
            if each.status_code != 200:
                raise NotReady(f"data-parallel rank {rank}: {_detail(each)}")
        if speculative:
            after = self._counters()
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
            if delta[SPEC_COUNTERS[0]] <= 0:
                raise NotReady(f"speculative decoding is on, but /metrics spec-decode counters did not grow: {after}")
            acceptance = Acceptance(*(delta[k] for k in SPEC_COUNTERS))
        text = payload["choices"][0].get("text", "") if payload.get("choices") else ""
        return Readiness(model, generated, text, acceptance, round(took, 3))

    def _counters(self) -> dict[str, float]:
        resp = self.client.get("/metrics")
        if resp.status_code != 200:
            raise NotReady(_detail(resp))
        return spec_counters(resp.text)
