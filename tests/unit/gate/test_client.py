"""specdeploy.gate.client: the benchmark client's command and its bound."""

from __future__ import annotations

import json

from specdeploy.gate import client
from specdeploy.gate.rules import CLIENT_START_LIMIT_S, CLIENT_START_S


def bench(timeout_s: float) -> client.BenchRun:
    return client.BenchRun("/models/target", "m", "http://127.0.0.1:8000", 8, 4, 64, timeout_s)


def test_the_client_is_killed_past_the_budget_plus_the_longest_start_up_it_may_take():
    cmd = bench(client.time_limit(40)).command()
    assert cmd[:3] == ["timeout", "--signal=KILL", f"{40 + CLIENT_START_LIMIT_S:.0f}"]
    # make test-fleet, 2026-12-06: on the test bed under load the client's start-up passed 60 s, and a bound
    # of budget + the expected start-up (40 + 20 s) killed it before its first request.
    assert client.time_limit(40) > 40 + 60 > 40 + CLIENT_START_S
    assert client.describe(bench(client.time_limit(40))).startswith("vllm bench serve --backend openai-chat")


def test_the_prompts_go_to_the_client_in_the_sharegpt_layout_it_reads():
    rows = json.loads(client.sharegpt(["a", "b"]))
    assert [r["conversations"][0] for r in rows] == [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]
    assert all(r["conversations"][1]["from"] == "gpt" for r in rows)
