"""The GPU facts parser on output captured on a real GPU host by our own preflight commands."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.gpu.facts import collect

CAPTURE = Path(__file__).parents[2] / "data" / "nvidia-smi" / "h200-x1-device-20261130"


def test_facts_parsed_here_equal_the_facts_the_real_host_printed():
    def read(name: str) -> str:
        return (CAPTURE / name).read_text()

    names = ("nvidia-smi-q.xml", "topo.txt", "query-gpu.csv", "query-apps.csv", "version.txt")
    facts = collect(*(read(n) for n in names)).to_json()
    on_host = json.loads((CAPTURE / "facts.json").read_text())
    assert {k: v for k, v in on_host.items() if k in facts} == facts
    assert facts["count"] == 1 and facts["kernel_module"] == "open" and facts["gpus"][0]["name"] == "NVIDIA H200"
    assert facts["driver_version"] in read("plain.txt")
