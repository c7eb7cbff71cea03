"""Every serving inventory value checked once, before anything touches a host: types, ranges,
formats and secrets. Each refusal names the variable as the user wrote it, the value, and what is
allowed, so the fix is one edit away."""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from specdeploy.serve import loaders
from specdeploy.serve.config import ENGINES, GPU_ACCESS, IPC_MODES, SPECULATIVE_METHODS

Check = Callable[[Any], str | None]  # None: fine; else what is allowed
_SIZE = re.compile(r"^\d+(?:\.\d+)?\s*[bkmgtBKMGT]?(?:i?[bB])?$")  # docker's shm sizes: 16g, 512m, 1073741824
_SECRET_NAME = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
_SECRET_ARG = re.compile(r"^--(?:api-key|hf-token|token)\b")


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(?:\.\d+)?", value.strip()):
        return float(value)
    return None


def integer(low: int, high: int | None = None) -> Check:
    def check(value: Any) -> str | None:
        number = _int(value)
        if number is None or number < low or (high is not None and number > high):
            return f"a whole number from {low}" + (f" to {high}" if high is not None else " up")
        return None

    return check


def seconds(low: float) -> Check:
    def check(value: Any) -> str | None:
        number = _number(value)
        return None if number is not None and number >= low and number > 0 else f"a number of seconds > {low:g}"

    return check


def number(low: float, high: float) -> Check:
    def check(value: Any) -> str | None:
        given = _number(value)
        return None if given is not None and low <= given <= high else f"a number from {low:g} to {high:g}"

    return check


def choice(options: tuple[str, ...]) -> Check:
    return lambda value: None if value in options else f"one of {', '.join(options)}"


def absolute_path(value: Any) -> str | None:
    return None if isinstance(value, str) and value.startswith("/") and ".." not in value.split("/") else (
        "an absolute path on the host, e.g. /srv/models/kimi-k2.5")  # fmt: skip


def name(value: Any) -> str | None:
    return None if isinstance(value, str) and re.fullmatch(r"[\w.:/-]+", value) else "a name without spaces"


def parser_name(value: Any) -> str | None:
    """A parser as the engines register it (kimi_k2, deepseek_v3, ...), or empty for none."""
    if value in ("", None):
        return None
    return (
        None
        if isinstance(value, str) and re.fullmatch(r"[a-z0-9_]{1,40}", value)
        else (f"{value!r} is not a parser name (lowercase letters, digits, _; e.g. kimi_k2), or empty for none")
    )


def size(value: Any) -> str | None:
    return None if isinstance(value, str | int) and _SIZE.match(str(value)) else "a size such as 16g, 512m or bytes"


def boolean(value: Any) -> str | None:
    ok = isinstance(value, bool) or str(value).lower() in ("true", "false", "yes", "no", "1", "0")
    return None if ok else "true or false"


def ip_address(value: Any) -> str | None:
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        return "an IP address, e.g. 127.0.0.1 (loopback) or 0.0.0.0 (with serving_api_key)"
    return None


def argument_list(value: Any) -> str | None:
    if isinstance(value, str):
        return "a list of arguments, one item each, e.g. ['--enforce-eager', '--max-num-seqs', '8'] (a string becomes one argument with its spaces in it)"  # noqa: E501
    if not isinstance(value, list) or not all(isinstance(a, str | int | float) for a in value):
        return "a list of strings"
    if any(_SECRET_ARG.match(str(a)) for a in value):
        return "no secrets: pass the API key as serving_api_key (from ansible-vault, never logged)"
    return None


def environment(value: Any) -> str | None:
    if not isinstance(value, Mapping) or not all(isinstance(v, str | int | float | bool) for v in value.values()):
        return "a mapping of NAME: value"
    secret = next((k for k in value if _SECRET_NAME.search(str(k))), None)
    if secret:
        return (f"no secrets in plain inventory ({secret}): the API key goes in serving_api_key, from ansible-vault "
                "(ansible-vault encrypt_string --name serving_api_key)")  # fmt: skip
    return None


def volumes(value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return "a mapping of host path: container path"
    if not all(absolute_path(k) is None and absolute_path(v) is None for k, v in value.items()):
        return "absolute paths on both sides, host path: container path"
    return None


RULES: dict[str, Check] = {
    "serving_engine": choice(ENGINES),
    "serving_model_path": absolute_path,
    "serving_served_model_name": name,
    "serving_tensor_parallel_size": integer(1, 64),
    "serving_pipeline_parallel_size": integer(1, 64),
    "serving_max_model_len": integer(0),
    "serving_speculative_method": choice(SPECULATIVE_METHODS),
    "serving_num_speculative_tokens": integer(1, 16),
    "serving_extra_args": argument_list,
    "serving_env": environment,
    "serving_volumes": volumes,
    "serving_port": integer(1, 65535),
    "serving_bind_address": ip_address,
    "serving_gpus": choice(GPU_ACCESS),
    "serving_ipc_mode": choice(IPC_MODES),
    "serving_shm_size": size,
    "serving_memlock_bytes": integer(-1),
    "serving_stack_bytes": integer(1),
    "serving_stall_timeout": seconds(0),
    "serving_timeout": seconds(0),
    "serving_reconnect_grace": seconds(0),
    "serving_state_dir": absolute_path,
    "serving_bench": boolean,
    "serving_bench_gate": boolean,
    "serving_bench_budget_s": seconds(0),
    "serving_bench_concurrency": integer(1, 1024),
    "serving_bench_max_tokens": integer(8, 16384),
    "serving_bench_min_acceptance_length": number(0, 64),
    "serving_bench_max_regression": number(0.001, 0.999),
    "serving_warm_page_cache": boolean,
    "serving_prewarm_readers": integer(0, 256),
    "serving_prewarm_max_fraction": number(0.01, 0.9),
    "serving_prewarm_max_gb": number(0, 1_000_000),
    "serving_iommu_acs_fixed": boolean,
    "serving_trust_remote_code": boolean,
    "serving_tool_call_parser": parser_name,
    "serving_reasoning_parser": parser_name,
    "serving_drain_timeout": integer(0, 3600),
    "serving_attention_backend": parser_name,
    "serving_draft_attention_backend": parser_name,
    "serving_nnodes": integer(1, 64),
    "serving_node_rank": integer(0, 63),
    "serving_master_addr": lambda value: None if value in ("", None) else ip_address(value),
    "serving_master_port": integer(1, 65535),
    "serving_load_format": lambda value: (
        None
        if value in ("", None) or value in loaders.LOADERS
        else (f"empty (the engine's default) or one of {', '.join(loaders.LOADERS)}")
    ),
}


def problems(values: Mapping[str, Any]) -> list[str]:
    """One sentence per bad value: `serving_port=70000: must be a whole number from 1 to 65535`."""
    out = []
    for variable, check in RULES.items():
        if variable not in values:
            continue
        allowed = check(values[variable])
        if allowed:
            secret = allowed.startswith("no secrets")
            shown = "(not shown)" if secret or isinstance(values[variable], Mapping) else repr(values[variable])
            out.append(f"{variable}={shown[:120]}: must be {allowed}")
    return out


def remote_code_warnings(config_text: str | None, trust_remote_code: bool) -> list[str]:
    """A model folder whose config.json maps classes to its own code (auto_map) loads only with
    --trust-remote-code; without it the engine fails late, after the image build and the rollout."""
    if not config_text or trust_remote_code:
        return []
    try:
        config = json.loads(config_text)
    except json.JSONDecodeError:
        return []
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not auto_map:
        return []
    return [f"the model's config.json maps {', '.join(sorted(auto_map))} to custom code (auto_map), but "
            "serving_trust_remote_code is false: the engine will refuse to load it; set serving_trust_remote_code: "
            "true if you trust the model's code"]  # fmt: skip
