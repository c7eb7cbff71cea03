"""Each pinned engine's Prometheus metrics, in its own names, and the PromQL that reads them alike.

The engines speak differently, so the rules and dashboards never name a metric themselves:
- vLLM 0.33 exports counters for speculation (`vllm:spec_decode_num_drafts_total`,
  `..._num_accepted_tokens_total`, and `..._num_accepted_tokens_per_pos_total` with a `position` label:
  `vllm/v1/spec_decode/metrics.py`); the mean acceptance length is 1 + accepted / drafts over a window,
  as vLLM's own logger computes it.
- SGLang 0.5.23 exports gauges its scheduler sets each log interval (`sglang:spec_accept_length`, "accepted
  drafts + bonus token per forward", `multiprocess_mode="mostrecent"`: `srt/observability/
  metrics_collector.py`): a rate over them is meaningless, so they are averaged over the window
  (`avg_over_time`). It has no per-position figure.
Every series is summed per `host` (the scrape configuration's label: the inventory's host name), since
the engines label by model, engine index or rank. tests/integration/test_engine_words.py holds every
name here to the pinned wheels' sources."""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's metric names (as exported: counters with their `_total`)."""

    engine: str
    generated_tokens: str  # counter
    prompt_tokens: str  # counter: a long prefill is progress too
    running: str  # gauge: requests being served
    waiting: str  # gauge: requests queued
    kv_usage: str  # gauge, 0..1
    ttft: str  # histogram (seconds), without `_bucket`
    itl: str  # histogram (seconds)
    requests: str  # counter of finished requests
    failed_requests: str  # the same counter's failed part (a selector)
    # vLLM: counters; SGLang: a gauge averaged over the window.
    accepted_tokens: str = ""
    drafts: str = ""
    accepted_per_position: str = ""
    acceptance_gauge: str = ""

    def tokens_per_second(self, window: str) -> str:
        return f"sum by (host) (rate({self.generated_tokens}[{window}]))"

    def progress(self, window: str) -> str:
        """Tokens generated or prefilled over WINDOW: what a frozen engine stops doing."""
        return (
            f"sum by (host) (increase({self.generated_tokens}[{window}]))"
            f" + sum by (host) (increase({self.prompt_tokens}[{window}]))"
        )

    def in_flight(self) -> str:
        return f"sum by (host) ({self.running})"

    def queued(self) -> str:
        return f"sum by (host) ({self.waiting})"

    def kv_used(self) -> str:
        return f"max by (host) ({self.kv_usage})"

    def quantile(self, histogram: str, q: float, window: str) -> str:
        return f"histogram_quantile({q}, sum by (host, le) (rate({histogram}_bucket[{window}])))"

    def error_ratio(self, window: str) -> str:
        return (
            f"sum by (host) (rate({self.failed_requests}[{window}])) / sum by (host) (rate({self.requests}[{window}]))"
        )

    def acceptance_length(self, window: str, host: str = "") -> str:
        """The mean acceptance length (accepted draft tokens + the bonus token, per verify step), of HOST
        alone when given."""
        where = f'{{host="{host}"}}' if host else ""
        if self.acceptance_gauge:
            return f"avg by (host) (avg_over_time({self.acceptance_gauge}{where}[{window}]))"
        return (
            f"1 + sum by (host) (rate({self.accepted_tokens}{where}[{window}]))"
            f" / sum by (host) (rate({self.drafts}{where}[{window}]))"
        )

    def acceptance_per_position(self, window: str) -> str | None:
        """The share of verify steps whose draft token at each `position` was accepted; None where the
        engine exports no per-position figure (SGLang 0.5.23)."""
        if not self.accepted_per_position:
            return None
        return (
            f"sum by (host, position) (rate({self.accepted_per_position}[{window}]))"
            f" / ignoring (position) group_left sum by (host) (rate({self.drafts}[{window}]))"
        )

    def names(self) -> tuple[str, ...]:
        """Every metric named here, for the test that holds them to the pinned wheels."""
        selectors = (self.generated_tokens, self.prompt_tokens, self.running, self.waiting, self.kv_usage,
                     self.ttft, self.itl, self.requests, self.failed_requests, self.accepted_tokens, self.drafts,
                     self.accepted_per_position, self.acceptance_gauge)  # fmt: skip
        return tuple(sorted({s.split("{")[0] for s in selectors if s}))


VLLM = EngineMetrics(
    engine="vllm",
    generated_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    requests="vllm:request_success_total",
    # FinishReason's strings (vllm/v1/engine/__init__.py): stop, length, abort, error, repetition.
    failed_requests='vllm:request_success_total{finished_reason="error"}',
    accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
    drafts="vllm:spec_decode_num_drafts_total",
    accepted_per_position="vllm:spec_decode_num_accepted_tokens_per_pos_total",
)

SGLANG = EngineMetrics(
    engine="sglang",
    generated_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    requests="sglang:num_requests_total",
    failed_requests="sglang:num_aborted_requests_total",
    acceptance_gauge="sglang:spec_accept_length",
)

BY_ENGINE = {m.engine: m for m in (VLLM, SGLANG)}


def of(engine: str) -> EngineMetrics:
    """The metrics of ENGINE (`vllm` or `sglang`, the serving config's engine)."""
    try:
        return BY_ENGINE[engine]
    except KeyError:
        raise ValueError(f"no metrics known for engine {engine!r} (known: {', '.join(ENGINES)})") from None
