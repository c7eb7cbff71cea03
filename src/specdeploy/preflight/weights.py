"""The weights one GPU holds, from the model's safetensors headers, before any load (issue 36).

A safetensors file opens with an 8-byte little-endian length and that many bytes of JSON: each tensor's
dtype and shape. Only that header is read, never the weights: the bytes a tensor takes are its shape
times its dtype's size, so quantized checkpoints count as they ship (Kimi-K2.5's int4 experts: an I32
`weight_packed` of 8 values a word, a BF16 `weight_scale` a group of 32, an I64 `weight_shape`).

What one GPU of a tensor x pipeline (x expert) parallel layout keeps, as the pinned engines build
DeepSeek-V3 / MLA models (vLLM 0.33.0 `model_executor/models/deepseek_v2.py`, SGLang 0.5.23
`srt/models/deepseek_v2.py`):
- whole on every rank (replicated): the norms, MLA's down projections `q_a_proj` and
  `kv_a_proj_with_mqa` (ReplicatedLinear in both), the MoE router `mlp.gate` and its
  `e_score_correction_bias`, compressed-tensors' `weight_shape`, the EAGLE-3 vocabulary maps
  `d2t`/`t2d`, the vision tower's patch embedding and the projector (ReplicatedLinear: vLLM's
  `kimi_k25_vit.py`, SGLang's `kimi_k25.py`), and the whole vision tower where its encoder runs data
  parallel (`serving_encoder_tp_mode: data`);
- split over the TP ranks: every other linear (q_b, kv_b, o_proj, the dense and shared-expert MLPs, the
  vision blocks' by default in both engines), the
  vocabulary-parallel embedding and lm_head, and the routed experts (each expert's intermediate split);
  with expert parallelism the routed experts are dealt whole instead, ceil(experts / ranks) a rank;
- over PP stages: the decoder layers in contiguous runs, the embedding and the vision tower with the
  first stage, the final norm and lm_head with the last; the fullest stage is the one that counts.
Each engine adds copies of its own (engine_extra_bytes). KV heads fewer than the TP ranks (GQA) are
replicated by the engines; counted split here, an under-count only for such non-MLA models.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.preflight.fit import text_config

# safetensors' dtype names and their bytes (F4/F6 packed types are not in the format's list).
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}  # fmt: skip
HEADER_LIMIT = 100 * 1024**2  # the format's own bound on a header
_REPLICATED = re.compile(
    r"(norm\.|norm$|\.q_a_proj\.|\.kv_a_proj_with_mqa\.|\.mlp\.gate\.|e_score_correction_bias|weight_shape$"
    r"|(^|\.)(d2t|t2d)$|vision_tower\.patch_embed\.|mm_projector\.|multi_modal_projector\.)"
)
_VISION = re.compile(r"vision_tower\.|vision_model\.")
_LAYER = re.compile(r"(?:^|\.)(?:layers|midlayer)\.(\d+)\.|(?:^|\.)midlayer\.")
_EXPERT = re.compile(r"\.experts\.\d+\.")
_FIRST = re.compile(
    r"embed_tokens|vision_tower\.|vision_model\.|mm_projector\.|multi_modal_projector\.|(^|\.)fc\.|d2t|t2d"
)


@dataclass(frozen=True)
class Tensor:
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"safetensors dtype {self.dtype!r} is not known here")
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


Headers = Mapping[str, Tensor]


@dataclass(frozen=True)
class Layout:
    """How the engine spreads one model copy over GPUs (data parallel copies each hold one whole)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    expert_parallel: bool = False  # the routed experts dealt over the TP ranks (vLLM -ep, SGLang --ep-size)
    encoder_data_parallel: bool = False  # a whole vision encoder on each rank (serving_encoder_tp_mode: data)


def parse_header(raw: bytes) -> dict[str, Tensor]:
    """The tensors of one header's JSON (its `__metadata__` left out)."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("a safetensors header is a JSON object")
    return {name: Tensor(str(t["dtype"]), tuple(int(d) for d in t["shape"]))
            for name, t in data.items() if name != "__metadata__"}  # fmt: skip


def read_header(path: Path) -> dict[str, Tensor]:
    """One .safetensors file's tensors, from its header alone."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > HEADER_LIMIT:
            raise ValueError(f"{path}: a header of {size} bytes is not a safetensors header")
        return parse_header(f.read(size))


def read_folder(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a model folder's *.safetensors files ({} where it has none)."""
    out: dict[str, Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(read_header(path))
    return out


def layer_of(name: str) -> int | None:
    """The decoder layer a tensor belongs to (an EAGLE-3 `midlayer` is layer 0), None for the others."""
    found = _LAYER.search(name)
    if found is None:
        return None
    return int(found.group(1)) if found.group(1) else 0


def stages(layers: int, pipeline_parallel: int) -> list[range]:
    """The decoder layers of each pipeline stage, in contiguous runs (the remainder on the first ones)."""
    pp = max(pipeline_parallel, 1)
    size, extra = divmod(layers, pp)
    out, start = [], 0
    for stage in range(pp):
        end = start + size + (1 if stage < extra else 0)
        out.append(range(start, end))
        start = end
    return out


def stage_of(name: str, runs: list[range]) -> int | None:
    """The pipeline stage that holds NAME; None for a layer beyond the model's depth: DeepSeek-V3's MTP
    layer (`num_nextn_predict_layers`), which both engines skip unless they serve MTP (vLLM's
    deepseek_v2.py `get_spec_layer_idx_from_weight_name`, SGLang's deepseek_weight_loader.py)."""
    if _FIRST.search(name):  # before the layers: a vision tower's own `layers.N` are not decoder layers
        return 0
    layer = layer_of(name)
    if layer is None:
        return len(runs) - 1
    return next((i for i, run in enumerate(runs) if layer in run), None)


def shard_bytes(name: str, tensor: Tensor, layout: Layout, experts: int) -> float:
    """The bytes of NAME one GPU keeps under LAYOUT (EXPERTS: the routed experts a layer)."""
    tp = max(layout.tensor_parallel, 1)
    if _REPLICATED.search(name) or (layout.encoder_data_parallel and _VISION.search(name)):
        return tensor.nbytes
    if _EXPERT.search(name) and layout.expert_parallel and experts:
        return tensor.nbytes * math.ceil(experts / tp) / experts  # whole experts dealt over the ranks
    return tensor.nbytes / tp


def gpu_bytes(headers: Iterable[tuple[str, Tensor]], config: Mapping[str, Any], layout: Layout) -> int:
    """The bytes the fullest GPU of LAYOUT holds of these tensors (CONFIG: the model's config.json)."""
    text = text_config(config)
    runs = stages(int(text.get("num_hidden_layers") or 1), layout.pipeline_parallel)
    experts = int(text.get("n_routed_experts") or text.get("num_local_experts") or text.get("num_experts") or 0)
    per_stage = [0.0] * len(runs)
    for name, tensor in headers:
        stage = stage_of(name, runs)
        if stage is not None:
            per_stage[stage] += shard_bytes(name, tensor, layout, experts)
    return math.ceil(max(per_stage))


def engine_extra_bytes(engine: str, headers: Headers, config: Mapping[str, Any], layout: Layout, *,
                       drafter: bool = False) -> int:  # fmt: skip
    """What the engine keeps beside the checkpoint's tensors, on one GPU of the first stage:
    - SGLang keeps MLA's absorbed `w_kc`/`w_vc`, a second copy of each layer's `kv_b_proj`
      (srt/models/deepseek_common/deepseek_weight_loader.py);
    - SGLang builds an EAGLE-3 drafter's own vocabulary embedding at load when the drafter ships none,
      and sizes the KV pool while it is there (srt/models/kimi_k25_eagle3.py; the target's is swapped in
      later by speculative/eagle_worker_v2.py); vLLM shares the target's instead
      (v1/spec_decode/llm_base_proposer.py `_maybe_share_embeddings`)."""
    if engine != "sglang":
        return 0
    tp = max(layout.tensor_parallel, 1)
    text = text_config(config)
    first = stages(int(text.get("num_hidden_layers") or 1), layout.pipeline_parallel)[0]
    kv_b = sum(t.nbytes for n, t in headers.items() if ".kv_b_proj." in n and (layer_of(n) or 0) in first) / tp
    embed = 0.0
    if drafter and not any("embed_tokens" in n for n in headers):
        embed = int(text.get("vocab_size") or 0) * int(text.get("hidden_size") or 0) * 2 / tp
    return math.ceil(kv_b + embed)


def weight_bytes(engine: str, headers: Headers, config: Mapping[str, Any], layout: Layout, *,
                 drafter: bool = False) -> int:  # fmt: skip
    """The bytes one GPU holds of a model (the target, or with DRAFTER its EAGLE-3 drafter) on ENGINE."""
    return gpu_bytes(headers.items(), config, layout) + engine_extra_bytes(engine, headers, config, layout,
                                                                            drafter=drafter)  # fmt: skip
