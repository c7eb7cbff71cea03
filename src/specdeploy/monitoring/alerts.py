"""The alert rules, generated from what specdeploy knows: each engine's own metric form
(engine_metrics), and the acceptance the benchmark gate recorded for the configuration, engine image
and hardware that serve now (bench.json).

Why an acceptance alert: EAGLE-3 pays only while its drafts are accepted. On the H100 at full depth
(vLLM 0.33.0, docs/gpu-truth.md) acceptance 2.3 measured x1.60-1.82 of speculation off at 1-4 requests,
acceptance 1.6 only x1.12-1.26, and at 16 requests x1.01-1.04. Traffic unlike the gate's prompts can
cost instead of pay with nothing else changed, and no peer alerts on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.monitoring.engine_metrics import of
from specdeploy.monitoring.targets import EngineTarget, RecordedAcceptance

SENTINEL_MEMBER = "specdeploy_sentinel_member"
SENTINEL_HELD = "specdeploy_sentinel_held"
ROUTER_REQUESTS, ROUTER_ERRORS = "vllm_router_requests_total", "vllm_router_request_errors_total"


@dataclass(frozen=True)
class AlertSettings:
    """The thresholds (roles/monitoring's variables, checked by problems())."""

    frozen_s: int = 60
    saturated_s: int = 300
    kv_saturated: float = 0.95
    acceptance_fraction: float = 0.9  # of the recorded figure
    acceptance_window_s: int = 600
    error_ratio: float = 0.05
    error_window_s: int = 300
    out_of_router_s: int = 60

    @classmethod
    def from_vars(cls, values: dict[str, Any]) -> AlertSettings:
        known = cls.__dataclass_fields__
        return cls(**{k: type(getattr(cls(), k))(v) for k, v in values.items() if k in known})

    def problems(self) -> list[str]:
        out = [f"monitoring_alert_{name} must be > 0, not {getattr(self, name)}"
               for name in ("frozen_s", "saturated_s", "acceptance_window_s", "error_window_s", "out_of_router_s")
               if getattr(self, name) <= 0]  # fmt: skip
        for name in ("kv_saturated", "acceptance_fraction", "error_ratio"):
            if not 0 < getattr(self, name) <= 1:
                out.append(f"monitoring_alert_{name} must be in (0, 1], not {getattr(self, name)}")
        return out


# Annotations name labels only, never `$value`: what they say is fixed by the rule and the labels, so
# promtool's tests (which compare annotations too) hold every rule's words.
def _rule(name: str, expr: str, for_s: int, severity: str, *words: str, **labels: str) -> dict[str, Any]:
    """One alerting rule; WORDS are its summary, then its description."""
    summary, description = words
    return {"alert": name, "expr": expr, "for": f"{for_s}s",
            "labels": {"severity": severity, **labels},
            "annotations": {"summary": summary, "description": description}}  # fmt: skip


def engine_rules(engine: str, settings: AlertSettings) -> list[dict[str, Any]]:
    """The rules every engine of ENGINE's kind gets, in its own metric form."""
    m = of(engine)
    frozen = f"({m.in_flight()} > 0) and on (host) ({m.progress(f'{settings.frozen_s}s')} == 0)"
    return [
        _rule("SpecdeployEngineFrozen", frozen, 0, "critical",
              "{{ $labels.host }}: requests in flight, and no token generated or prefilled",
              f"{engine} on {{{{ $labels.host }}}} has had requests running and no token progress for "
              f"{settings.frozen_s} s: a frozen engine core behind an API that may still answer /health. "
              "The sentinel takes it out of the router; `make logs HOST={{ $labels.host }}` shows why.",
              engine=engine),
        _rule("SpecdeployKVCacheSaturated", f"{m.kv_used()} > {settings.kv_saturated:g}", settings.saturated_s,
              "warning", "{{ $labels.host }}: KV cache full",
              f"{engine}'s KV cache on {{{{ $labels.host }}}} has been above {settings.kv_saturated:.0%} for "
              f"{settings.saturated_s} s: requests queue or are preempted. Add replicas, lower "
              "serving_max_num_seqs, or raise serving_gpu_memory_fraction.", engine=engine),
        _rule("SpecdeployRequestsWaiting", f"{m.queued()} > 0", settings.saturated_s, "warning",
              "{{ $labels.host }}: requests waiting",
              f"{engine} on {{{{ $labels.host }}}} has had requests queued for {settings.saturated_s} s.",
              engine=engine),
        _rule("SpecdeployEngineErrors", f"{m.error_ratio(f'{settings.error_window_s}s')} > {settings.error_ratio:g}",
              0, "warning", "{{ $labels.host }}: requests failing",
              f"More than {settings.error_ratio:.0%} of {engine}'s finished requests on {{{{ $labels.host }}}} "
              f"failed over {settings.error_window_s} s.", engine=engine),
    ]  # fmt: skip


def acceptance_rule(target: EngineTarget, record: RecordedAcceptance, settings: AlertSettings) -> dict[str, Any]:
    """Live acceptance below the gate's recorded figure (by acceptance_fraction) for the window."""
    m = of(target.engine)
    floor = round(record.acceptance_length * settings.acceptance_fraction, 3)
    live = m.acceptance_length(f"{settings.acceptance_window_s}s", host=target.host)
    return _rule(
        "SpecdeployAcceptanceBelowGate", f"({live}) < {floor:g}", 0, "warning",
        f"{{{{ $labels.host }}}}: acceptance below the gate's {record.acceptance_length:.2f}",
        f"EAGLE-3's mean acceptance length on {target.host} over {settings.acceptance_window_s} s is below "
        f"{floor:g} ({settings.acceptance_fraction:.0%} of the {record.acceptance_length:.2f} the gate measured "
        f"on {record.time} for image {record.image}, hardware {record.hardware}). Below that, speculation may cost "
        "instead of pay: run the gate on today's traffic (serving_bench_prompts, make deploy) or set "
        "serving_speculative_method: none.",
        engine=target.engine, gate_acceptance=f"{record.acceptance_length:g}",
    )  # fmt: skip


def fleet_rules(settings: AlertSettings, router: bool) -> list[dict[str, Any]]:
    """Rules on the fleet's parts: a scrape target down, a worker out of the router, the router's errors."""
    rules = [
        _rule("SpecdeployTargetDown", "up == 0", settings.out_of_router_s, "critical",
              "{{ $labels.job }} on {{ $labels.host }} does not answer its scrape",
              "Prometheus has not scraped {{ $labels.instance }} ({{ $labels.job }}) for "
              f"{settings.out_of_router_s} s: the process is down or its port unreachable."),
    ]  # fmt: skip
    if router:
        rules += [
            _rule("SpecdeployOutOfRouter", f"{SENTINEL_MEMBER} == 0 unless on (host) {SENTINEL_HELD} == 1",
                  settings.out_of_router_s, "critical", "{{ $labels.host }} is out of the fleet's router",
                  f"The sentinel has seen {{{{ $labels.host }}}} outside the router for {settings.out_of_router_s} s "
                  "with no rollout holding it: it was taken out (frozen, down, failing completions) and has not "
                  "answered since. `make status` shows the sentinel's reason."),
            _rule("SpecdeployRouterErrors",
                  f"sum(rate({ROUTER_ERRORS}[{settings.error_window_s}s])) / "
                  f"sum(rate({ROUTER_REQUESTS}[{settings.error_window_s}s])) > {settings.error_ratio:g}",
                  0, "warning", "the router: requests failing",
                  f"More than {settings.error_ratio:.0%} of the router's requests failed over "
                  f"{settings.error_window_s} s."),
        ]  # fmt: skip
    return rules


def rule_file(targets: list[EngineTarget], records: dict[str, RecordedAcceptance], settings: AlertSettings,
              router: bool) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """Prometheus's rule file for TARGETS, and a note for each speculative engine left without an
    acceptance rule (no gate record yet: the gate off, or not run on what serves)."""
    rules = fleet_rules(settings, router)
    for engine in sorted({t.engine for t in targets}):
        rules += engine_rules(engine, settings)
    notes = []
    for target in targets:
        if not target.speculative:
            continue
        record = records.get(target.host)
        if record is None:
            notes.append(f"{target.host}: no acceptance alert, since the gate has recorded no acceptance for "
                         "what serves there (serving_bench_gate off, or no rollout since): it comes with the next "
                         "gate")  # fmt: skip
            continue
        rules.append(acceptance_rule(target, record, settings))
    return {"groups": [{"name": "specdeploy", "rules": rules}]}, notes
