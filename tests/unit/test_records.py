"""specdeploy.records: every record read back as the code before it wrote it (hosts and controllers keep
those files), each writer byte for byte what the old writer wrote, and the host's files written atomically.

The texts below are what today's writers produced: CURRENT_JSON from roles/serving/tasks/record.yml (its
copy task, run by ansible-playbook 2.19 with the vars block it had), ROLLOUT_JSON from serve/record.py's
RolloutRecord.to_json, the run folder's files from the watchdog's, the gate's and the prewarm's dumps."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from specdeploy import records
from specdeploy.connection import CommandHost
from specdeploy.errors import SpecdeployError
from specdeploy.record_types import Bench, Figures, Gate, PrewarmReport
from specdeploy.records import HostRecords, RolloutRecord, Serving
from specdeploy.serve import deploy_parts
from specdeploy.serve.rollout import Outcome
from specdeploy.watch.watchdog import Verdict
from tests.unit.gate.test_benchmark import READY, REAL, FakeEngineContainer, gate

ROOT = Path(__file__).parents[2]

CURRENT_JSON = r"""{
    "config": {
        "api_key_set": false,
        "bind_address": "127.0.0.1",
        "chat_template": "na\u00efve \u2192 template",
        "engine": "vllm",
        "env": {
            "VLLM_LOGGING_LEVEL": "INFO"
        },
        "extra_args": [
            "--enforce-eager",
            "--max-num-seqs",
            "64"
        ],
        "gpu_memory_utilization": 0.92,
        "max_model_len": null,
        "model_path": "/srv/specdeploy/models/target",
        "nccl": {
            "env": {
                "NCCL_P2P_DISABLE": "1"
            },
            "reason": "PCIe-only host with 8 GPUs, ACS not fixed: P2P off"
        },
        "num_speculative_tokens": 3,
        "port": 8000,
        "served_model_name": "kimi-k2.5",
        "speculative_method": "eagle3",
        "tensor_parallel_size": 8,
        "tool_call_parser": "kimi_k2",
        "trust_remote_code": true
    },
    "container": "specdeploy-engine",
    "engine_image_drafter_path": "",
    "engine_image_profile": "vllm-cpu",
    "image": "specdeploy/vllm-cpu:17be88d464ba",
    "image_id": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
    "previous_image_id": null,
    "started_at": "2026-12-01T22:20:59.123456789Z"
}
"""

ROLLOUT_JSON = r"""{
  "phase": "done",
  "new": null,
  "old": {
    "container_id": "c0ffee01",
    "image_id": "sha256:1111111111111111111111111111111111111111111111111111111111111111",
    "config": "d1g35t0ld",
    "proven_at": "2026-12-01T22:21:40Z",
    "bench": null,
    "startup": [
      {
        "stage": "launched",
        "began_s": 0.0,
        "seconds": 13.0
      }
    ]
  },
  "last_ready": {
    "container_id": "c0ffee02",
    "image_id": "sha256:2222222222222222222222222222222222222222222222222222222222222222",
    "config": "d1g35tn3w",
    "proven_at": "2026-12-02T08:01:02Z",
    "bench": {
      "figures": {
        "completed": 36,
        "failed": 0,
        "duration_s": 2.527,
        "concurrency": 4,
        "max_tokens": 20,
        "output_tokens_per_s": 284.871,
        "ttft_ms": {
          "p50": 41.2,
          "p99": 90.1
        },
        "itl_ms": {
          "p50": 10.4,
          "p99": 30.2
        },
        "acceptance_rate": 1.0,
        "acceptance_length": 4.0,
        "per_position_acceptance": [
          1.0,
          1.0
        ]
      },
      "hardware": "CPU Intel(R) Xeon(R) Platinum 8481C, 2 threads"
    },
    "startup": [
      {
        "stage": "launched",
        "began_s": 0.0,
        "seconds": 13.0
      },
      {
        "stage": "resolving config",
        "began_s": 13.0,
        "seconds": 37.0
      }
    ]
  },
  "updated_at": "2026-12-02T08:01:02Z",
  "history": [
    "2026-12-02T08:00:00Z warming",
    "2026-12-02T08:01:02Z done"
  ]
}
"""

# rollout.json as the first recorded rollout wrote it (74fa7cf): no bench, no startup, no benchmarking phase.
ROLLOUT_JSON_BEFORE_THE_GATE = r"""{
  "phase": "watching",
  "new": {
    "container_id": "c0ffee03",
    "image_id": "sha256:3333333333333333333333333333333333333333333333333333333333333333",
    "config": "d1g35t3",
    "proven_at": null
  },
  "old": null,
  "last_ready": {
    "container_id": "c0ffee02",
    "image_id": "sha256:2222222222222222222222222222222222222222222222222222222222222222",
    "config": "d1g35tn3w",
    "proven_at": "2026-12-01T10:08:35Z"
  },
  "updated_at": "2026-12-01T10:09:00Z",
  "history": [
    "2026-12-01T10:09:00Z watching"
  ]
}
"""

# What the gate wrote for an engine its client does not serve (figures null), beside READY.
BENCH_JSON_SGLANG = r"""{
  "schema": 1,
  "time": "2026-12-02T08:01:30Z",
  "hardware": "CPU test, 2 threads",
  "figures": null,
  "previous": null,
  "gate": {
    "enabled": true,
    "passed": true,
    "problems": [],
    "seconds": 0.0,
    "note": "benchmark gate: not built for sglang yet (vLLM's client only); nothing measured"
  },
  "host": "testbed-1",
  "image": "specdeploy/sglang-cuda:0a1b2c3d4e5f"
}
"""

VERDICT_JSON = r"""{
  "status": "READY",
  "elapsed_s": 33.41,
  "stage": "API server up",
  "headline": "model=tiny-deepseek-v3 completion=8 tokens acceptance=100.0%",
  "root_cause": null,
  "exit_code": null,
  "noise": {
    "future-warning": 4
  },
  "noise_catalogue_version": 2,
  "grammar_version": 3,
  "stages": [
    {
      "stage": "launched",
      "at_s": 0.0
    },
    {
      "stage": "API server up",
      "at_s": 33.22
    }
  ],
  "startup": [
    {
      "stage": "launched",
      "began_s": 0.0,
      "seconds": 33.22
    }
  ],
  "acceptance": {
    "rate": 1.0,
    "mean_length": 4.0,
    "drafts": 2.0,
    "draft_tokens": 6.0,
    "accepted_tokens": 6.0
  },
  "completion": {
    "tokens": 8,
    "text": "!!!!!!!!"
  },
  "stack_summary": [],
  "diagnostics": ".state/runs/testbed-1/20261201T222059-94342",
  "detected_after_exit_s": null,
  "notes": [],
  "memory": {}
}
"""

PREWARM_JSON = r"""{
  "warmed": true,
  "message": "page cache warmed: 5 files, 192.0 MiB; 0.4 s, 0.50 GB/s with 2 readers; 100% of the model resident",
  "model_bytes": 201330000,
  "planned_bytes": 201330000,
  "budget_bytes": 4294967296,
  "readers": 2,
  "seconds": 0.4,
  "gb_per_s": 0.503,
  "resident_fraction": 1.0,
  "partial": false
}
"""


def _lines(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


FIRST, ONE, TWO = "specdeploy/vllm-cpu:17be88d464ba", "sha256:" + "1" * 64, "sha256:" + "2" * 64
CONFIG = json.loads(CURRENT_JSON)["config"]  # the role's serving_config, and api_key_set
ROLLED_BACK = _lines(CURRENT_JSON, (f'"image": "{FIRST}"', f'"image": "{ONE}"'),
                     ('"previous_image_id": null', f'"previous_image_id": "{TWO}"'),
                     ('"2026-12-01T22:20:59.123456789Z"', '"2026-12-02T09:00:00Z"'))  # fmt: skip
KEYED = _lines(CURRENT_JSON, ('"api_key_set": false', '"api_key_set": true'),
               ('"engine_image_drafter_path": ""', '"engine_image_drafter_path": "/data/drafters/kimi-k25-eagle3"'),
               ('"engine_image_profile": "vllm-cpu"', '"engine_image_profile": "vllm-cuda"'))  # fmt: skip
# current.json before `specdeploy verify` recorded what the image was built from (31a359e).
BEFORE_VERIFY = _lines(CURRENT_JSON, ('    "engine_image_drafter_path": "",\n', ""),
                       ('    "engine_image_profile": "vllm-cpu",\n', ""))  # fmt: skip


@pytest.mark.parametrize(
    ("action", "outcome", "key", "extra", "text"),
    [("deploy", Outcome(True, "deployed", "", ONE, None, started_at="2026-12-01T22:20:59.123456789Z"), False, {},
      CURRENT_JSON),
     ("rollback", Outcome(True, "deployed", "", ONE, TWO, started_at="2026-12-02T09:00:00Z"), False, {}, ROLLED_BACK),
     ("deploy", Outcome(True, "deployed", "", ONE, None, started_at="2026-12-01T22:20:59.123456789Z"), True,
      {"engine_image_profile": "vllm-cuda", "engine_image_drafter_path": "/data/drafters/kimi-k25-eagle3"}, KEYED)],
)  # fmt: skip
def test_the_action_writes_current_json_byte_for_byte_as_the_roles_copy_task_did(
    action: str, outcome: Outcome, key: bool, extra: dict[str, str], text: str
) -> None:
    config = {k: v for k, v in CONFIG.items() if k != "api_key_set"}
    args = {"action": action, "image": FIRST if action == "deploy" else None, "config": config,
            "engine_image_profile": "vllm-cpu", "engine_image_drafter_path": "", **extra}  # fmt: skip
    serving = deploy_parts.serving(outcome, args, key)
    assert serving.to_json() == text
    assert Serving.from_json(text) == serving


def test_current_json_of_every_version_reads_and_an_older_one_writes_back_unchanged() -> None:
    first, old = Serving.from_json(CURRENT_JSON), Serving.from_json(BEFORE_VERIFY)
    assert (first.image, first.image_id, first.previous_image_id) == (FIRST, ONE, None)
    assert first.container == "specdeploy-engine"
    assert first.config["nccl"]["env"] == {"NCCL_P2P_DISABLE": "1"} and first.config["api_key_set"] is False
    assert (first.engine_image_profile, first.engine_image_drafter_path) == ("vllm-cpu", "")
    assert (old.engine_image_profile, old.engine_image_drafter_path) == (None, None) and old.to_json() == BEFORE_VERIFY
    assert Serving.from_json(ROLLED_BACK).previous_image_id == TWO
    with pytest.raises(ValueError, match="not a serving record"):
        Serving.from_json('{"image": "x"}')


def test_rollout_json_of_today_round_trips_and_the_first_shape_still_reads() -> None:
    today = RolloutRecord.from_json(ROLLOUT_JSON)
    assert today.to_json() == ROLLOUT_JSON
    assert today.last_ready is not None and today.proves("c0ffee02")
    assert today.last_ready.bench is not None and today.last_ready.bench["figures"]["max_tokens"] == 20
    first = RolloutRecord.from_json(ROLLOUT_JSON_BEFORE_THE_GATE)
    assert first.phase == "watching" and first.new is not None and first.new.proven_at is None
    assert first.last_ready is not None and (first.last_ready.bench, first.last_ready.startup) == (None, None)
    assert RolloutRecord.from_json("") == RolloutRecord()  # a host nothing was rolled out on
    with pytest.raises(SpecdeployError, match="unknown phase 'flying'"):
        RolloutRecord.from_json('{"phase": "flying"}')


def test_a_stamp_names_the_phase_and_keeps_the_last_twenty_steps() -> None:
    record = RolloutRecord(history=[f"t{i} warming" for i in range(25)]).stamp("watching")
    assert record.phase == "watching" and len(record.history) == records.HISTORY
    assert record.history[-1] == f"{record.updated_at} watching" and record.history[0] == "t6 warming"


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The host is this machine (CommandHost() runs here); sudo -n is dropped so a non-root run works too."""
    scripts: list[str] = []
    real = subprocess.run

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        scripts.append(argv[-1])
        return real([*argv[:-1], argv[-1].replace("sudo -n ", "")], **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(records.subprocess, "run", run)
    return scripts


def test_host_records_are_written_atomically_and_read_back(host: list[str], tmp_path: Path) -> None:
    store = HostRecords(CommandHost(), str(tmp_path / "serving") + "/")
    assert store.load() == RolloutRecord() and store.serving() is None  # nothing there yet
    store.save(RolloutRecord.from_json(ROLLOUT_JSON))
    store.record_serving(Serving.from_json(CURRENT_JSON))
    assert (tmp_path / "serving/rollout.json").read_text() == ROLLOUT_JSON
    assert (tmp_path / "serving/current.json").read_text() == CURRENT_JSON
    assert store.serving() == Serving.from_json(CURRENT_JSON) and store.load().proves("c0ffee02")
    assert sorted(p.name for p in (tmp_path / "serving").iterdir()) == ["current.json", "rollout.json"]
    assert (tmp_path / "serving/current.json").stat().st_mode & 0o777 == 0o644
    assert all("mv -f" in s and "sudo -n" in s for s in host if "cat >" in s)  # temp, sync, rename; sudo when not root


def test_a_host_that_refuses_names_the_file(host: list[str], tmp_path: Path) -> None:
    (tmp_path / "serving").write_text("a file where the folder should be")
    with pytest.raises(SpecdeployError, match=r"writing .*/serving/current.json on this machine failed"):
        HostRecords(CommandHost(), str(tmp_path / "serving")).record_serving(Serving.from_json(CURRENT_JSON))


def test_verdict_and_prewarm_are_written_as_before_and_read_back_typed(tmp_path: Path) -> None:
    verdict = Verdict(**json.loads(VERDICT_JSON))
    assert records.write_verdict(tmp_path, asdict(verdict)).read_text() == VERDICT_JSON
    read = records.read_verdict(tmp_path)
    assert (read.status, read.elapsed_s, read.acceptance_length) == ("READY", 33.41, 4.0)
    assert read.stages[-1] == records.Stage("API server up", 33.22)
    assert records.read_prewarm(tmp_path) is None  # a rollback's start-up has none
    report = PrewarmReport(**json.loads(PREWARM_JSON))
    assert records.write_prewarm(tmp_path, report).read_text() == PREWARM_JSON
    assert records.read_prewarm(tmp_path) == report


def test_bench_json_as_the_gate_writes_it_reads_back_into_its_figures(tmp_path: Path) -> None:
    result = gate()(FakeEngineContainer(REAL), READY, None)
    path = records.write_bench(tmp_path, result.report, "testbed-1", FIRST)  # as the action wrote it until now
    assert path.read_text() == json.dumps({**result.report, "host": "testbed-1", "image": FIRST}, indent=2) + "\n"
    bench = records.read_bench(tmp_path)
    assert isinstance(bench, Bench) and bench.image == FIRST and bench.gate.passed and bench.previous is None
    assert (bench.image_id, bench.config_digest) == ("", "")
    # Now with the version's id and configuration digest, which the report shows.
    records.write_bench(tmp_path, result.report, "testbed-1", FIRST, image_id=ONE, config_digest="d1g35t")
    assert replace(bench, image_id=ONE, config_digest="d1g35t") == records.read_bench(tmp_path)
    assert bench.figures == Figures.from_dict(result.report["figures"])
    assert "no earlier benchmark" in bench.gate.note


def test_a_bench_json_with_nothing_measured_is_the_gates_judgement_alone(tmp_path: Path) -> None:
    (tmp_path / "bench.json").write_text(BENCH_JSON_SGLANG)
    assert records.read_bench(tmp_path) == Gate(True, True, (), 0.0, json.loads(BENCH_JSON_SGLANG)["gate"]["note"])
    broken = gate()(FakeEngineContainer(None, exit_code=1, stderr=b"ValueError: boom\n"), READY, None)
    records.write_bench(tmp_path, broken.report, "testbed-1", FIRST)
    judged = records.read_bench(tmp_path)
    assert isinstance(judged, Gate) and not judged.passed and "could not run" in judged.problems[0]


def test_container_json_never_holds_the_api_key_and_names_its_image(tmp_path: Path) -> None:
    attrs = {"Id": "c0ffee03", "Name": "/specdeploy-engine", "Image": ONE, "State": {"Status": "exited"},
             "Config": {"Image": FIRST, "Env": ["VLLM_API_KEY=sk-secret", "PATH=/usr/bin"]}, "HostConfig": {},
             "Mounts": []}  # fmt: skip
    text = records.write_container(tmp_path, attrs).read_text()
    assert "sk-secret" not in text and json.loads(text)["Config"]["Env"] == ["PATH=/usr/bin"] and "Mounts" not in text
    assert records.container_image(tmp_path) == FIRST and records.container_image(tmp_path / "none") == ""


def test_the_run_folders_sort_by_time_and_an_image_build_or_a_baseline_is_no_rollout(tmp_path: Path) -> None:
    root = records.runs_root(tmp_path)
    assert records.host_runs("testbed-1", tmp_path) == tmp_path / "runs" / "testbed-1"
    for run in ("20261201T100000-2", "20261201T090000-1"):
        records.write_verdict(records.host_runs("testbed-1", tmp_path) / run, json.loads(VERDICT_JSON))
    (records.host_runs("testbed-1", tmp_path) / "20261201T085500").mkdir()  # image-build.log only
    baseline = records.host_runs("testbed-1", tmp_path) / "20261201T095000-3"  # the speculation-off start-up
    records.write_verdict(baseline, json.loads(VERDICT_JSON))
    records.write_baseline(baseline, {"sweep": [{"concurrency": 1, "output_tokens_per_s": 56.4}]})
    assert [p.name for p in records.rollout_runs(root / "testbed-1")] == ["20261201T090000-1", "20261201T100000-2"]
    assert records.host_folders(root) == [root / "testbed-1"] and records.host_folders(tmp_path / "none") == []
    assert records.read_verdict(root / "testbed-1/20261201T090000-1").status == "READY"


def test_no_role_writes_a_host_record_itself() -> None:
    """One writer per record: the roles hand what current.json needs to specdeploy_serve, which writes it."""
    tasks = sorted((ROOT / "roles").glob("*/tasks/*.yml"))
    assert not [t.name for t in tasks if re.search(r"(dest|path|src): .*(current|rollout)\.json", t.read_text())]
    for name in ("main.yml", "rollback.yml"):
        text = (ROOT / "roles/serving/tasks" / name).read_text()
        assert 'engine_image_profile: "{{ engine_image_profile | default(omit) }}"' in text, name
