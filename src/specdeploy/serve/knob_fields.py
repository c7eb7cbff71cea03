"""ServingConfig's fields: one per knob that feeds the engine, typed and defaulted as its declaration
(specdeploy.serve.schema) says; ServingConfig (specdeploy.serve.config) adds what is not a knob.

Generated from src/specdeploy/serve/schema.py by `make generate`: edit the declaration, not this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KnobFields:
    # vllm or sglang (default: from engine_image_profile).
    engine: str
    # Image tag on the host (default: the build phase's engine_image_tag).
    image: str
    # The model folder on the host, mounted read-only.
    model_path: str
    # The model name the API lists.
    served_model_name: str
    # Tensor-parallel size.
    tensor_parallel_size: int = 1
    # Pipeline-parallel size.
    pipeline_parallel_size: int = 1
    # Max model length; 0 is the engine's default.
    max_model_len: int | None = None
    # eagle3 (the baked-in drafter) or none.
    speculative_method: str = "eagle3"
    # Speculative tokens per step.
    num_speculative_tokens: int = 3
    # Draft length per batch size: "", auto (measured by the gate), or ranges [[1, 4, 3], [5, 256, 0]].
    speculative_schedule: str = ""
    # Extra engine arguments.
    extra_args: tuple[str, ...] = ()
    # Extra environment for the engine.
    env: dict[str, str] = field(default_factory=dict)
    # Extra read-only mounts (host path to container path).
    volumes: dict[str, str] = field(default_factory=dict)
    # API port.
    port: int = 8000
    # Host address the API port binds; off loopback needs serving_api_key.
    bind_address: str = "127.0.0.1"
    # API key (ansible-vault); required off loopback.
    api_key: str | None = None
    # GPU access: cdi, device_requests or none.
    gpus: str = "cdi"
    # IPC namespace of the engine; shm size applies when not host.
    ipc_mode: str = "host"
    # Shared memory size.
    shm_size: str = "16g"
    # memlock ulimit of the engine (-1 unlimited; raising it needs CAP_SYS_RESOURCE).
    memlock_bytes: int = -1
    # stack ulimit of the engine.
    stack_bytes: int = 67108864
    # The GPU peer-to-peer verdict (env, vllm_args, sglang_args, reason); default: preflight's.
    nccl: dict[str, Any] = field(default_factory=dict)
    # --trust-remote-code (models with custom code in config.json auto_map, e.g. Kimi-K2.5).
    trust_remote_code: bool = False
    # The engine's tool-call parser (kimi_k2 for Kimi-K2.5); empty for none.
    tool_call_parser: str = ""
    # The engine's reasoning parser (kimi_k2 for Kimi-K2.5); empty for none.
    reasoning_parser: str = ""
    # The target's attention backend in the engine's words (SM120: vLLM TRITON_MLA, SGLang triton).
    attention_backend: str = ""
    # The drafter's attention backend in the engine's words; empty for the engine's choice.
    draft_attention_backend: str = ""
    # KV-cache dtype, one value for both engines (fp8 is fp8_e4m3 in SGLang's words); empty for auto.
    kv_cache_dtype: str = ""
    # The drafter's KV-cache dtype; empty for the target's.
    draft_kv_cache_dtype: str = ""
    # Expert parallelism over the tensor-parallel ranks (vLLM --enable-expert-parallel, SGLang --ep-size).
    expert_parallel: bool = False
    # GPU memory the engine may take, a fraction (--gpu-memory-utilization, --mem-fraction-static); 0: default.
    gpu_memory_fraction: float | None = None
    # Tokens one step takes (--max-num-batched-tokens, SGLang --chunked-prefill-size); 0: default.
    max_batched_tokens: int | None = None
    # Requests served at once (vLLM --max-num-seqs, SGLang --max-running-requests); 0 for the engine's default.
    max_running_requests: int | None = None
    # The vision encoder under TP: weights (sharded) or data (a copy per rank); empty for the engine's default.
    encoder_tp_mode: str = ""
    # Serve the language model only, no vision encoder (SGLang admits some architectures, not Kimi-K2.5's).
    language_model_only: bool = False
    # FlashInfer's PCIe IPC all-reduce for TP 2/4/8 (an opt-in of both engines, by environment).
    pcie_allreduce: bool = False
    # Seconds a stopped engine may finish in-flight requests (vLLM --shutdown-timeout); 0 for none.
    drain_timeout: int = 0
    # Hosts one model spans (the engine's multi-node launch; 1 for one host).
    nnodes: int = 1
    # This host's rank among serving_nnodes (0 serves the API).
    node_rank: int = 0
    # Rank 0's address, reachable from every rank (serving_nnodes > 1).
    master_addr: str = ""
    # The ranks' rendezvous port on rank 0.
    master_port: int = 29501
    # How serving_nnodes > 1 spreads the engine: model_parallel or data_parallel (vLLM).
    multi_node: str = "model_parallel"
    # The weight loader (--load-format); empty for the engine's default. Its package is baked into the image.
    load_format: str = ""
    # Read the model into the page cache while the old engine serves (all of it, or its first shards up to the bound).
    page_cache_warmed: bool = False
