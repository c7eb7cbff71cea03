"""The serving interface, declared once: every variable of roles/serving with its type, default,
allowed values, secrecy, one-line doc and rule, and, for one that feeds the engine, each engine's
words for it (Knob.add_engine: the flag, speculative-config key or environment variable).

Everything else follows from KNOBS: the role's defaults/main.yml and meta/argument_specs.yml,
ServingConfig's fields (specdeploy.serve.knob_fields) and the docs' table of engine words are
generated from it (`make generate`, specdeploy.serve.generate; `make lint` fails on drift); the role
hands its serving_* variables to ServingConfig by it (collect()); ServingConfig takes its defaults,
coercions, single-value rules and simple flags from it; and the flags a knob owns, refused in
serving_extra_args, are read from it (OWNED_FLAGS). A new engine flag is one entry here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from specdeploy import draft_schedule, names
from specdeploy.gate import prompt_file
from specdeploy.gpu import p2p
from specdeploy.serve import engine_words as words
from specdeploy.serve import loaders
from specdeploy.serve.engine_words import ENCODER_TP_MODES, PCIE_ALLREDUCE_ENV
from specdeploy.serve.knob import (
    REQUIRED,
    UNSET,
    Knob,
    Words,
    env_var,
    flag,
    flag_by_value,
    rendered_by_config,
    speculative_key,
)
from specdeploy.serve.rules import (
    Check,
    absolute_path,
    argument_list,
    backend_name,
    boolean,
    choice,
    environment,
    integer,
    ip_address,
    name,
    number,
    parser_name,
    seconds,
    size,
    sweep_levels,
    volumes,
)

ENGINES = ("vllm", "sglang")
GPU_ACCESS = ("cdi", "device_requests", "none")
SPECULATIVE_METHODS = ("eagle3", "none")
IPC_MODES = ("host", "private", "shareable")
# How serving_nnodes > 1 spreads one engine: its tensor x pipeline stages over the hosts, or one
# whole replica per host behind rank 0's API (vLLM's data-parallel launch, --headless on the others).
MULTI_NODE_MODES = ("model_parallel", "data_parallel")


def _engine(name: str, type_: str, default: Any, doc: str, rule: Check | None = None, **more: Any) -> Knob:
    """A knob that is a ServingConfig field of the same name (unless `field` says otherwise)."""
    return Knob(name, type_, default, doc, rule, more.pop("field", name), **more)


def _role(name: str, type_: str, default: Any, doc: str, rule: Check | None = None, **more: Any) -> Knob:
    return Knob(name, type_, default, doc, rule, None, **more)


def _optional_ip(value: Any) -> str | None:
    return None if value in ("", None) else ip_address(value)


def _loader(value: Any) -> str | None:
    if value in ("", None) or value in loaders.LOADERS:
        return None
    return f"empty (the engine's default) or one of {', '.join(loaders.LOADERS)}"


def _p2p_mode(value: Any) -> str | None:
    return choice(p2p.MODES)(p2p.mode(value))


KNOBS: tuple[Knob, ...] = (
    # The profile's engine is a fact of the profile (specdeploy.engine_image.profiles), through a filter.
    _engine("engine", "str",
            f"{{{{ engine_image_profile | default('{names.DEFAULT_PROFILE}') | specdeploy_profile('engine') }}}}",
            "vllm or sglang (default: from engine_image_profile).", choices=ENGINES),
    _engine("image", "str", "{{ engine_image_tag | default('') }}",
            "Image tag on the host (default: the build phase's engine_image_tag).",
            note="The image the build phase produced (the engine_image role sets engine_image_tag)."),
    # A config built by hand names its model (ServingConfig has no default for these two).
    _engine("model_path", "path", names.MODEL_PATH, "The model folder on the host, mounted read-only.",
            absolute_path, note="The model folder on the host; mounted read-only.", built=REQUIRED),
    _engine("served_model_name", "str", "model", "The model name the API lists.", name, built=REQUIRED),
    _engine("tensor_parallel_size", "int", 1, "Tensor-parallel size.", integer(1, 64))
    .add_engine("vllm", rendered_by_config("--tensor-parallel-size"))
    .add_engine("sglang", rendered_by_config("--tp-size")),
    _engine("pipeline_parallel_size", "int", 1, "Pipeline-parallel size.", integer(1, 64)),
    _engine("max_model_len", "int", 0, "Max model length; 0 is the engine's default.", integer(0),
            aside="0: the engine's default (the model's)", optional=True)
    .add_engine("vllm", rendered_by_config("--max-model-len"))
    .add_engine("sglang", rendered_by_config("--context-length")),
    # vLLM keeps only the last --speculative-config: every knob it carries owns it.
    _engine("speculative_method", "str", "eagle3", "eagle3 (the baked-in drafter) or none.",
            choices=SPECULATIVE_METHODS)
    .add_engine("vllm", rendered_by_config(*words.VLLM_SPECULATIVE_FLAGS, doc="its `method`"))
    .add_engine("sglang", rendered_by_config("--speculative-algorithm"))
    .add_engine("sglang", rendered_by_config("--speculative-draft-model-path", note="the baked-in drafter")),
    _engine("num_speculative_tokens", "int", 3, "Speculative tokens per step.", integer(1, 16))
    .add_engine("vllm", rendered_by_config(*words.VLLM_SPECULATIVE_FLAGS, doc="its `num_speculative_tokens`"))
    .add_engine("sglang", rendered_by_config("--speculative-num-steps", "--speculative-num-draft-tokens"))
    .add_engine("sglang", rendered_by_config("--speculative-eagle-topk", note="a chain: top-k 1")),
    # A length per batch size (specdeploy.draft_schedule). Late: the digest of every existing deployment
    # stays as it was while it is "".
    _engine("speculative_schedule", "raw", "",
            "Draft length per batch size: \"\", auto (measured by the gate), or ranges [[1, 4, 3], [5, 256, 0]].",
            draft_schedule.problem, late=True, coerce=draft_schedule.canonical, py_type="str",
            note="Draft tokens per batch size (specdeploy.draft_schedule): \"\" keeps serving_num_speculative_tokens\n"
                 "at every batch size; explicit inclusive ranges [start, end, length] (0: no drafts there; a gap\n"
                 "takes the range before it, sizes past the last take the last; lengths at most\n"
                 "serving_num_speculative_tokens); auto: the gate measures each length from 0 to\n"
                 "serving_num_speculative_tokens at each serving_bench_sweep level, picks the fastest for each range,\n"
                 "then proves the schedule against the speculation-off baseline (serving_bench_baseline: once).")
    .add_engine("vllm", speculative_key("num_speculative_tokens_per_batch_size", draft_schedule.vllm_words)),
    _engine("extra_args", "list", [], "Extra engine arguments.", argument_list),
    _engine("env", "dict", {}, "Extra environment for the engine.", environment),
    _engine("volumes", "dict", {}, "Extra read-only mounts (host path to container path).", volumes,
            note="Extra read-only mounts, host path: container path."),
    _engine("port", "int", names.SERVING_PORT, "API port.", integer(1, 65535)),
    _engine("bind_address", "str", "127.0.0.1", "Host address the API port binds; off loopback needs serving_api_key.",
            ip_address, note="127.0.0.1: reach it through SSH (ssh -L). Anything else requires serving_api_key."),
    # Checked with the bind address (ServingConfig.problems), never shown: no single-value rule.
    _engine("api_key", "str", "", "API key (ansible-vault); required off loopback.", no_log=True,
            note="From ansible-vault (ansible-vault encrypt_string --name serving_api_key); never logged.",
            optional=True),
    _engine("gpus", "str", "cdi", "GPU access: cdi, device_requests or none.", choices=GPU_ACCESS,
            note="cdi (nvidia.com/gpu=all; Container Toolkit >= 1.18), device_requests (--gpus all), none (CPU)."),
    # host: NCCL and the engines' shared-memory queues use the host's /dev/shm (sized by the host);
    # private: the container's own /dev/shm of shm_size (docker ignores shm_size with ipc=host).
    _engine("ipc_mode", "str", "host", "IPC namespace of the engine; shm size applies when not host.",
            choices=IPC_MODES,
            note="host: the host's /dev/shm (NCCL, the engines' shm queues); private: its own, of serving_shm_size."),
    _engine("shm_size", "str", "16g", "Shared memory size.", size),
    # Raising memlock needs CAP_SYS_RESOURCE on the host's container engine; the test bed has none,
    # so its inventory keeps the host's limit.
    _engine("memlock_bytes", "int", -1,
            "memlock ulimit of the engine (-1 unlimited; raising it needs CAP_SYS_RESOURCE).", integer(-1),
            note="-1: unlimited memlock (pinned memory); the stack as NVIDIA's containers recommend (64 MiB)."),
    _engine("stack_bytes", "int", 64 * 1024**2, "stack ulimit of the engine.", integer(1)),
    _role("iommu_acs_fixed", "bool", False, "The host's IOMMU/ACS is fixed: keep NCCL P2P on PCIe hosts.", boolean,
          note="PCIe-only hosts with >2 GPUs: NCCL P2P off and custom all-reduce off unless the host's\n"
               "IOMMU/ACS is fixed: iommu=pt or off on the kernel command line (preflight reads it), or ACS\n"
               "disabled, which only the operator knows: say so with serving_iommu_acs_fixed: true."),
    # Or serving_p2p's override of the verdict (collect()), applied as given: the rule lives there once.
    # {}: no GPUs were read.
    _engine("nccl", "dict", "{{ preflight_nccl | default({}) }}",
            "The GPU peer-to-peer verdict (env, vllm_args, sglang_args, reason); default: preflight's.",
            note="The engine's peer-to-peer settings: preflight's verdict (specdeploy.gpu.checks), applied as given.",
            coerce=lambda value: dict(value or {}), py_type="dict[str, Any]", built={}),
    # Not a field: collect() applies it to nccl, so the engine's flags and the digest follow what it gives.
    _role("p2p", "str", "auto", "GPU peer-to-peer: auto takes serving_nccl; on or off is the operator's override.",
          _p2p_mode, choices=p2p.MODES,
          note="The operator's word on GPU peer-to-peer over serving_nccl (specdeploy.gpu.p2p.override): auto\n"
               "applies the verdict as given; off: NCCL through host memory (NCCL_P2P_DISABLE=1) and custom\n"
               "all-reduce off; on: no P2P flags at all, whatever the verdict."),
    _engine("trust_remote_code", "bool", False,
            "--trust-remote-code (models with custom code in config.json auto_map, e.g. Kimi-K2.5).", boolean,
            note="Models that ship custom code (config.json auto_map, e.g. Kimi-K2.5) need it trusted; preflight\n"
                 "warns when a model has auto_map and this is false. Parsers: as the engines register them (kimi_k2)."),
    _engine("tool_call_parser", "str", "", "The engine's tool-call parser (kimi_k2 for Kimi-K2.5); empty for none.",
            parser_name),
    _engine("reasoning_parser", "str", "", "The engine's reasoning parser (kimi_k2 for Kimi-K2.5); empty for none.",
            parser_name),
    # The SM120 recipe (docs/serve.md#the-recipe-for-sm120), each value in the pinned engine's own words
    # (specdeploy.serve.engine_words holds them, read from the releases) and refused before any host is touched.
    # vLLM's --attention-backend sits with the recipe's flags; SGLang's beside its draft backend, as it
    # served on the H200.
    _engine("attention_backend", "str", "",
            "The target's attention backend in the engine's words (SM120: vLLM TRITON_MLA, SGLang triton).",
            backend_name,
            note="The target's and the drafter's attention backends, each in the engine's own words: vLLM's\n"
                 "AttentionBackendEnum (TRITON_MLA on SM120: --attention-backend, and the speculative config's\n"
                 "attention_backend: the drafter never inherits the target's), SGLang's --attention-backend and\n"
                 "--speculative-draft-attention-backend (triton on SM120: sglang-kernel's FA3 and FlashMLA carry\n"
                 "no sm_120 code). Empty: the engine's choice.")
    .add_engine("vllm", flag("--attention-backend", "--attention-config", "-ac",
                             say=lambda value: words.attention_backend("vllm", value),
                             doc="AttentionBackendEnum"))
    .add_engine("sglang", rendered_by_config("--attention-backend")),
    _engine("draft_attention_backend", "str", "",
            "The drafter's attention backend in the engine's words; empty for the engine's choice.", backend_name)
    .add_engine("vllm", speculative_key("attention_backend",
                                        lambda value: words.attention_backend("vllm", value, True)))
    .add_engine("sglang", rendered_by_config("--speculative-draft-attention-backend")),
    _engine("kv_cache_dtype", "str", "",
            "KV-cache dtype, one value for both engines (fp8 is fp8_e4m3 in SGLang's words); empty for auto.",
            backend_name, late=True,
            note="KV-cache dtype of the target and of the drafter (vLLM's speculative config kv_cache_dtype,\n"
                 "SGLang's --speculative-draft-kv-cache-dtype; empty: the target's): one value, translated into\n"
                 "each engine's words (fp8 -> SGLang fp8_e4m3) and refused where the engine lacks it.")
    .add_engine("vllm", flag("--kv-cache-dtype", say=lambda value: words.kv_cache_dtype("vllm", value)))
    .add_engine("sglang", flag("--kv-cache-dtype", say=lambda value: words.kv_cache_dtype("sglang", value),
                               doc="`fp8` said as `fp8_e4m3`")),
    _engine("draft_kv_cache_dtype", "str", "", "The drafter's KV-cache dtype; empty for the target's.",
            backend_name, late=True)
    .add_engine("vllm", speculative_key("kv_cache_dtype", lambda value: words.kv_cache_dtype("vllm", value, True)))
    .add_engine("sglang", rendered_by_config("--speculative-draft-kv-cache-dtype")),
    _engine("expert_parallel", "bool", False,
            "Expert parallelism over the tensor-parallel ranks (vLLM --enable-expert-parallel, SGLang --ep-size).",
            boolean, late=True)
    .add_engine("vllm", flag("--enable-expert-parallel", "-ep"))
    .add_engine("sglang", flag("--ep-size", "--expert-parallel-size", "--ep", value_of="tensor_parallel_size",
                               doc="= TP size")),
    _engine("gpu_memory_fraction", "float", 0,
            "GPU memory the engine may take, a fraction (--gpu-memory-utilization, --mem-fraction-static); 0: default.",
            number(0, 1), late=True, optional=True)
    .add_engine("vllm", flag("--gpu-memory-utilization", say=lambda value: f"{value:g}"))
    .add_engine("sglang", flag("--mem-fraction-static", say=lambda value: f"{value:g}")),
    _engine("max_batched_tokens", "int", 0,
            "Tokens one step takes (--max-num-batched-tokens, SGLang --chunked-prefill-size); 0: default.",
            integer(0), late=True, optional=True)
    .add_engine("vllm", flag("--max-num-batched-tokens"))
    .add_engine("sglang", flag("--chunked-prefill-size")),
    _engine("max_running_requests", "int", 0,
            "Requests served at once (vLLM --max-num-seqs, SGLang --max-running-requests); 0 for the engine's default.",
            integer(0), late=True, optional=True)
    .add_engine("vllm", flag("--max-num-seqs"))
    .add_engine("sglang", flag("--max-running-requests")),
    _engine("encoder_tp_mode", "str", "",
            "The vision encoder under TP: weights (sharded) or data (a copy per rank); empty for the engine's default.",
            late=True, choices=("", *ENCODER_TP_MODES))
    .add_engine("vllm", flag("--mm-encoder-tp-mode"))
    .add_engine("sglang", flag_by_value(data="--mm-enable-dp-encoder", weights="--no-mm-enable-dp-encoder")),
    _engine("language_model_only", "bool", False,
            "Serve the language model only, no vision encoder (SGLang admits some architectures, not Kimi-K2.5's).",
            boolean,
            late=True)
    .add_engine("vllm", flag("--language-model-only"))
    .add_engine("sglang", flag("--language-model-only")),
    _engine("pcie_allreduce", "bool", False,
            "FlashInfer's PCIe IPC all-reduce for TP 2/4/8 (an opt-in of both engines, by environment).",
            boolean, late=True)
    .add_engine("vllm", env_var(PCIE_ALLREDUCE_ENV["vllm"]))
    .add_engine("sglang", env_var(PCIE_ALLREDUCE_ENV["sglang"])),
    # A fleet host leaves the router first, so the drain's are the last requests it serves.
    _engine("drain_timeout", "int", 0,
            "Seconds a stopped engine may finish in-flight requests (vLLM --shutdown-timeout); 0 for none.",
            integer(0, 3600),
            note="Seconds a stopped engine may finish its in-flight requests (vLLM >= 0.18: --shutdown-timeout).\n"
                 "In a fleet the host leaves the router first, so no request is cut; 0: no drain."),
    # The engines' own multi-node launch (no Ray): its ranks talk on ports of their own choosing.
    _engine("nnodes", "int", 1, "Hosts one model spans (the engine's multi-node launch; 1 for one host).",
            integer(1, 64),
            note="One model across hosts (the engines' own multi-node launch; each host one rank, the same\n"
                 "tensor x pipeline sizes everywhere): hosts, this host's rank (0 serves the API; vLLM's others\n"
                 "run headless), and rank 0's address and rendezvous port. Runs the engine on the host's network."),
    _engine("node_rank", "int", 0, "This host's rank among serving_nnodes (0 serves the API).", integer(0, 63)),
    _engine("master_addr", "str", "", "Rank 0's address, reachable from every rank (serving_nnodes > 1).",
            _optional_ip),
    _engine("master_port", "int", 29501, "The ranks' rendezvous port on rank 0.", integer(1, 65535)),
    _engine("multi_node", "str", "model_parallel",
            "How serving_nnodes > 1 spreads the engine: model_parallel or data_parallel (vLLM).",
            choices=MULTI_NODE_MODES, late=True,
            note="model_parallel: the tensor x pipeline stages split over the hosts (--nnodes ...);\n"
                 "data_parallel: one whole replica per host behind rank 0's API (vLLM's --data-parallel-size\n"
                 "--data-parallel-address ..., --headless on the others), each replica proven by a completion."),
    _role("fleet_address", "str", UNSET, "The address the router reaches this engine at (default: ansible_host)."),
    _role("fleet_worker", "str",
          "{{ (serving_fleet_address | default(ansible_host) | default(inventory_hostname)) | "
          "specdeploy_worker_url(serving_port) }}",
          "Derived from serving_fleet_address and serving_port (the router's worker URL).",
          note="In a fleet: where the router and the sentinel reach this engine (serving_fleet_address, else\n"
               "ansible_host; derived, not an input)."),
    _engine("load_format", "str", "",
            "The weight loader (--load-format); empty for the engine's default. Its package is baked into the image.",
            _loader, late=True,
            note="The weight loader: \"\" (the engine's default), safetensors, fastsafetensors, instanttensor (GPU\n"
                 "only), runai_streamer, runai_streamer_sharded (vLLM only). The build bakes in the package a loader\n"
                 "needs (specdeploy.serve.loaders); an unsupported value is refused before any host is touched.")
    .add_engine("vllm", rendered_by_config("--load-format"))
    .add_engine("sglang", rendered_by_config("--load-format")),
    # ServingConfig.page_cache_warmed: a loader that would read past a warmed page cache is told not to.
    # A config built by hand has warmed nothing, so its default there is False, not the role's.
    _engine("warm_page_cache", "bool", True,
            "Read the model into the page cache while the old engine serves "
            "(all of it, or its first shards up to the bound).",
            boolean, field="page_cache_warmed", built=False,
            note="The prewarm (specdeploy.serve.prewarm) reads the model into the page cache while the old engine\n"
                 "serves: parallel readers (0: one per CPU, up to 16), in the engine's read order, up to\n"
                 "serving_prewarm_max_fraction of MemAvailable and, when > 0, serving_prewarm_max_gb; a larger model\n"
                 "is warmed from its first shard up to that bound, and the report says how much."),
    _role("prewarm_readers", "int", 0, "Parallel readers of the prewarm; 0 for one per CPU of the host, up to 16.",
          integer(0, 256)),
    _role("prewarm_max_fraction", "float", 0.5, "The most of MemAvailable the prewarm may fill (0.01 to 0.9).",
          number(0.01, 0.9)),
    _role("prewarm_max_gb", "float", 0, "A further bound on what the prewarm reads, in GiB; 0 for none.",
          number(0, 1_000_000)),
    _role("engine_cache", "bool", True,
          "Keep the engine's compile and JIT caches on the host, per image, for the next start.", boolean,
          note="The engine's caches (torch.compile, Triton, FlashInfer, SGLang's JIT kernels, CUDA's) in\n"
               "<serving_state_dir>/engine-cache/<engine>-<image digest>-<GPU architecture>, mounted into every\n"
               "engine container of that image (rollout, baseline, rollback, each rank): a restart skips the\n"
               "work (specdeploy.serve.engine_cache)."),
    _role("engine_cache_keep", "int", 3, "Image caches the host keeps, newest use first (the current one included).",
          integer(1, 100)),
    _role("engine_cache_max_gb", "float", 50, "The most GiB the host's engine caches may hold together.",
          number(0.1, 1_000_000)),
    _role("vmtouch_version", "str", "{{ 'serving_vmtouch_version' | specdeploy_pin }}",
          "The apt version of vmtouch (the prewarm's reader); from specdeploy/pins.yaml.",
          aside="specdeploy/pins.yaml"),
    _role("stall_timeout", "int", 300, "Seconds without progress before STALLED.", seconds(0)),
    _role("timeout", "int", 3600, "Seconds before the start-up is abandoned.", seconds(0)),
    _role("reconnect_grace", "int", 120,
          "Seconds without contact with the host that change no verdict (reconnects with backoff).", seconds(0),
          note="Seconds without contact with the host (SSH dropped, dockerd restarting) that change no verdict:\n"
               "the watch and the rollout reconnect with backoff meanwhile, and that time is not a stall."),
    _role("state_dir", "path", names.SERVING_STATE_DIR,
          "Where the host records the serving version and the rollout's state machine (rollout.json).", absolute_path),
    _role("bench", "bool", True,
          "Benchmark the new engine after READY, before promotion (the engine's own client in its container).",
          boolean,
          note="The benchmark gate (specdeploy.gate), between READY and promotion: the engine's own client (vLLM's\n"
               "`vllm bench serve`, SGLang's `sglang.benchmark.serving`) in the\n"
               "new engine's container, the shipped prompt set through its chat template, then a comparison with\n"
               "the last promoted version on this host and hardware. A refusal is a FAILED rollout (rolled back).",
          aside="false: no benchmark at all"),
    _role("bench_gate", "bool", True,
          "Refuse (roll back) a version whose benchmark regressed; false measures and records only.", boolean,
          aside="false: measure and record, refuse nothing"),
    _role("bench_budget_s", "int", 60,
          "Seconds the benchmark may take, client start-up included; the tokens per request follow.", seconds(0),
          aside="the whole benchmark, client start-up included; the tokens per request follow"),
    _role("bench_concurrency", "int", 4, "Requests the benchmark keeps in flight.", integer(1, 1024)),
    _role("bench_max_tokens", "int", 256, "The most tokens per benchmark request (the budget may size fewer).",
          integer(8, 16384), aside="a ceiling per request"),
    _role("bench_min_acceptance_length", "float", 0, "The lowest mean acceptance length accepted (0 for no floor).",
          number(0, 64), aside="a floor for the mean acceptance length (0: none)"),
    _role("bench_max_regression", "float", 0.1,
          "The largest fall from the last promoted version's acceptance length or tokens/s (a fraction).",
          number(0.001, 0.999), aside="the largest fall from the last promoted version (a fraction)"),
    _role("bench_sweep", "list", [], "Concurrencies the new engine is also measured at, e.g. [1, 4, 16, 64].",
          sweep_levels,
          note="Does EAGLE-3 pay on this host? A concurrency sweep of the new engine on the same prompts and, with\n"
               "serving_bench_baseline: once, the same sweep of the same image and flags with speculation off,\n"
               "measured once per host, model, engine version and hardware and kept in the host's record (it costs\n"
               "one more start-up, while the host is out of service anyway). The verdict states the speed-up at each\n"
               "concurrency and up to where speculation pays; serving_bench_expected_concurrency > 0 refuses a\n"
               "version slower than the baseline there."),
    _role("bench_baseline", "str", "never", "never, or once: the speculation-off sweep, measured once and kept.",
          choices=("never", "once")),
    _role("bench_prompts", "str", "", "A JSONL file of your own prompts (on the controller) for the gate; empty: ours.",
          prompt_file.problem,
          note="Your own requests for the gate, its sweep and its baseline (specdeploy.gate.prompt_file): JSON\n"
               "Lines on the controller, one {\"messages\": [{role, content}, ...]} or {\"prompt\": \"...\"} a line,\n"
               "at least 4; a chat is sent as its last user message. Acceptance depends on the traffic: the\n"
               "verdict and the acceptance per position are then your prompts'. Empty: the shipped set."),
    _role("bench_expected_concurrency", "int", 0,
          "Refuse a version slower than the baseline at this concurrency (0: say, refuse nothing).", integer(0, 4096)),
)  # fmt: skip

BY_VARIABLE: dict[str, Knob] = {k.variable: k for k in KNOBS}
BY_FIELD: dict[str, Knob] = {k.field: k for k in KNOBS if k.field}
RULES: dict[str, Check] = {k.variable: k.check for k in KNOBS if k.check}
# ServingConfig's defaults: the role's, as the field holds them (max_model_len 0 -> None, api_key "" -> None).
FIELD_DEFAULTS: dict[str, Any] = {
    k.field: k.to_field(k.default) for k in KNOBS if k.field and not k.derived and k.default is not UNSET
}
DIGEST_SKIPS_AT_DEFAULT: dict[str, Any] = {k.field: FIELD_DEFAULTS[k.field] for k in KNOBS if k.field and k.late}

# What ServingConfig renders from each engine's words, in the declaration's order: (field, words).
FLAGS: dict[str, tuple[tuple[str, Words], ...]] = {
    e: tuple((k.field, w) for k in KNOBS if k.field for w in k.words(e) if w.renders_flag) for e in ENGINES
}
SPECULATIVE_KEYS: tuple[tuple[str, Words], ...] = tuple(
    (k.field, w) for k in KNOBS if k.field for w in k.words("vllm") if w.key
)
ENVIRONMENT: dict[str, tuple[tuple[str, Words], ...]] = {
    e: tuple((k.field, w) for k in KNOBS if k.field for w in k.words(e) if w.env) for e in ENGINES
}


def _owners(engine: str) -> dict[str, str]:
    """Each flag a knob owns on ENGINE -> its owners, in the declaration's order (one flag may have several:
    vLLM's --speculative-config carries four knobs)."""
    owners: dict[str, dict[str, None]] = {}
    for knob in KNOBS:
        for said in knob.words(engine):
            for owned in said.owned:
                owners.setdefault(owned, {})[knob.variable + (f" ({said.note})" if said.note else "")] = None
    return {owned: ", ".join(named) for owned, named in owners.items()}


# Flags a typed serving variable owns: passing one through serving_extra_args would fight the
# variable (vLLM keeps the last --speculative-config, so a dotted one drops the method and drafter).
OWNED_FLAGS: dict[str, dict[str, str]] = {engine: _owners(engine) for engine in ENGINES}
# Environment variables a typed variable owns, or that the pinned engine no longer reads.
OWNED_ENV: dict[str, str] = {
    **words.UNREAD_ENV,
    **{said.env: k.variable for k in KNOBS for _, said in k.engines if said.env},
}


def owned_flag_problems(engine: str, extra_args: Iterable[str]) -> list[str]:
    """An extra argument that a typed variable owns, named with that variable."""
    owned, out = OWNED_FLAGS.get(engine, {}), []
    for arg in extra_args:
        given = arg.split("=", 1)[0]
        base = given.split(".", 1)[0] if given.startswith("--") else given  # vLLM's dotted --speculative-config.x
        if base in owned:
            out.append(f"serving_extra_args: {given} is said by {owned[base]}; set that instead (one owner per flag)")
    return out


def owned_env_problems(env: Mapping[str, str]) -> list[str]:
    return [f"serving_env: {name} is said by {OWNED_ENV[name]}; set that instead" for name in env if name in OWNED_ENV]


def unsaid_problems(engine: str, config: object, knobs: Iterable[Knob] = KNOBS) -> list[str]:
    """A knob set away from its default for an engine that has no words for it (only the other
    engine's): refused, rather than dropped without a word."""
    out = []
    for knob in knobs:
        if knob.field and knob.engines and not knob.words(engine):
            value = getattr(config, knob.field)
            if value != knob.config_default:
                others = ", ".join(sorted({e for e, _ in knob.engines}))
                why = words.UNSAID_WHY.get((engine, knob.field))
                out.append(f"{knob.variable}={value!r}: {engine} has no such setting (only {others})"
                           + (f": {why}" if why else "") + "; leave it unset")  # fmt: skip
    return out


P2P = "serving_p2p"


def with_defaults(given: Mapping[str, Any]) -> dict[str, Any]:
    """GIVEN serving_* values over the role's own defaults (not the derived ones): what a play that does
    not load the serving role (preflight's) would have it use."""
    defaults = {k.variable: k.default for k in KNOBS if k.default is not UNSET and not k.derived}
    return {**defaults, **given}


def config_variables(names: Iterable[str]) -> list[str]:
    """The variables among NAMES that make the engine's variable set (never a secret: those are read apart)."""
    return [n for n in names if n in BY_VARIABLE and (BY_VARIABLE[n].field or n == P2P) and not BY_VARIABLE[n].no_log]


def collect(values: Mapping[str, Any]) -> dict[str, Any]:
    """The role's serving_* values as the dict ServingConfig.from_vars takes (field names; numbers and
    flags as numbers and flags, the rest as given), serving_p2p applied to serving_nccl. Checked by
    the rules before this runs."""
    out: dict[str, Any] = {}
    for variable in config_variables(values):
        knob, value = BY_VARIABLE[variable], values[variable]
        if knob.field:
            out[knob.field] = knob.collected(value)
    mode = p2p.mode(values.get(P2P, "auto"))
    if mode != "auto":  # auto leaves nccl as it was: no engine deployed before serving_p2p changes its digest
        out["nccl"] = p2p.override_settings(dict(out.get("nccl") or {}), str(mode))
    return out
