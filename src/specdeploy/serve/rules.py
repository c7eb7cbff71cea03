"""The checks a serving variable's rule is made of (specdeploy.serve.schema binds them to variables).
Each returns None for a good value, else what is allowed, phrased to follow "must be"."""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any

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


def backend_name(value: Any) -> str | None:
    """A name in an engine's registry (TRITON_MLA, triton, fp8_e4m3: engine_words checks which), or empty."""
    if value in ("", None):
        return None
    return None if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_]{1,40}", value) else (
        "a backend or dtype name as the engine registers it (letters, digits, _), or empty")  # fmt: skip


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
        return "a list of arguments, one item each, e.g. ['--enforce-eager', '--seed', '0'] (a string becomes one argument with its spaces in it)"  # noqa: E501
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


def sweep_levels(value: Any) -> str | None:
    """Concurrencies to sweep: whole numbers from 1, increasing, at most 8 of them."""
    given = [_int(v) for v in value] if isinstance(value, list) else [None]
    levels = [v for v in given if v is not None]
    if len(levels) != len(given) or len(levels) > 8 or any(b <= a for a, b in itertools.pairwise(levels)):
        return "a list of at most 8 increasing concurrencies, e.g. [1, 4, 16, 64], or []"
    return None if all(v >= 1 for v in levels) else "a list of concurrencies of 1 or more"
