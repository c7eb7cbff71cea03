"""Run by the engine venv's python: the tiny target in the real vLLM, EAGLE-3 capture switched on
the way the model runner does it, against transformers' hidden states on the same tokens.

    python capture_in_engine.py TARGET --layers 1 2 3 --out result.json

The CPU build refuses spec decode, so no drafter is served; the runner's EAGLE-3 switch is set by
hand on the loaded model, and a forward hook on it keeps the aux hidden states the runner's real
execute path gets back (not on the inner `DeepseekV2Model`: its torch.compile wrapper calls
`forward` directly, so module hooks never fire there). Writes JSON; a failed capture is reported.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

PROMPT = "speculative decoding drafts tokens that the target model verifies"
# Its own error text, from GPUModelRunner.load_model when EAGLE-3 asks a model without the interface.
NO_INTERFACE = "Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested"


def enable_capture(worker: Any, layers: list[int]) -> dict[str, Any]:
    """On the worker: what the runner does for an EAGLE-3 drafter, plus a hook that keeps what the
    model returns: the aux states per position (one request, so a position names one token)."""
    from vllm.model_executor.models.interfaces import supports_eagle3  # noqa: PLC0415

    runner = worker.model_runner
    model = runner.get_model()
    facts = {
        "model_class": type(model).__name__,
        "supports_eagle3": supports_eagle3(model),
        "has_set_aux_hidden_state_layers": hasattr(model, "set_aux_hidden_state_layers"),
    }
    if facts["supports_eagle3"]:
        model.set_aux_hidden_state_layers(tuple(layers))
        runner.use_aux_hidden_state_outputs = True
    else:
        facts["error"] = NO_INTERFACE  # where the runner stops; the hook still shows what forward returns
    captured: dict[int, list[torch.Tensor]] = {}
    returned: set[str] = set()
    worker.specdeploy_capture = (captured, returned)

    def keep(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        returned.add(type(output).__name__)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if isinstance(output, tuple) and positions is not None:
            for row, pos in enumerate(positions.tolist()):
                captured[pos] = [h[row].detach().float().clone() for h in output[1]]

    model.register_forward_hook(keep, with_kwargs=True)
    return facts


def take_captured(worker: Any) -> tuple[dict[int, list[torch.Tensor]], list[str]]:
    captured, returned = worker.specdeploy_capture
    return dict(captured), sorted(returned)


def hf_hidden_states(target: Path, token_ids: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    from transformers import DeepseekV3ForCausalLM  # noqa: PLC0415

    model = DeepseekV3ForCausalLM.from_pretrained(target, torch_dtype=dtype).eval()
    with torch.no_grad():
        out = model(torch.tensor([token_ids]), output_hidden_states=True)
    return tuple(h[0].float() for h in out.hidden_states)


def cosines(a: torch.Tensor, b: torch.Tensor) -> list[float]:
    return [round(c, 6) for c in torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()]


def compare(captured: dict[int, list[torch.Tensor]], hf: tuple[torch.Tensor, ...], layers: list[int]) -> dict[str, Any]:
    """vLLM appends `hidden_states + residual` before layer idx runs: the input to layer idx, which
    is HF's hidden_states[idx] (hidden_states[0] is the embedding output)."""
    positions = sorted(captured)
    per_layer = {}
    for i, idx in enumerate(layers):
        ours = torch.stack([captured[p][i] for p in positions])
        per_token = cosines(ours, hf[idx][positions])
        # The neighbours' figures show the comparison tells layers apart (not every state matches).
        neighbours = {n: min(cosines(ours, hf[n][positions])) for n in (idx - 1, idx + 1) if 0 <= n < len(hf) - 1}
        per_layer[str(idx)] = {"min": min(per_token), "per_token": per_token, "neighbour_min": neighbours}
    return {"positions": positions, "layers": per_layer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--layers", type=int, nargs="+", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the worker in this process, hooks reach it

    from transformers import AutoTokenizer  # noqa: PLC0415
    from vllm import LLM, SamplingParams  # noqa: PLC0415
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    llm = LLM(model=str(args.target), enforce_eager=True, max_model_len=512, max_num_seqs=1, dtype=args.dtype)
    result: dict[str, Any] = {"vllm_version": __import__("vllm").__version__, "dtype": args.dtype}
    result["capture"] = llm.collective_rpc(enable_capture, args=(args.layers,))[0]
    prompt = AutoTokenizer.from_pretrained(args.target)(PROMPT)["input_ids"]
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    generated = list(llm.generate([TokensPrompt(prompt_token_ids=prompt)], greedy)[0].outputs[0].token_ids)
    # Every token the engine ran: the prompt (prefill) and each decode step's input.
    token_ids = prompt + generated[:-1]
    captured, returned = llm.collective_rpc(take_captured)[0]
    result |= {"prompt_tokens": len(prompt), "tokens_run": len(token_ids), "forward_returned": returned,
               "captured_positions": len(captured)}  # fmt: skip
    if captured:
        hf = hf_hidden_states(args.target, token_ids, getattr(torch, args.dtype))
        result["hf_hidden_states"] = len(hf)
        result |= compare(captured, hf, args.layers)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
