"""serving_bench_prompts: the operator's JSONL drives the gate, and a malformed one is refused naming the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdeploy.gate import client, prompt_file
from specdeploy.gate.benchmark import BenchmarkGate
from specdeploy.gate.rules import GateSettings
from specdeploy.serve import variables
from specdeploy.serve.config import ServingConfig
from tests.unit.gate.test_benchmark import READY, REAL, FakeEngineContainer

CHAT = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question {i}?"}]}
        for i in range(3)]  # fmt: skip


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def test_chat_lines_send_their_last_user_message_and_prompt_lines_their_prompt(tmp_path):
    path = write(tmp_path / "p.jsonl", [*CHAT, {"prompt": "Complete this: the quick brown"}])
    assert prompt_file.read(path) == ["Question 0?", "Question 1?", "Question 2?", "Complete this: the quick brown"]


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        (["{not json"], "line 1: not JSON"),
        ([[1, 2]], "line 1: a JSON object"),
        ([{"prompt": ""}], 'line 1: "prompt" must be a non-empty string'),
        ([{"messages": [{"role": "user"}]}], "line 1: each message is"),
        ([{"messages": [{"role": "assistant", "content": "hi"}]}], "line 1: no user message"),
        ([{"text": "x"}], 'needs "messages"'),
        ([{"prompt": "a"}, {"prompt": "b"}], "2 prompts; the gate needs at least 4"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_variable_and_the_line(tmp_path, rows, said):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    problems = variables.problems({"serving_bench_prompts": str(path)})
    assert len(problems) == 1 and problems[0].startswith(f"serving_bench_prompts='{path}': must be empty (the shipped")
    assert said in problems[0], problems
    assert variables.problems({"serving_bench_prompts": "relative.jsonl"})[0].endswith(
        "an absolute path on the controller"
    )
    assert variables.problems({"serving_bench_prompts": ""}) == []


def test_the_file_drives_the_gate_its_sweep_and_its_baseline_key(tmp_path):
    path = write(tmp_path / "p.jsonl", [*CHAT, {"prompt": "Fourth"}])
    cfg = ServingConfig(engine="vllm", image="i", model_path="/m", served_model_name="m")
    settings = GateSettings(sweep=(1, 4), baseline="once", prompts=str(path))
    own = BenchmarkGate.for_engine(settings, cfg, "CPU test, 2 threads")
    shipped = BenchmarkGate.for_engine(GateSettings(sweep=(1, 4), baseline="once"), cfg, "CPU test, 2 threads")
    container = FakeEngineContainer(REAL)
    result = own(container, READY, None, None, None)
    assert result.passed
    dataset = json.loads(container.files[f"{client.WORKDIR}/{client.DATASET}"])
    sent = {row["conversations"][0]["value"] for row in dataset}
    assert sent == {"Question 0?", "Question 1?", "Question 2?", "Fourth"}
    # A baseline measured on other prompts does not divide: another key. The shipped set's key is as before.
    assert own.baseline_key("sha256:c", "0.33.0") != shipped.baseline_key("sha256:c", "0.33.0")
    assert shipped.texts() == client.prompts()
