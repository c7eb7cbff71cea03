"""One GPU peer-to-peer verdict, from the probe's figures (specdeploy.gpu.p2p_probe), for NCCL, the
engines' custom all-reduce and vLLM's own P2P check alike.

The kernel command line (`iommu=pt`) is a flag, not a proof: a host can have ACS on behind one root
port and off behind another, and P2P then hangs NCCL after init, corrupts data, or crawls
(NVIDIA/nccl#2079, vllm#33041). The probe copies between every GPU pair and all-reduces over all of
them, with P2P on and off; this module reads that:
- `p2p-ok`: peer access everywhere, right data and sums, and the peer path no slower than through
  host memory. vLLM may then skip its own ~60 s P2P check at every start (`VLLM_SKIP_P2P_CHECK=1`).
- `p2p-broken`: the probe hung (its timeout), crashed, copied wrong data, summed wrong, or the peer
  path was slower than staging through the host. NCCL goes through host memory
  (`NCCL_P2P_DISABLE=1`) and custom all-reduce is off.
- `no-p2p`: the driver reports no peer access for some pair. NCCL finds that itself; the engines'
  custom all-reduce needs P2P between every pair, so it is off.
One GPU has no pair: `no-p2p`, with no flags."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from typing import Any

PROBE_TIMEOUT_S = 60.0
MODES = ("auto", "on", "off")  # serving_p2p
SLOWER_THAN_STAGED = 1.0  # the peer path must at least match a copy staged through pinned host memory
FIX = ("boot with iommu=pt (or the IOMMU off), and turn ACS off on the GPUs' PCIe bridges: in the BIOS, or "
       "with the kernel parameter pci=noacs, or at run time with `setpci -s <bridge> ECAP_ACS+6.w=0000` for "
       "each bridge above the GPUs (NVIDIA/nccl#2079); then run preflight again")  # fmt: skip


@dataclass(frozen=True)
class P2PVerdict:
    value: str  # p2p-ok | p2p-broken | no-p2p
    reason: str
    facts: list[str] = field(default_factory=list)  # one line per pair and per all-reduce, measured
    env: dict[str, str] = field(default_factory=dict)
    vllm_args: list[str] = field(default_factory=list)
    sglang_args: list[str] = field(default_factory=list)

    def serving(self) -> dict[str, Any]:
        """The shape serve.config reads as serving_nccl (env, vllm_args, sglang_args, reason)."""
        return {"env": self.env, "vllm_args": self.vllm_args, "sglang_args": self.sglang_args,
                "reason": f"{self.value}: {self.reason}"}  # fmt: skip


def _broken(reason: str, facts: list[str]) -> P2PVerdict:
    return P2PVerdict("p2p-broken", f"{reason}. Fix: {FIX}", facts, {"NCCL_P2P_DISABLE": "1"},
                      ["--disable-custom-all-reduce"], ["--disable-custom-all-reduce"])  # fmt: skip


def _pair_fact(pair: dict[str, Any]) -> str:
    access = "yes" if pair.get("peer_access") else "no"
    data = "correct" if pair.get("direct_correct") else "WRONG DATA"
    return (f"GPU{pair['src']}->GPU{pair['dst']}: peer access {access}, {pair.get('direct_gbps', 0):.1f} GB/s direct "
            f"vs {pair.get('staged_gbps', 0):.1f} GB/s through host memory, data {data}")  # fmt: skip


def _all_reduce_fact(run: dict[str, Any]) -> str:
    mode = "P2P on" if run.get("p2p") else "NCCL_P2P_DISABLE=1"
    if run.get("error"):
        return f"all-reduce ({mode}): failed: {run['error']}"
    sums = "right sum" if run.get("correct") else "WRONG SUM"
    return f"all-reduce ({mode}): {sums}, bus {run.get('bus_gbps', 0):.1f} GB/s"


def _fault(pairs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str | None:
    """Wrong data or a failed all-reduce with P2P on: broken whatever the speeds."""
    if any(p.get("peer_access") and not p.get("direct_correct") for p in pairs):
        return "a peer copy delivered wrong data"
    if any(r.get("p2p") and (r.get("error") or not r.get("correct")) for r in runs):
        return "the NCCL all-reduce with P2P on failed or summed wrong"
    return None


def _slow(pairs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str | None:
    """A peer path slower than host memory: the mark of an IOMMU/ACS redirect."""
    slow = [p for p in pairs if p.get("direct_gbps", 0) < SLOWER_THAN_STAGED * p.get("staged_gbps", 0)]
    if slow:
        worst = min(slow, key=lambda p: p["direct_gbps"] / max(p["staged_gbps"], 1e-9))
        return (f"{len(slow)} peer path(s) slower than staging through host memory (worst GPU{worst['src']}"
                f"->GPU{worst['dst']}: {worst['direct_gbps']:.1f} vs {worst['staged_gbps']:.1f} GB/s), "
                "the mark of an IOMMU/ACS redirect")  # fmt: skip
    on = next((r for r in runs if r.get("p2p") and not r.get("error")), None)
    off = next((r for r in runs if not r.get("p2p") and not r.get("error") and r.get("correct")), None)
    if on and off and on.get("bus_gbps", 0) < SLOWER_THAN_STAGED * off.get("bus_gbps", 0):
        return f"the all-reduce is slower with P2P on ({on['bus_gbps']:.1f} GB/s) than off ({off['bus_gbps']:.1f} GB/s)"
    return None


def judge(result: dict[str, Any] | None, *, timed_out: bool = False, error: str = "") -> P2PVerdict:
    """The verdict from the probe's document (None: it did not finish; see timed_out and error)."""
    if result is None:
        hung = (f"the P2P probe did not finish in {PROBE_TIMEOUT_S:.0f} s: a peer copy or an NCCL all-reduce "
                "hung, as NCCL does over a redirected PCIe path")  # fmt: skip
        return _broken(hung if timed_out else f"the P2P probe failed: {error or 'no output'}", [])
    pairs, runs = list(result.get("pairs", [])), list(result.get("all_reduce", []))
    facts = [*map(_pair_fact, pairs), *map(_all_reduce_fact, runs)]
    if len(result.get("gpus", [])) < 2:
        return P2PVerdict("no-p2p", "one GPU: no pair, no peer-to-peer to prove, no flags needed", facts)
    fault = _fault(pairs, runs)
    if fault is None and not all(p.get("peer_access") for p in pairs):
        none = sum(1 for p in pairs if not p.get("peer_access"))
        return P2PVerdict("no-p2p", f"the driver reports no peer access for {none} of {len(pairs)} GPU pairs; "
                          "NCCL routes those through host memory by itself, custom all-reduce is off", facts,
                          {}, ["--disable-custom-all-reduce"], ["--disable-custom-all-reduce"])  # fmt: skip
    fault = fault or _slow(pairs, runs)
    if fault:
        return _broken(fault, facts)
    return P2PVerdict("p2p-ok", f"peer access, right data and sums over all {len(pairs)} GPU pairs, and the peer "
                      "path faster than host memory: P2P stays on, vLLM's own P2P check is skipped", facts,
                      {"VLLM_SKIP_P2P_CHECK": "1"})  # fmt: skip


def mode(value: object) -> object:
    """`serving_p2p: off` unquoted is YAML's false: read the booleans back as the words they were."""
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else value


def override(verdict: P2PVerdict, mode: str) -> P2PVerdict:
    """`serving_p2p`: auto takes the verdict; on and off are the operator's word, said as such."""
    if mode == "auto":
        return verdict
    if mode == "off":
        off = _broken("serving_p2p: off (the operator's override)", verdict.facts)
        return P2PVerdict(off.value, "serving_p2p: off (the operator's override)", off.facts, off.env, off.vllm_args,
                          off.sglang_args)  # fmt: skip
    if mode == "on":
        return P2PVerdict("p2p-ok", f"serving_p2p: on (the operator's override of: {verdict.value})", verdict.facts)
    raise ValueError(f"serving_p2p: {mode!r} is not one of {', '.join(MODES)}")


def override_settings(settings: dict[str, Any], mode: str) -> dict[str, Any]:
    """`serving_p2p` over the engine settings the role holds as serving_nccl (P2PVerdict.serving()'s
    shape, today preflight's gpu.checks advice; {}: no GPUs read). auto leaves them as they are, so
    the configuration digest of every engine deployed before serving_p2p existed is unchanged."""
    if mode == "auto":
        return settings
    reason = str(settings.get("reason") or "no GPU facts")
    named = reason.split(":", 1)[0]
    env = {str(k): str(v) for k, v in (settings.get("env") or {}).items()}
    vllm_args = [str(a) for a in settings.get("vllm_args") or []]
    sglang_args = [str(a) for a in settings.get("sglang_args") or []]
    if named in ("p2p-ok", "p2p-broken", "no-p2p"):
        value = named
    else:  # gpu.checks' advice names no verdict: its flags say which one it amounts to
        value = "p2p-broken" if env.get("NCCL_P2P_DISABLE") == "1" else "no-p2p" if vllm_args else "p2p-ok"
    return override(P2PVerdict(value, reason, [], env, vllm_args, sglang_args), mode).serving()


def run_probe(argv: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> P2PVerdict:
    """Run the probe (ARGV: the command, e.g. `docker run … python3 -m specdeploy.gpu.p2p_probe`),
    bounded in time, and judge what it printed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return judge(None, timed_out=True)
    if done.returncode != 0:
        return judge(None, error=f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
    try:
        return judge(json.loads(done.stdout))
    except ValueError as exc:
        return judge(None, error=f"unreadable output ({exc}): {done.stdout[-300:]}")
