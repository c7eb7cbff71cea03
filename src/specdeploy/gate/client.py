"""The benchmark gate's client: the engine's own, run inside the new engine's container.

Kept clients rather than ours. For vLLM, `vllm bench serve`: it streams chat completions through the
engine's chat template (`--backend openai-chat`), times TTFT and every inter-token gap, and reads the
spec-decode counters from `/metrics` before and after. For SGLang, `python3 -m sglang.benchmark.serving`
(`--backend sglang-oai-chat`, the same prompts and flags in its words): it reads SGLang's own
acceptance figure (`/server_info`'s `avg_spec_accept_length`; `--flush-cache` resets it after the
warm-up, so it is about this run's). Inside the engine's container, because the image already holds
the exact engine and the tokenizer's model folder, and the endpoint is on its loopback: nothing is
installed on the host and no port leaves it. The API key reaches the client in its environment
(`OPENAI_API_KEY`, which both clients read), never on its command line."""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from specdeploy.gate.figures import BadResult, from_client
from specdeploy.gate.rules import CLIENT_START_LIMIT_S
from specdeploy.record_types import Figures

WORKDIR = "/tmp/specdeploy-bench"
DATASET, RESULT = "prompts.sharegpt.json", "result.json"


def prompts() -> list[str]:
    """The shipped prompt set (src/specdeploy/gate/prompts.json: its source and licence are in it)."""
    doc = json.loads(resources.files("specdeploy.gate").joinpath("prompts.json").read_text())
    return [str(p) for p in doc["prompts"]]


def sharegpt(texts: list[str]) -> bytes:
    """The prompts in the ShareGPT layout the client reads (`--dataset-name sharegpt`): one user turn
    each; the reply turn is required by the layout and unused (`--sharegpt-output-len` sets the length)."""
    rows = [{"id": f"specdeploy-{i}", "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": ""}]}
            for i, t in enumerate(texts)]  # fmt: skip
    return json.dumps(rows, ensure_ascii=False).encode()


@dataclass(frozen=True)
class BenchRun:
    model_path: str  # the model folder inside the container (its tokenizer)
    served_model_name: str
    base_url: str  # the engine as seen from inside its container
    num_prompts: int
    concurrency: int
    max_tokens: int
    timeout_s: float
    trust_remote_code: bool = False
    engine: str = "vllm"

    def command(self) -> list[str]:
        limit = ["timeout", "--signal=KILL", f"{self.timeout_s:.0f}"]
        return [*limit, *(self._sglang() if self.engine == "sglang" else self._vllm())]

    def _vllm(self) -> list[str]:
        cmd = ["vllm", "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
               "--base-url", self.base_url, "--model", self.model_path, "--tokenizer", self.model_path,
               "--served-model-name", self.served_model_name,
               "--dataset-name", "sharegpt", "--dataset-path", f"{WORKDIR}/{DATASET}",
               "--num-prompts", str(self.num_prompts), "--sharegpt-output-len", str(self.max_tokens),
               "--max-concurrency", str(self.concurrency), "--ignore-eos", "--temperature", "0", "--seed", "0",
               "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
               "--save-result", "--result-dir", WORKDIR, "--result-filename", RESULT]  # fmt: skip
        return [*cmd, "--trust-remote-code"] if self.trust_remote_code else cmd

    def _sglang(self) -> list[str]:
        """SGLang 0.5.23's `sglang/benchmark/serving.py` (0.5.17's takes the same flags): it ignores EOS
        unless told not to, loads the tokenizer with trust_remote_code always, appends one JSON line
        to --output-file."""
        return ["python3", "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat",
                "--base-url", self.base_url, "--model", self.model_path, "--tokenizer", self.model_path,
                "--served-model-name", self.served_model_name,
                "--dataset-name", "sharegpt", "--dataset-path", f"{WORKDIR}/{DATASET}",
                "--num-prompts", str(self.num_prompts), "--sharegpt-output-len", str(self.max_tokens),
                "--max-concurrency", str(self.concurrency), "--request-rate", "inf", "--seed", "0",
                "--extra-request-body", '{"temperature": 0}', "--warmup-requests", "1", "--flush-cache",
                "--disable-tqdm", "--output-file", f"{WORKDIR}/{RESULT}"]  # fmt: skip

    def name(self) -> str:
        return name(self.engine)


def name(engine: str) -> str:
    """The ENGINE's own client, as the gate's lines name it."""
    return "python3 -m sglang.benchmark.serving" if engine == "sglang" else "vllm bench serve"


class ExecContainer(Protocol):
    """The part of a docker-py Container the client uses (tests give a fake)."""

    def put_archive(self, path: str, data: bytes) -> bool: ...
    def exec_run(self, cmd: list[str], *, environment: dict[str, str] | None = None,
                 demux: bool = False) -> Any: ...  # fmt: skip


def tar_archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class BenchFailed(RuntimeError):
    """The client did not produce a result: its exit and the end of its output."""


def run(container: ExecContainer, bench: BenchRun, texts: list[str], api_key: str) -> Figures:
    setup = container.exec_run(["sh", "-c", f"rm -rf {WORKDIR} && mkdir -p {WORKDIR}"])
    if setup.exit_code != 0:
        raise BenchFailed(f"could not prepare {WORKDIR} in the engine container: {setup.output!r}")
    container.put_archive(WORKDIR, tar_archive({DATASET: sharegpt(texts)}))
    env = {"OPENAI_API_KEY": api_key} if api_key else {}
    done = container.exec_run(bench.command(), environment=env, demux=True)
    out, err = (part.decode(errors="replace") if part else "" for part in done.output)
    if done.exit_code != 0:
        why = "killed at its time limit" if done.exit_code in (124, 137) else f"exit {done.exit_code}"
        tail = (err or out).strip().splitlines()[-12:]
        raise BenchFailed(f"{bench.name()} failed ({why}, limit {bench.timeout_s:.0f} s): " + " | ".join(tail))
    result = container.exec_run(["cat", f"{WORKDIR}/{RESULT}"])
    try:
        return from_client(bench.engine, bytes(result.output or b"").decode(errors="replace"),
                                   num_prompts=bench.num_prompts, concurrency=bench.concurrency,
                                   max_tokens=bench.max_tokens)  # fmt: skip
    except (ValueError, BadResult) as exc:
        raise BenchFailed(f"{bench.name()} wrote no readable result ({exc}); its output: {out[-800:]}") from exc


def time_limit(budget_s: float) -> float:
    """The client is killed past the budget plus the longest start-up it may take: a benchmark never
    holds a rollout, and a slow start-up on a busy host is not taken for a hung client."""
    return budget_s + CLIENT_START_LIMIT_S


def describe(bench: BenchRun) -> str:
    return shlex.join(bench.command()[3:])  # without the timeout wrapper
