"""serving_bench_prompts: the operator's own prompts for the gate, its sweep and its baseline.

Acceptance depends on the traffic (the Kimi-K2.x drafters: 2.6-3.3 on their cards, about 2.3 on held-out
chat), so a verdict from the shipped prompts may not hold for the operator's requests. The file is JSON
Lines on the controller, one request a line, either form:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}
    {"prompt": "..."}

Both engines' clients send one user turn per request (the ShareGPT layout, `--dataset-name sharegpt`),
so a chat line is sent as its last user message; earlier turns are not replayed. Read on the controller
and copied into the engine's container, like the shipped set."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FEWEST = 4  # a sweep level of 4 requests needs 4 prompts (the set is cycled past that, never below it)
MOST_BYTES = 64 * 1024**2


class PromptFileError(ValueError):
    """Why the file is no prompt set: the path, and the line."""


def _text(line: Any, number: int) -> str:
    """The request one line holds: its prompt, or its chat's last user message."""
    if not isinstance(line, dict):
        raise PromptFileError(f'line {number}: a JSON object with "messages" or "prompt", not {type(line).__name__}')
    if "prompt" in line:
        prompt = line["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptFileError(f'line {number}: "prompt" must be a non-empty string')
        return prompt
    messages = line.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(f'line {number}: needs "messages" (a list of {{role, content}}) or "prompt"')
    for turn in messages:
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("role"), str)
            or not isinstance(turn.get("content"), str)
        ):
            raise PromptFileError(f'line {number}: each message is {{"role": ..., "content": "..."}} (text content)')
    users = [t["content"] for t in messages if t["role"] == "user" and t["content"].strip()]
    if not users:
        raise PromptFileError(f"line {number}: no user message with text")
    return str(users[-1])


def read(path: str | Path) -> list[str]:
    """The requests of the file at PATH, in its order; PromptFileError on the first thing wrong."""
    file = Path(path)
    if not file.is_absolute():
        raise PromptFileError(f"{path}: an absolute path on the controller")
    try:
        if file.stat().st_size > MOST_BYTES:
            raise PromptFileError(f"{path}: larger than {MOST_BYTES // 1024**2} MiB")
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"{path}: cannot be read ({exc})") from exc
    texts = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}: line {number}: not JSON ({exc.msg})") from exc
        try:
            texts.append(_text(line, number))
        except PromptFileError as exc:
            raise PromptFileError(f"{path}: {exc}") from exc
    if len(texts) < FEWEST:
        raise PromptFileError(f"{path}: {len(texts)} prompts; the gate needs at least {FEWEST}")
    return texts


def problem(value: Any) -> str | None:
    """serving_bench_prompts' rule (phrased to follow "must be"): empty, or a good file."""
    if value in ("", None):
        return None
    try:
        read(str(value))
    except PromptFileError as exc:
        return f"empty (the shipped prompts) or a JSONL file of your prompts: {exc}"
    return None


def digest(texts: list[str]) -> str:
    """What a measurement on these prompts is kept under (a baseline measured on others does not divide)."""
    return "sha256:" + hashlib.sha256(json.dumps(texts, ensure_ascii=False).encode()).hexdigest()
