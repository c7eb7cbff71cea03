"""The SM120 recipe's typed variables: each said in the engine's own words, refused where the
engine lacks the value, and no flag or environment variable said by two owners."""

from __future__ import annotations

import json

import pytest

from specdeploy.serve import engine_words
from specdeploy.serve.config import ServingConfig
from tests.unit.templating import by_declaration, role_vars

BASE = {"image": "i", "model_path": "/m", "served_model_name": "m"}


def config(engine: str, **fields: object) -> ServingConfig:
    return ServingConfig.from_vars({**BASE, "engine": engine, **fields})


def value_after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_the_example_inventory_renders_the_sm120_recipe_in_each_engines_words():
    vllm = ServingConfig.from_vars(by_declaration(role_vars("example-8gpu", {"specdeploy_engine": "vllm"})))
    sglang = ServingConfig.from_vars(by_declaration(role_vars("example-8gpu", {"specdeploy_engine": "sglang"})))
    assert vllm.problems() == [] and sglang.problems() == []
    cmd = vllm.command()
    assert value_after(cmd, "--attention-backend") == "TRITON_MLA" and value_after(cmd, "--kv-cache-dtype") == "fp8"
    spec = json.loads(value_after(cmd, "--speculative-config"))
    assert (spec["method"], spec["attention_backend"], spec["kv_cache_dtype"]) == ("eagle3", "TRITON_MLA", "fp8")
    sizes = ("--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens")
    assert [value_after(cmd, f) for f in sizes] == ["0.92", "128", "8192"]
    cmd = sglang.command()
    assert value_after(cmd, "--attention-backend") == "triton"
    assert value_after(cmd, "--speculative-draft-attention-backend") == "triton"
    assert value_after(cmd, "--kv-cache-dtype") == value_after(cmd, "--speculative-draft-kv-cache-dtype") == "fp8_e4m3"
    sizes = ("--mem-fraction-static", "--max-running-requests", "--chunked-prefill-size")
    assert [value_after(cmd, f) for f in sizes] == ["0.92", "128", "8192"]
    assert "--enable-expert-parallel" not in vllm.command() and "--ep-size" not in cmd  # opt-ins stay off


def test_vllm_attention_backend_in_serving_env_is_refused_naming_the_variable():
    (problem,) = config("vllm", env={"VLLM_ATTENTION_BACKEND": "TRITON_MLA"}).problems()
    assert problem.startswith("serving_env: VLLM_ATTENTION_BACKEND is said by serving_attention_backend")
    assert "--attention-backend" in problem


@pytest.mark.parametrize(("engine", "args", "owner"), [
    ("vllm", ["--speculative-config.attention_backend=TRITON_MLA"], "serving_draft_attention_backend"),
    ("vllm", ["-sc", "{}"], "serving_speculative_method"),
    ("vllm", ["--kv-cache-dtype", "fp8"], "serving_kv_cache_dtype"),
    ("vllm", ["--max-num-seqs", "8"], "serving_max_running_requests"),
    ("sglang", ["--mem-fraction-static=0.8"], "serving_gpu_memory_fraction"),
    ("sglang", ["--ep", "8"], "serving_expert_parallel"),
])  # fmt: skip
def test_a_flag_a_variable_owns_is_refused_in_extra_args(engine, args, owner):
    (problem,) = config(engine, extra_args=args).problems()
    assert problem.startswith(f"serving_extra_args: {args[0].split('=')[0]} is said by") and owner in problem


def test_flags_no_variable_owns_still_pass_through():
    assert config("vllm", extra_args=["--enforce-eager", "--seed", "0"]).problems() == []


def test_kv_cache_dtype_is_one_value_translated_and_refused_where_an_engine_lacks_it():
    assert (
        engine_words.kv_cache_dtype("vllm", "fp8") == "fp8"
        and engine_words.kv_cache_dtype("sglang", "fp8") == "fp8_e4m3"
    )
    assert engine_words.kv_cache_dtype("sglang", "bf16", draft=True) == "bf16"
    (problem,) = config("sglang", kv_cache_dtype="fp8_inc").problems()
    assert problem.startswith("serving_kv_cache_dtype='fp8_inc': SGLang has no such KV-cache dtype (its own: auto,")
    (problem,) = config("vllm", kv_cache_dtype="mxfp8").problems()
    assert "vLLM has no such KV-cache dtype" in problem and "fp8_e4m3" in problem
    (problem,) = config("sglang", speculative_method="eagle3", draft_kv_cache_dtype="nvfp4").problems()
    assert problem.startswith("serving_draft_kv_cache_dtype='nvfp4': SGLang has no such draft KV-cache dtype")


def test_draft_settings_without_a_drafter_are_refused():
    (problem,) = config("vllm", speculative_method="none", draft_attention_backend="TRITON_MLA").problems()
    assert "apply to the drafter" in problem


def test_the_attention_backend_takes_vllms_names_in_any_case_and_sglangs_draft_list():
    cmd = config("vllm", attention_backend="triton_mla").command()
    assert value_after(cmd, "--attention-backend") == "TRITON_MLA"  # vLLM upper-cases it too
    (problem,) = config("sglang", draft_attention_backend="flashmla").problems()  # a target backend, not a draft one
    assert problem.startswith("serving_draft_attention_backend='flashmla': SGLang has no such draft attention backend")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_each_opt_in_renders_in_the_engines_words(engine):
    cfg = config(engine, tensor_parallel_size=8, expert_parallel=True, encoder_tp_mode="data", language_model_only=True,
                 pcie_allreduce=True)  # fmt: skip
    cmd, env = cfg.command(), cfg.environment()
    if engine == "vllm":
        assert "--enable-expert-parallel" in cmd and value_after(cmd, "--mm-encoder-tp-mode") == "data"
        assert env["VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"] == "1"
    else:
        assert value_after(cmd, "--ep-size") == "8" and "--mm-enable-dp-encoder" in cmd
        assert env["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
        assert "--no-mm-enable-dp-encoder" in config(engine, encoder_tp_mode="weights").command()
    assert "--language-model-only" in cmd
    assert cfg.digest() != config(engine, tensor_parallel_size=8).digest()


def test_a_deployment_from_before_the_recipe_keeps_its_digest():
    """At their defaults the recipe's knobs are out of the digest: upgrading specdeploy restarts nothing."""
    plain = config("vllm")
    fields = {k: getattr(plain, k) for k in ("kv_cache_dtype", "gpu_memory_fraction", "pcie_allreduce")}
    assert fields == {"kv_cache_dtype": "", "gpu_memory_fraction": None, "pcie_allreduce": False}
    assert config("vllm", gpu_memory_fraction=0).digest() == plain.digest()
    assert config("vllm", gpu_memory_fraction=0.9).digest() != plain.digest()
