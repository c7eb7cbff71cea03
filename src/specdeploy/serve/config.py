"""One variable set for both engines, rendered into the engine's command line and its container.

Everything the container is made of goes into `digest()`: a rerun with the same digest and image
is converged (no restart); any difference is a rollout.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from specdeploy import draft_schedule, names
from specdeploy.engine_image.profiles import DRAFTER_DIR
from specdeploy.serve import engine_cache, engine_words, loaders, schema, variables
from specdeploy.serve.knob_fields import KnobFields
from specdeploy.serve.schema import BY_FIELD, DIGEST_SKIPS_AT_DEFAULT

MODEL_MOUNT = "/models/target"
CONTAINER = names.ENGINE_CONTAINER
CONFIG_LABEL = "io.specdeploy.serve-config"
# The replicas behind the API (data_parallel_ranks): a version brought back is proven by its own count.
DP_RANKS_LABEL = "io.specdeploy.data-parallel-ranks"


# Every knob's field is KnobFields', generated from specdeploy.serve.schema (type, default, doc): real
# fields rather than a mapping with typed accessors, so that mypy --strict still checks each use by
# name and type (cfg.tensor_parallel_size is an int) and callers keep their attributes. Here: what is
# no knob, the rules over several fields, and the rendering (a simple flag's from its knob's words).
@dataclass(frozen=True)
class ServingConfig(KnobFields):
    drafter_path: str = DRAFTER_DIR  # inside the image: the drafter is baked in (not a role variable)
    # The host folder of this image's engine cache (specdeploy.serve.engine_cache), set by the deploy once
    # it knows the image; "" for none. Not in the digest: it follows from the image, which is compared apart.
    cache_dir: str = ""
    # What serving_speculative_schedule: auto chose (draft_schedule's text), set by the rollout once the gate
    # has measured each length. Not in the digest: the container is made of the declared `auto`, and a rerun
    # with the same record chooses the same.
    resolved_schedule: str = ""

    @classmethod
    def from_vars(cls, values: dict[str, Any]) -> ServingConfig:
        """From the role's variable set (schema.collect) or any dict of field names: each value
        coerced as its knob says (numbers, flags, argument tuples, string mappings)."""
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**{k: BY_FIELD[k].to_field(v) if k in BY_FIELD else v for k, v in known.items()})

    def _inputs(self) -> dict[str, Any]:
        """The fields as role variables, for the declaration's rules (None: not set; a tuple: a list)."""
        values = {BY_FIELD[name].variable: getattr(self, name) for name in BY_FIELD}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}

    def problems(self) -> list[str]:
        """Bad input, said before anything touches a host: each field by its knob's rule, then the
        rules that take several fields together."""
        out = variables.problems(self._inputs())
        try:
            loopback = ipaddress.ip_address(self.bind_address).is_loopback
        except ValueError:  # said above, by serving_bind_address's rule
            loopback = True
        if not loopback and not self.api_key:
            out.append(
                f"the API binds {self.bind_address}, off loopback, without an API key: set serving_api_key "
                "(from ansible-vault: ansible-vault encrypt_string --name serving_api_key)"
            )
        out += self._recipe_problems()
        out += self._multi_node_problems()
        if self.load_format in loaders.LOADERS:  # an unknown one is said above, by its rule
            out += loaders.problems(self.load_format, self.engine, self.gpus)
        if any("api-key" in arg for arg in self.extra_args):
            out.append("pass the API key as serving_api_key (vault, never logged), not in serving_extra_args")
        return out

    def _recipe_problems(self) -> list[str]:
        """Each recipe value held to the pinned engine's own registry, and no flag or variable said twice."""
        engine = self.engine
        given = (("serving_attention_backend", "attention backend", self.attention_backend, False),
                 ("serving_draft_attention_backend", "attention backend", self.draft_attention_backend, True),
                 ("serving_kv_cache_dtype", "KV-cache dtype", self.kv_cache_dtype, False),
                 ("serving_draft_kv_cache_dtype", "KV-cache dtype", self.draft_kv_cache_dtype, True))  # fmt: skip
        out = [f"{variable}={value!r}: {problem}" for variable, kind, value, draft in given
               if value and (problem := engine_words.unknown(engine, kind, value, draft))]  # fmt: skip
        out += self._schedule_problems()
        if self.speculative_method != "eagle3" and (self.draft_attention_backend or self.draft_kv_cache_dtype):
            out.append(
                "serving_draft_attention_backend / serving_draft_kv_cache_dtype apply to the drafter: "
                "serving_speculative_method is none"
            )
        return [
            *out,
            *schema.owned_flag_problems(engine, self.extra_args),
            *schema.owned_env_problems(self.env),
            *schema.unsaid_problems(engine, self),
        ]

    def _schedule_problems(self) -> list[str]:
        """What vLLM would refuse only once the model is loaded, or do without a word (draft_schedule)."""
        given, variable = self.speculative_schedule, "serving_speculative_schedule"
        if not given or draft_schedule.problem(given) or self.engine != "vllm":  # said by the rules
            return []
        if self.speculative_method != "eagle3":
            return [f"{variable}={given!r}: a draft length per batch size needs a drafter; serving_speculative_method "
                    "is none"]  # fmt: skip
        if given == draft_schedule.AUTO:
            return [] if self.nnodes == 1 else [
                f"{variable}=auto is chosen by the benchmark gate, which does not run on a multi-node group: give "
                "the ranges yourself"]  # fmt: skip
        spans = draft_schedule.parse(given)
        out = [f"{variable}: the range {s.text()} drafts {s.length} tokens, more than serving_num_speculative_tokens "
               f"({self.num_speculative_tokens}), which vLLM would lower to it without a word; raise that or lower "
               "this" for s in draft_schedule.above(spans, self.num_speculative_tokens)]  # fmt: skip
        if draft_schedule.all_off(spans):
            out.append(f"{variable}={given!r} drafts nothing at any batch size: set serving_speculative_method: none "
                       "(a length of 0 is not speculation off: vLLM still runs its speculative path, x0.85 at 8 "
                       "requests on the H200)")  # fmt: skip
        return out

    @property
    def draft_spans(self) -> tuple[draft_schedule.Span, ...]:
        """The ranges the engine runs: the explicit schedule, or what `auto` chose (none: one length)."""
        auto = self.speculative_schedule == draft_schedule.AUTO
        return draft_schedule.parse(self.resolved_schedule if auto else self.speculative_schedule)

    def drafts_within(self, most: int) -> bool:
        """Whether at most MOST requests at once see drafts (the READY completion: 1; the gate's run: its
        concurrency). `auto` before it has chosen cannot say: False, so nothing waits for drafts there."""
        if self.speculative_method != "eagle3" or (self.speculative_schedule == draft_schedule.AUTO
                                                   and not self.resolved_schedule):  # fmt: skip
            return False
        return draft_schedule.drafts_within(self.draft_spans, most)

    @property
    def drafts(self) -> bool:
        """Whether the engine runs its drafter: EAGLE-3, unless `auto` chose no drafts at any batch size."""
        return self.speculative_method == "eagle3" and not draft_schedule.all_off(self.draft_spans)

    def _multi_node_problems(self) -> list[str]:
        if self.nnodes == 1:
            return []
        out = []
        if not 0 <= self.node_rank < self.nnodes:
            out.append(f"serving_node_rank={self.node_rank}: must be from 0 to {self.nnodes - 1} (serving_nnodes)")
        if not self.master_addr:
            out.append("serving_nnodes > 1 needs serving_master_addr: the address of rank 0's host, reachable from all")
        if self.multi_node == "data_parallel":
            if self.engine != "vllm":
                out.append(f"serving_multi_node=data_parallel is vLLM's launch (--data-parallel-address, --headless): "
                           f"{self.engine} spreads one model over hosts as model_parallel")  # fmt: skip
        elif (self.tensor_parallel_size * self.pipeline_parallel_size) % self.nnodes:
            sizes = f"{self.tensor_parallel_size} x {self.pipeline_parallel_size}"
            out.append(f"serving_nnodes={self.nnodes} must divide tensor x pipeline parallel ({sizes}): each host "
                       "holds an equal share")  # fmt: skip
        return out

    @property
    def data_parallel_ranks(self) -> int:
        """The replicas behind rank 0's API (1 unless serving_multi_node is data_parallel)."""
        return self.nnodes if self.nnodes > 1 and self.multi_node == "data_parallel" else 1

    @property
    def host_network(self) -> bool:
        return self.nnodes > 1

    @property
    def serves_api(self) -> bool:
        """vLLM's ranks > 0 run headless: the API (and its readiness) is rank 0's."""
        return not (self.engine == "vllm" and self.nnodes > 1 and self.node_rank > 0)

    def _multi_node_args(self) -> list[str]:
        if self.nnodes == 1:
            return []
        if self.engine == "vllm" and self.multi_node == "data_parallel":
            # One replica per host; the head is never given a start rank (that would make it hybrid LB).
            args = ["--data-parallel-size", str(self.nnodes), "--data-parallel-size-local", "1",
                    "--data-parallel-address", self.master_addr,
                    "--data-parallel-rpc-port", str(self.master_port)]  # fmt: skip
            if self.node_rank:
                return [*args, "--headless", "--data-parallel-start-rank", str(self.node_rank)]
            # One API server: vLLM would start one per data-parallel rank on the head (cli/serve.py).
            return [*args, "--api-server-count", "1"]
        if self.engine == "vllm":
            args = ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                    "--master-addr", self.master_addr, "--master-port", str(self.master_port)]  # fmt: skip
            return [*args, "--headless"] if self.node_rank > 0 else args
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank),
                "--dist-init-addr", f"{self.master_addr}:{self.master_port}"]  # fmt: skip

    # ------------------------------------------------------------------ the engine

    def command(self) -> list[str]:
        if self.engine == "vllm":
            return self._vllm()
        return self._sglang()

    def _vllm(self) -> list[str]:
        cmd = ["vllm", "serve", MODEL_MOUNT, "--served-model-name", self.served_model_name,
               "--host", self._listen_address, "--port", str(self.port),
               "--tensor-parallel-size", str(self.tensor_parallel_size),
               "--pipeline-parallel-size", str(self.pipeline_parallel_size)]  # fmt: skip
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.drafts:
            spec: dict[str, Any] = {"method": "eagle3", "model": self.drafter_path,
                                    "num_speculative_tokens": self._draft_length,
                                    "draft_tensor_parallel_size": 1}  # fmt: skip
            # The drafter's own backend and KV dtype live in the one speculative config: vLLM keeps
            # only the last --speculative-config, so nothing else may say them.
            for name, said in schema.SPECULATIVE_KEYS:
                if value := self._spans_text() if name == "speculative_schedule" else getattr(self, name):
                    spec[said.key] = said.say(value)
            cmd += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if self.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.drain_timeout:
            cmd += ["--shutdown-timeout", str(self.drain_timeout)]
        nccl = (str(a) for a in self.nccl.get("vllm_args", []))
        return [*cmd, *self._knob_args(), *self._model_code_args(), *self._loader_args(), *self._multi_node_args(),
                *nccl, *self.extra_args]  # fmt: skip

    def _spans_text(self) -> str:
        """The schedule the engine is told: "" for one length everywhere (auto that chose nothing yet, or one
        length for every range: said as num_speculative_tokens, which keeps vLLM's uniform decode padding and
        full CUDA graphs, both of which a per-batch-size schedule turns off)."""
        spans = self.draft_spans
        return ",".join(s.text() for s in spans) if len({s.length for s in spans}) > 1 else ""

    @property
    def _draft_length(self) -> int:
        """num_speculative_tokens as the engine is told it: the one length a schedule gives every range."""
        lengths = {s.length for s in self.draft_spans}
        return lengths.pop() if len(lengths) == 1 else self.num_speculative_tokens

    def _knob_args(self) -> list[str]:
        """Each knob's flags in the engine's words, in the declaration's order (schema.FLAGS; its values
        are checked by _recipe_problems first)."""
        return [arg for name, said in schema.FLAGS.get(self.engine, ()) for arg in said.args(getattr(self, name), self)]

    def _network(self) -> dict[str, Any]:
        if self.host_network:
            return {"network_mode": "host"}
        return {"ports": {f"{self.port}/tcp": (self.bind_address, self.port)}}

    @property
    def model_mount(self) -> str:
        """Where the model is inside the engine's container (its client reads the tokenizer there)."""
        return MODEL_MOUNT

    @property
    def url_inside(self) -> str:
        """The engine's API as a client inside its own container reaches it (the benchmark gate's)."""
        address = self._listen_address
        return f"http://{'127.0.0.1' if address in ('0.0.0.0', '::') else address}:{self.port}"

    @property
    def _listen_address(self) -> str:
        """Inside its own network namespace the API listens everywhere and Docker publishes the port
        on the bind address; on the host's network it listens on the bind address itself."""
        return self.bind_address if self.host_network else "0.0.0.0"

    @property
    def stop_timeout_s(self) -> int:
        """How long `docker stop` waits before SIGKILL: the drain, plus the engine's own exit."""
        return max(60, self.drain_timeout + 30)

    def _loader_args(self) -> list[str]:
        found = loaders.loader(self.load_format)
        return found.args(self.engine) if found else []

    def _model_code_args(self) -> list[str]:
        """The same flag names on both engines."""
        args = ["--trust-remote-code"] if self.trust_remote_code else []
        args += ["--reasoning-parser", self.reasoning_parser] if self.reasoning_parser else []
        return args

    def _sglang(self) -> list[str]:
        cmd = ["python3", "-m", "sglang.launch_server", "--model-path", MODEL_MOUNT,
               "--served-model-name", self.served_model_name, "--host", self._listen_address, "--port", str(self.port),
               "--tp-size", str(self.tensor_parallel_size), "--pp-size", str(self.pipeline_parallel_size)]  # fmt: skip
        if self.max_model_len:
            cmd += ["--context-length", str(self.max_model_len)]
        if self.speculative_method == "eagle3":
            # All three of steps/topk/draft-tokens or none (docs/engine-facts.md#sglang); a chain: topk 1.
            n = self.num_speculative_tokens
            cmd += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", self.drafter_path,
                    "--speculative-num-steps", str(n), "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(n + 1)]  # fmt: skip
        if self.tool_call_parser:
            cmd += ["--tool-call-parser", self.tool_call_parser]
        if self.attention_backend:
            cmd += ["--attention-backend", self.attention_backend]
        if self.draft_attention_backend and self.speculative_method == "eagle3":
            cmd += ["--speculative-draft-attention-backend", self.draft_attention_backend]
        if self.draft_kv_cache_dtype and self.speculative_method == "eagle3":
            word = engine_words.kv_cache_dtype("sglang", self.draft_kv_cache_dtype, True)
            cmd += ["--speculative-draft-kv-cache-dtype", str(word)]
        return [*cmd, *self._knob_args(), *self._model_code_args(), *self._loader_args(), *self._multi_node_args(),
                *(str(a) for a in self.nccl.get("sglang_args", [])), *self.extra_args]  # fmt: skip

    def environment(self) -> dict[str, str]:
        found = loaders.loader(self.load_format)
        cache = engine_cache.environment(self.engine) if self.cache_dir else {}
        env = {"HF_HUB_OFFLINE": "1", **{str(k): str(v) for k, v in self.nccl.get("env", {}).items()},
               **(found.environment(self.page_cache_warmed) if found else {}), **cache, **self.env}  # fmt: skip
        for name, said in schema.ENVIRONMENT.get(self.engine, ()):  # an opt-in, by environment
            if getattr(self, name):
                env[said.env] = "1"
        if self.api_key:  # both engines read it from the environment: never on the command line
            env["VLLM_API_KEY" if self.engine == "vllm" else "SGLANG_API_KEY"] = self.api_key
        return env

    def speculation_off(self) -> ServingConfig:
        """The same engine, flags and model without the drafter: the benchmark's baseline."""
        return replace(self, speculative_method="none", num_speculative_tokens=0, draft_attention_backend="",
                       draft_kv_cache_dtype="")  # fmt: skip

    def baseline_digest(self) -> str:
        """What the speculation-off baseline is kept under: the config without its drafter and without
        the image (which carries the drafter), so a new drafter reuses the baseline."""
        return replace(self.speculation_off(), image="").digest()

    def digest(self) -> str:
        """What the container is made of (the API key as a hash only)."""
        fields = asdict(self)
        for name, default in DIGEST_SKIPS_AT_DEFAULT.items():
            if fields[name] == default:
                del fields[name]
        # An input only through the loader's environment: that is what the container is made of.
        del fields["page_cache_warmed"]
        del fields["cache_dir"]
        del fields["resolved_schedule"]
        found = loaders.loader(self.load_format)
        if found and found.environment(self.page_cache_warmed):
            fields["loader_env"] = found.environment(self.page_cache_warmed)
        fields["api_key"] = hashlib.sha256(self.api_key.encode()).hexdigest() if self.api_key else None
        return "sha256:" + hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def container_kwargs(self, image_id: str) -> dict[str, Any]:
        """docker-py `containers.create` arguments. The restart policy is set after READY: a
        crash during start-up must stay a crash for the watchdog, not a restart loop."""
        kwargs: dict[str, Any] = {
            "image": image_id,
            "command": self.command(),
            "name": CONTAINER,
            "environment": self.environment(),
            "ipc_mode": self.ipc_mode,
            "ulimits": [
                {"name": "memlock", "soft": self.memlock_bytes, "hard": self.memlock_bytes},
                {"name": "stack", "soft": self.stack_bytes, "hard": self.stack_bytes},
            ],
            "volumes": {
                self.model_path: {"bind": MODEL_MOUNT, "mode": "ro"},
                **{host: {"bind": inside, "mode": "ro"} for host, inside in self.volumes.items()},
                **({self.cache_dir: {"bind": engine_cache.CACHE_MOUNT, "mode": "rw"}} if self.cache_dir else {}),
            },
            # py-spy reads a stalled engine's stacks (the watchdog's dump) with ptrace.
            "cap_add": ["SYS_PTRACE"],
            **self._network(),
            "labels": {
                CONFIG_LABEL: self.digest(),
                "io.specdeploy.served-model": self.served_model_name,
                DP_RANKS_LABEL: str(self.data_parallel_ranks),
            },
            "restart_policy": {"Name": "no"},
            "detach": True,
        }
        if self.ipc_mode != "host":
            kwargs["shm_size"] = self.shm_size
        if self.gpus == "cdi":
            kwargs["device_requests"] = [{"driver": "cdi", "device_ids": ["nvidia.com/gpu=all"]}]
        elif self.gpus == "device_requests":
            kwargs["device_requests"] = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
        return kwargs
