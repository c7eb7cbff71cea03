"""The model's files the fit reads (config.json, the safetensors headers), on the host or here, and the fit.

On the host, one SSH round runs READ_SCRIPT: each folder's config.json and each *.safetensors file's
header (the 8-byte length, then that many bytes: never the weights), base64 a line; parse_read turns it
into ModelFiles. Here (`specdeploy plan --fit`), read_local reads a folder the same way. A folder
without headers but with `model.safetensors.index.json` (a checkpoint not downloaded: the index is a
few hundred kB) gives only its total_size: the weights are then that over TP x PP, an estimate.
fit_for decides: the fit on paper, or why there is none to make yet.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.errors import SpecdeployError
from specdeploy.preflight import memory, weights

READ_SCRIPT = r"""
for tag in target drafter; do
  if [ "$tag" = target ]; then d=$1; else d=$2; fi
  [ -n "$d" ] || continue
  [ -r "$d/config.json" ] || { echo "missing $tag"; continue; }
  printf 'config %s %s\n' "$tag" "$(base64 -w0 "$d/config.json")"
  for f in "$d"/*.safetensors; do
    [ -r "$f" ] || continue
    n=$(head -c 8 "$f" | od -An -tu8 --endian=little | tr -d ' ')
    if [ "${n:-0}" -gt 0 ] && [ "$n" -le 104857600 ]; then
      printf 'header %s %s\n' "$tag" "$(tail -c +9 "$f" | head -c "$n" | base64 -w0)"
    else echo "bad $tag $f"; fi
  done
done
exit 0
"""


@dataclass(frozen=True)
class ModelFiles:
    config: Mapping[str, Any] | None = None
    headers: dict[str, weights.Tensor] = field(default_factory=dict)
    index_total: int = 0  # model.safetensors.index.json's total_size, where no headers were read
    bad: tuple[str, ...] = ()


def parse_read(output: str) -> dict[str, ModelFiles]:
    """READ_SCRIPT's lines, by folder (target, drafter); a folder without config.json is left out."""
    configs: dict[str, Mapping[str, Any]] = {}
    headers: dict[str, dict[str, weights.Tensor]] = {}
    bad: dict[str, list[str]] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        tag, _, value = rest.partition(" ")
        if kind == "config":
            configs[tag] = json.loads(base64.b64decode(value))
        elif kind == "header":
            headers.setdefault(tag, {}).update(weights.parse_header(base64.b64decode(value)))
        elif kind == "bad":
            bad.setdefault(tag, []).append(value)
    return {
        tag: ModelFiles(config, headers.get(tag, {}), 0, tuple(bad.get(tag, ()))) for tag, config in configs.items()
    }


def read_local(folder: Path) -> ModelFiles:
    config = json.loads((folder / "config.json").read_text())
    headers = weights.read_folder(folder)
    index = folder / "model.safetensors.index.json"
    total = 0
    if not headers and index.is_file():
        total = int(json.loads(index.read_text()).get("metadata", {}).get("total_size") or 0)
    return ModelFiles(config, headers, total)


@dataclass(frozen=True)
class FitResult:
    fit: memory.Fit | None
    note: str  # how the weights were had, or why there is no fit
    serving: memory.Serving = field(default_factory=memory.Serving)

    def report(self, title: str) -> list[str]:
        """`specdeploy plan --fit`'s lines: the layout, then the fit and any refusal."""
        if self.fit is None:
            return [f"{title}: {self.note}"]
        serving, layout = self.serving, self.serving.layout
        head = (f"{title}: {serving.engine}, TP {layout.tensor_parallel} x PP {layout.pipeline_parallel}"
                f"{' (expert parallel)' if layout.expert_parallel else ''}; {self.note}")  # fmt: skip
        return [head, *(f"  {line}" for line in self.fit.lines()), *(f"  REFUSED: {p}" for p in self.fit.problems())]

    def as_dict(self) -> dict[str, Any]:
        fitted = self.fit
        if fitted is None:
            return {"note": self.note}
        return {**vars(fitted), "kv_tokens": fitted.kv_tokens, "max_concurrency": fitted.max_concurrency,
                "problems": fitted.problems(), "note": self.note}  # fmt: skip


def cpu_kv_gib(env: Mapping[str, Any]) -> float | None:
    """vLLM on CPU: the cache its VLLM_CPU_KVCACHE_SPACE sets (GiB), None where it is not said."""
    value = env.get("VLLM_CPU_KVCACHE_SPACE")
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _cpu_fit_for(serving: memory.Serving, config: Mapping[str, Any], drafter: ModelFiles | None,
                 cpu_kv: float | None) -> FitResult:  # fmt: skip
    """vLLM on CPU: the cache VLLM_CPU_KVCACHE_SPACE sets, in tokens of the target's and the drafter's layers."""
    if cpu_kv is None:
        return FitResult(None, "no GPUs read and no VLLM_CPU_KVCACHE_SPACE: no fit to check", serving)
    if serving.speculative and (drafter is None or drafter.config is None):
        # its layer is in every token's bytes: a fit without it would over-count the tokens
        return FitResult(None, "the drafter's config.json is not there yet: no fit to check", serving)
    draft = drafter.config if serving.speculative and drafter is not None else None
    fitted = memory.cpu_fit(cpu_kv, config, serving.max_model_len, draft)
    return FitResult(fitted, "the KV cache VLLM_CPU_KVCACHE_SPACE sets (vLLM on CPU)", serving)


def fit_for(serving: memory.Serving, target: ModelFiles | None, drafter: ModelFiles | None,
            gpu_mib: int, cpu_kv: float | None = None) -> FitResult:  # fmt: skip
    """The fit on one GPU of GPU_MIB (0: no GPUs read; then vLLM on CPU's CPU_KV GiB), or why none is
    made (nothing refused then)."""
    if target is None or target.config is None:
        return FitResult(None, "the model's config.json is not there yet: no fit to check")
    if gpu_mib <= 0:
        return _cpu_fit_for(serving, target.config, drafter, cpu_kv)
    if target.bad:
        return FitResult(None, f"not safetensors headers: {', '.join(target.bad)}: no fit to check")
    if serving.speculative and (drafter is None or drafter.config is None or not drafter.headers):
        return FitResult(None, "the drafter's config.json and headers are not there yet: no fit to check")
    layout = serving.layout
    if target.headers:
        held = weights.weight_bytes(serving.engine, target.headers, target.config, layout)
        note = f"weights from {len(target.headers):,} tensors' headers"
    elif target.index_total:
        held = -(-target.index_total // (layout.tensor_parallel * layout.pipeline_parallel))
        note = "weights estimated from model.safetensors.index.json's total_size over TP x PP (no headers)"
    else:
        return FitResult(None, "the model's safetensors are not there yet: no fit to check")
    if serving.speculative and drafter is not None and drafter.config is not None:
        # vLLM is told draft_tensor_parallel_size 1 (specdeploy.serve.config): each rank keeps it whole;
        # SGLang runs the drafter at the target's TP.
        draft_layout = weights.Layout() if serving.engine == "vllm" else layout
        held += weights.weight_bytes(serving.engine, drafter.headers, drafter.config, draft_layout, drafter=True)
    drafter_config = drafter.config if drafter is not None else None
    return FitResult(memory.predict(serving, gpu_mib, held, target.config, drafter_config), note, serving)


def local_fit(values: Mapping[str, Any], engine: str, model: Path, drafter: Path | None, gpu_mib: int) -> FitResult:
    """The fit of a model folder here (config.json and its headers), under an inventory's serving_* VALUES
    (as the inventory writes them: a Jinja expression is not rendered here, and is refused)."""
    try:
        serving = memory.Serving.from_vars(values, engine)
    except (TypeError, ValueError) as exc:
        raise SpecdeployError(f"the inventory's serving values: {exc}", hint="say them as plain values") from exc
    return fit_for(serving, read_local(model), read_local(drafter) if drafter else None, gpu_mib)
