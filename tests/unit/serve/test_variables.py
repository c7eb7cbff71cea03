"""Bad serving inventory values (specdeploy.serve.variables): each refused, naming its variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdeploy.serve.schema import RULES
from specdeploy.serve.variables import problems
from tests.unit.templating import by_declaration, role_vars

DEFAULTS = yaml.safe_load((Path(__file__).parents[3] / "roles/serving/defaults/main.yml").read_text())

BAD = [
    # types
    ("serving_port", "http"),
    ("serving_tensor_parallel_size", "two"),
    ("serving_max_model_len", 4096.5),
    ("serving_warm_page_cache", "sometimes"),
    ("serving_env", ["VLLM_LOGGING_LEVEL=DEBUG"]),
    ("serving_volumes", "/srv/hook:/hook"),
    # ranges
    ("serving_port", 70000),
    ("serving_port", 0),
    ("serving_tensor_parallel_size", 0),
    ("serving_pipeline_parallel_size", -1),
    ("serving_max_model_len", -8192),
    ("serving_num_speculative_tokens", 40),
    ("serving_stall_timeout", -5),
    ("serving_timeout", 0),
    ("serving_reconnect_grace", -1),
    ("serving_stack_bytes", 0),
    # formats
    ("serving_model_path", "models/kimi"),
    ("serving_model_path", "/srv/../etc"),
    ("serving_state_dir", "var/lib/specdeploy"),
    ("serving_shm_size", "sixteen gigs"),
    ("serving_bind_address", "localhost:8000"),
    ("serving_extra_args", "--enforce-eager --max-num-seqs 8"),
    ("serving_served_model_name", "kimi k2.5"),
    ("serving_engine", "tgi"),
    ("serving_gpus", "all"),
    ("serving_ipc_mode", "none"),
    ("serving_speculative_method", "eagle"),
    ("serving_volumes", {"srv/hook": "/hook"}),
    # secrets
    ("serving_env", {"VLLM_API_KEY": "sk-plain-text"}),
    ("serving_env", {"HF_TOKEN": "hf_plain"}),
    ("serving_extra_args", ["--api-key", "sk-plain-text"]),
]


def test_the_defaults_pass():
    values = {k: v for k, v in DEFAULTS.items() if k in RULES and "{{" not in str(v)}
    assert len(values) >= 15
    assert problems(values) == []


@pytest.mark.parametrize(("variable", "value"), BAD, ids=[f"{v}={x!r}"[:60] for v, x in BAD])
def test_a_bad_value_is_refused_naming_its_variable(variable, value):
    (problem,) = problems({variable: value})
    assert problem.startswith(f"{variable}="), problem
    assert ": must be " in problem


def test_secrets_are_never_echoed():
    (problem,) = problems({"serving_env": {"VLLM_API_KEY": "sk-plain-text"}})
    assert "sk-plain-text" not in problem and "VLLM_API_KEY" in problem and "ansible-vault" in problem
    (problem,) = problems({"serving_extra_args": ["--api-key", "sk-plain-text"]})
    assert "sk-plain-text" not in problem and "serving_api_key" in problem


def test_enough_cases():
    assert len(BAD) >= 20 and len({v for v, _ in BAD}) >= 15


def test_the_engine_arguments_follow_the_p2p_verdict_of_gpu_checks():
    """serve.config renders what gpu.checks decided, for both engines, and nothing when no GPUs were read."""
    from specdeploy.gpu.checks import nccl_recommendations  # noqa: PLC0415
    from specdeploy.serve.config import ServingConfig  # noqa: PLC0415
    from tests.unit.gpu.test_gpu_checks import rtx_pro  # noqa: PLC0415

    off = nccl_recommendations(rtx_pro(), iommu_fixed=False, cmdline="ro intel_iommu=on")
    on = nccl_recommendations(rtx_pro(), iommu_fixed=False, cmdline="ro intel_iommu=on iommu=pt")
    for engine in ("vllm", "sglang"):
        base = {"engine": engine, "image": "i", "model_path": "/m", "served_model_name": "m"}
        disabled = ServingConfig.from_vars({**base, "nccl": off})
        assert "--disable-custom-all-reduce" in disabled.command()
        assert disabled.environment()["NCCL_P2P_DISABLE"] == "1"
        for kept in (ServingConfig.from_vars({**base, "nccl": on}), ServingConfig.from_vars(base)):
            assert "--disable-custom-all-reduce" not in kept.command()
            assert "NCCL_P2P_DISABLE" not in kept.environment()


def test_the_example_inventory_serves_kimi_k25_as_its_model_card_asks():
    """Rendered for both pinned engines: remote code trusted, the kimi_k2 tool-call and reasoning parsers."""
    from specdeploy.serve.config import ServingConfig  # noqa: PLC0415

    for engine in ("vllm", "sglang"):
        values = role_vars("example-8gpu", {"specdeploy_engine": engine})
        assert problems({k: v for k, v in values.items() if k in RULES}) == []
        config = ServingConfig.from_vars(by_declaration(values))
        assert config.problems() == [], config.problems()
        cmd = config.command()
        assert "--trust-remote-code" in cmd, (engine, cmd)
        assert cmd[cmd.index("--tool-call-parser") + 1] == "kimi_k2", (engine, cmd)
        assert cmd[cmd.index("--reasoning-parser") + 1] == "kimi_k2", (engine, cmd)
        assert cmd[cmd.index("--tensor-parallel-size" if engine == "vllm" else "--tp-size") + 1] == "8"
    vllm = ServingConfig.from_vars(by_declaration(role_vars("example-8gpu", {"specdeploy_engine": "vllm"}))).command()
    assert "--enable-auto-tool-choice" in vllm  # vLLM serves tool calls only with it
    plain = ServingConfig.from_vars({"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m"})
    assert not {"--trust-remote-code", "--tool-call-parser", "--reasoning-parser"} & set(plain.command())
    assert "not a parser name" in problems({"serving_tool_call_parser": "Kimi K2"})[0]


def test_a_model_with_custom_code_and_no_trust_gets_a_warning():
    from specdeploy.serve.variables import remote_code_warnings  # noqa: PLC0415

    kimi = json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                       "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"}})  # fmt: skip
    (warning,) = remote_code_warnings(kimi, trust_remote_code=False)
    assert "AutoConfig" in warning and "serving_trust_remote_code: true" in warning
    assert remote_code_warnings(kimi, trust_remote_code=True) == []
    assert remote_code_warnings(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}), False) == []
    assert remote_code_warnings(None, False) == [] and remote_code_warnings("not json", False) == []


def test_sglang_text_only_is_refused_for_kimi_k25_before_the_rollout_and_vllm_keeps_it():
    from specdeploy.serve.variables import model_problems  # noqa: PLC0415

    kimi = json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]})
    (refusal,) = model_problems(kimi, "sglang", language_model_only=True)
    assert "KimiK25ForConditionalGeneration" in refusal and "serving_language_model_only: false" in refusal
    assert model_problems(kimi, "sglang", language_model_only=False) == []
    assert model_problems(kimi, "vllm", language_model_only=True) == []
    assert model_problems(json.dumps({"architectures": ["DeepseekV4ForCausalLM"]}), "sglang", True) == []
    assert model_problems(None, "sglang", True) == [] and model_problems("[1]", "sglang", True) == []


def test_sglang_attention_backends_for_sm120_render_and_vllm_refuses_names_outside_its_registry():
    from specdeploy.serve.config import ServingConfig  # noqa: PLC0415

    base = {"image": "i", "model_path": "/m", "served_model_name": "m", "attention_backend": "triton",
            "draft_attention_backend": "triton"}  # fmt: skip
    cmd = ServingConfig.from_vars({**base, "engine": "sglang"}).command()
    assert cmd[cmd.index("--attention-backend") + 1] == "triton"
    assert cmd[cmd.index("--speculative-draft-attention-backend") + 1] == "triton"
    target, draft = ServingConfig.from_vars({**base, "engine": "vllm"}).problems()
    assert target.startswith("serving_attention_backend='triton': vLLM has no such attention backend (its own: ")
    assert "TRITON_MLA" in target and draft.startswith("serving_draft_attention_backend='triton': vLLM has no such")
