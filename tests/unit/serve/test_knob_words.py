"""Each knob carries its engines' words (specdeploy.serve.schema, Knob.add_engine): the flags it renders,
the flags it owns, the opt-ins it sets, all read from the declaration. Rendering from it changed no
command, environment, problem or digest of the code that said each flag by hand (issue 34)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from specdeploy.serve import generate, schema
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.knob import Knob, flag

BASE = {"image": "i", "model_path": "/m", "served_model_name": "m"}
PCIE = {"env": {"NCCL_P2P_DISABLE": "1"}, "vllm_args": ["--disable-custom-all-reduce"],
        "sglang_args": ["--disable-custom-all-reduce"], "reason": "r"}  # fmt: skip
# Every knob that feeds the engine, away from its default.
ONE: dict[str, Any] = {
    "tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 4096, "speculative_method": "none",
    "num_speculative_tokens": 5, "extra_args": ["--seed", "1"], "env": {"A": "b"}, "volumes": {"/h": "/c"},
    "port": 9000, "bind_address": "0.0.0.0", "api_key": "sk", "gpus": "device_requests", "ipc_mode": "private",
    "shm_size": "2g", "memlock_bytes": 1024, "stack_bytes": 2048, "nccl": PCIE, "trust_remote_code": True,
    "tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2", "attention_backend": "TRITON_MLA",
    "draft_attention_backend": "triton", "kv_cache_dtype": "fp8", "draft_kv_cache_dtype": "bf16",
    "expert_parallel": True, "gpu_memory_fraction": 0.9, "max_batched_tokens": 8192, "max_running_requests": 64,
    "encoder_tp_mode": "data", "language_model_only": True, "pcie_allreduce": True, "drain_timeout": 30,
    "nnodes": 2, "node_rank": 1, "master_addr": "10.0.0.1", "master_port": 29600, "multi_node": "data_parallel",
    "load_format": "fastsafetensors", "page_cache_warmed": True,
}  # fmt: skip


def every(engine: str) -> dict[str, Any]:
    """Every knob on at once, on one host, with the drafter, in ENGINE's words."""
    backend = "TRITON_MLA" if engine == "vllm" else "triton"
    on = {k: v for k, v in ONE.items() if k not in ("speculative_method", "nnodes", "node_rank", "multi_node")}
    return {**on, "attention_backend": backend, "draft_attention_backend": backend}


def config(engine: str, **fields: Any) -> ServingConfig:
    return ServingConfig.from_vars({**BASE, "engine": engine, **fields})


def matrix() -> list[dict[str, Any]]:
    """Both engines: each knob alone, all of them, multi-node, bad words, and every flag once owned in extra args."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for engine in ("vllm", "sglang"):
        cases += [(engine, {}), (engine, {"encoder_tp_mode": "weights"}), (engine, every(engine))]
        cases += [(engine, {k: v}) for k, v in ONE.items()]
        cases += [(engine, {"nnodes": 2, "node_rank": rank, "master_addr": "10.0.0.1", "multi_node": mode})
                  for rank in (0, 1) for mode in ("model_parallel", "data_parallel")]  # fmt: skip
        cases.append((engine, {"kv_cache_dtype": "fp8_inc", "draft_kv_cache_dtype": "nvfp4", "attention_backend": "x"}))
        cases.append((engine, {"env": dict.fromkeys([*OWNED_ENV_BEFORE, "VLLM_X"], "1")}))
        flags = sorted({f for table in OWNED_FLAGS_BEFORE.values() for f in table} | {"--enforce-eager", "-O3"})
        cases += [(engine, {"extra_args": [f, "x"]}) for f in flags]
    out = []
    for engine, fields in cases:
        cfg = config(engine, **fields)
        out.append({"command": cfg.command(), "env": cfg.environment(), "problems": cfg.problems(),
                    "digest": cfg.digest(), "baseline": cfg.baseline_digest()})  # fmt: skip
    return out


# Computed with the code before issue 34 (each flag said by hand in ServingConfig) for the same matrix.
MATRIX_BEFORE = "sha256:095b00a7d7382a62b8cff7f68b759738a9eecfe0a0b3442c5c2b0fd8d2963a72"
EVERY_BEFORE = {
    "vllm": ["vllm", "serve", "/models/target", "--served-model-name", "m", "--host", "0.0.0.0", "--port", "9000",
        "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--max-model-len", "4096",
        "--speculative-config",
        ('{"method":"eagle3","model":"/opt/drafter","num_speculative_tokens":5,"draft_tensor_parallel_size":1,'
         '"attention_backend":"TRITON_MLA","kv_cache_dtype":"bfloat16"}'),
        "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2", "--shutdown-timeout", "30",
        "--attention-backend", "TRITON_MLA", "--kv-cache-dtype", "fp8", "--enable-expert-parallel",
        "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "8192", "--max-num-seqs", "64",
        "--mm-encoder-tp-mode", "data", "--language-model-only", "--trust-remote-code", "--reasoning-parser",
        "kimi_k2", "--load-format", "fastsafetensors", "--disable-custom-all-reduce", "--seed", "1"],
    "sglang": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/target", "--served-model-name", "m",
        "--host", "0.0.0.0", "--port", "9000", "--tp-size", "8", "--pp-size", "2", "--context-length", "4096",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/opt/drafter",
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6",
        "--tool-call-parser", "kimi_k2", "--attention-backend", "triton", "--speculative-draft-attention-backend",
        "triton", "--speculative-draft-kv-cache-dtype", "bf16", "--kv-cache-dtype", "fp8_e4m3", "--ep-size", "8",
        "--mem-fraction-static", "0.9", "--chunked-prefill-size", "8192", "--max-running-requests", "64",
        "--mm-enable-dp-encoder", "--language-model-only", "--trust-remote-code", "--reasoning-parser", "kimi_k2",
        "--load-format", "fastsafetensors", "--model-loader-extra-config", '{"enable_gds":false}',
        "--disable-custom-all-reduce", "--seed", "1"],
}  # fmt: skip
# engine_words.OWNED_FLAGS and OWNED_ENV as they were kept by hand before issue 34.
_SPEC = ("serving_speculative_method, serving_num_speculative_tokens, serving_draft_attention_backend, "
         "serving_draft_kv_cache_dtype")  # fmt: skip
OWNED_FLAGS_BEFORE = {
    "vllm": {
        "--speculative-config": _SPEC, "-sc": _SPEC, "--attention-backend": "serving_attention_backend",
        "--attention-config": "serving_attention_backend", "-ac": "serving_attention_backend",
        "--kv-cache-dtype": "serving_kv_cache_dtype", "--enable-expert-parallel": "serving_expert_parallel",
        "-ep": "serving_expert_parallel", "--gpu-memory-utilization": "serving_gpu_memory_fraction",
        "--max-num-batched-tokens": "serving_max_batched_tokens", "--max-num-seqs": "serving_max_running_requests",
        "--mm-encoder-tp-mode": "serving_encoder_tp_mode", "--language-model-only": "serving_language_model_only",
        "--tensor-parallel-size": "serving_tensor_parallel_size", "--max-model-len": "serving_max_model_len",
        "--load-format": "serving_load_format",
    },
    "sglang": {
        "--speculative-algorithm": "serving_speculative_method",
        "--speculative-draft-model-path": "serving_speculative_method (the baked-in drafter)",
        "--speculative-num-steps": "serving_num_speculative_tokens",
        "--speculative-num-draft-tokens": "serving_num_speculative_tokens",
        "--speculative-eagle-topk": "serving_num_speculative_tokens (a chain: top-k 1)",
        "--attention-backend": "serving_attention_backend",
        "--speculative-draft-attention-backend": "serving_draft_attention_backend",
        "--kv-cache-dtype": "serving_kv_cache_dtype",
        "--speculative-draft-kv-cache-dtype": "serving_draft_kv_cache_dtype", "--ep-size": "serving_expert_parallel",
        "--expert-parallel-size": "serving_expert_parallel", "--ep": "serving_expert_parallel",
        "--mem-fraction-static": "serving_gpu_memory_fraction", "--chunked-prefill-size": "serving_max_batched_tokens",
        "--max-running-requests": "serving_max_running_requests", "--mm-enable-dp-encoder": "serving_encoder_tp_mode",
        "--no-mm-enable-dp-encoder": "serving_encoder_tp_mode", "--language-model-only": "serving_language_model_only",
        "--tp-size": "serving_tensor_parallel_size", "--context-length": "serving_max_model_len",
        "--load-format": "serving_load_format",
    },
}  # fmt: skip
OWNED_ENV_BEFORE = {
    "VLLM_ATTENTION_BACKEND": "serving_attention_backend (vLLM 0.33 reads no such variable: --attention-backend)",
    "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "serving_pcie_allreduce",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "serving_pcie_allreduce",
}


# Knobs declared after issue 34 that only add an owner to a flag's refusal (vLLM's --speculative-config):
# their name is the one difference from the hand-written code, taken out before the comparison.
LATER_OWNERS = (", serving_speculative_schedule",)


def test_every_knob_renders_both_engines_as_the_hand_written_code_did():
    rendered = json.dumps(matrix(), sort_keys=True)
    for later in LATER_OWNERS:
        assert later in rendered  # (still there: else this allowance hides nothing and goes)
        rendered = rendered.replace(later, "")
    assert "sha256:" + hashlib.sha256(rendered.encode()).hexdigest() == MATRIX_BEFORE
    for engine, command in EVERY_BEFORE.items():
        cfg = config(engine, **every(engine))
        assert cfg.problems() == [] and cfg.command() == command


def test_the_owned_flags_are_the_hand_kept_tables_read_from_the_declaration():
    """A knob added since owns its flags too: the tables may grow, never change what they said."""
    for engine, before in OWNED_FLAGS_BEFORE.items():
        now = {f: schema.OWNED_FLAGS[engine][f] for f in before}
        for later in LATER_OWNERS:  # a later knob's name added to a flag's owners, nothing else changed
            now = {f: owners.replace(later, "") for f, owners in now.items()}
        assert now == before
    assert {name: schema.OWNED_ENV[name] for name in OWNED_ENV_BEFORE} == OWNED_ENV_BEFORE


SWITCHES = [(knob, engine) for knob in schema.KNOBS if knob.type == "bool" for engine in schema.ENGINES
            if any(w.renders_flag or w.env for w in knob.words(engine))]  # fmt: skip


@pytest.mark.parametrize(("knob", "engine"), SWITCHES, ids=[f"{k.name}-{e}" for k, e in SWITCHES])
def test_each_switch_renders_its_words_only_when_on_and_owns_its_flags(knob: Knob, engine: str):
    assert knob.field and knob.late  # at its default out of the digest: adding it restarts no engine
    off, on = config(engine, tensor_parallel_size=2), config(engine, tensor_parallel_size=2, **{knob.field: True})
    assert on.problems() == [] and on.digest() != off.digest()
    for said in knob.words(engine):
        if said.env:
            assert on.environment()[said.env] == "1" and said.env not in off.environment()
            assert schema.OWNED_ENV[said.env] == knob.variable
            continue
        args = said.args(True, on)
        assert args and args[0] not in off.command()
        at = on.command().index(args[0])
        assert on.command()[at : at + len(args)] == args
        for owned in said.owned:
            (problem,) = config(engine, extra_args=[owned]).problems()
            assert problem.startswith(f"serving_extra_args: {owned} is said by") and knob.variable in problem


def test_a_knob_only_one_engine_has_is_refused_on_the_other_not_dropped():
    only_vllm = Knob("x", "bool", False, "x", field="language_model_only").add_engine("vllm", flag("--x"))
    sglang = config("sglang", language_model_only=True)
    (problem,) = schema.unsaid_problems("sglang", sglang, [only_vllm])
    assert problem == "serving_x=True: sglang has no such setting (only vllm); leave it unset"
    assert schema.unsaid_problems("sglang", config("sglang"), [only_vllm]) == []
    assert schema.unsaid_problems("vllm", sglang, [only_vllm]) == []


def test_the_generated_fields_are_servingconfigs_and_the_docs_table_names_every_owned_flag():
    assert "class KnobFields:" in generate.render_fields()
    table = generate.render_table()
    for engine in schema.ENGINES:
        for owned in schema.OWNED_FLAGS[engine]:
            assert f"`{owned}`" in table, owned
    with pytest.raises(ValueError, match="no generated table"):
        generate.docs_page("# a page without the table\n")
