"""The GPU machine's gate step (`on_device.py gate`): the benchmark gate's own code, its client run as
a local process from a site folder. Here the site holds a simulated `vllm` whose `bench serve` writes a
result in the client's layout: what runs on the H200 is the real vLLM."""

from __future__ import annotations

import argparse
import http.server
import json
import shutil
import sys
import tarfile
import textwrap
import threading
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpu_truth import carried_cache, on_device
from gpu_truth import machine as gpu_machine

from specdeploy.gate import rules
from specdeploy.gate.client import WORKDIR, tar_archive

# A simulated `python -m vllm.entrypoints.cli.main bench serve`: the result file the gate reads, with
# 100 tok/s per request in flight, and the spec-decode counters only while SPEC exists (the drafter on).
FAKE_CLI = """
import json, os, sys
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
level = int(opt("--max-concurrency"))
doc = {"completed": int(opt("--num-prompts")), "failed": 0, "duration": 1.0,
       "output_throughput": (130.0 if os.path.exists(SPEC) else 100.0) * min(level, 8),
       "p50_ttft_ms": 5, "p99_ttft_ms": 9, "p50_itl_ms": 1, "p99_itl_ms": 2}
if os.path.exists(SPEC):
    doc |= {"spec_decode_acceptance_rate": 90.0, "spec_decode_acceptance_length": 3.7,
            "spec_decode_per_position_acceptance_rates": [0.95, 0.9, 0.85]}
os.makedirs(opt("--result-dir"), exist_ok=True)
json.dump(doc, open(os.path.join(opt("--result-dir"), opt("--result-filename")), "w"))
"""


@dataclass
class Machine:
    root: Path
    started: list[str]  # the speculative method of each engine started, in order


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    """The store, $OUT and a site with the simulated client; engines 'start' READY and 'stop'."""
    spec = tmp_path / "spec-on"
    cli = tmp_path / "store" / "site-vllm" / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for folder in (cli.parent.parent, cli.parent, cli):
        (folder / "__init__.py").write_text("")
    (cli / "main.py").write_text(f"SPEC = {str(spec)!r}\n" + textwrap.dedent(FAKE_CLI))
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    monkeypatch.setattr(gpu_machine, "OUT", tmp_path / "out")
    monkeypatch.setattr(on_device, "tiny_models", lambda *_: tmp_path / "models")
    monkeypatch.setattr(on_device, "place", lambda *_: None)
    started: list[str] = []

    def start(config, args, out: Path) -> tuple[int, str, float]:
        started.append(config.speculative_method)
        spec.unlink(missing_ok=True) if config.speculative_method == "none" else spec.touch()
        out.mkdir(parents=True, exist_ok=True)
        (out / "verdict.json").write_text(json.dumps({"status": "READY"}))
        ran = on_device.test_only(on_device.engine_argv(config.command()), args.engine, args)[0]
        (out / "command.json").write_text(json.dumps({"ran": ran}))
        (out / "engine.log").write_text("INFO:     Application startup complete.\n")
        return 0, "READY 1.0 s", 1.0

    monkeypatch.setattr(on_device, "start_watched", start)
    monkeypatch.setattr(on_device, "stop_engines", lambda: None)
    return Machine(tmp_path, started)


def call(*argv: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sys.argv", ["on_device.py", "gate", "vllm", "--set", "serving_bench_sweep=[1, 4, 16]",
                                     "--set", "serving_bench_budget_s=45", *argv])  # fmt: skip
    return on_device.main()


def test_the_baseline_is_kept_then_judges_the_speculative_sweep(machine: Machine, monkeypatch) -> None:
    assert call("--baseline", "--engine-version", "0.26.0", monkeypatch=monkeypatch) == 0
    kept = json.loads((machine.root / "out" / "baseline.json").read_text())
    assert [p["concurrency"] for p in kept["sweep"]] == [1, 4, 16] and kept["key"].startswith("sha256:")
    assert [p["output_tokens_per_s"] for p in kept["sweep"]] == [100.0, 400.0, 800.0]

    assert call("--engine-version", "0.26.0", monkeypatch=monkeypatch) == 0
    assert machine.started == ["none", "eagle3"]
    bench = json.loads((machine.root / "out" / "bench.json").read_text())
    assert bench["speedup"] == {"1": 1.3, "4": 1.3, "16": 1.3}
    assert bench["crossover"].startswith("EAGLE-3 pays at every measured concurrency on this host, up to 16")
    assert bench["gate"]["passed"] and bench["figures"]["acceptance_length"] == 3.7


def test_a_baseline_of_another_engine_version_is_not_taken(machine: Machine, monkeypatch) -> None:
    assert call("--baseline", "--engine-version", "0.26.0", monkeypatch=monkeypatch) == 0
    assert call("--engine-version", "0.27.0", monkeypatch=monkeypatch) == 0
    bench = json.loads((machine.root / "out" / "bench.json").read_text())
    assert bench["baseline"] is None and "speedup" not in bench


def test_a_baseline_from_an_earlier_session_judges_only_its_own_configuration(machine: Machine, monkeypatch) -> None:
    assert call("--baseline", "--engine-version", "0.26.0", monkeypatch=monkeypatch) == 0
    carried = machine.root / "carried-baseline.json"
    carried.write_text((machine.root / "out" / "baseline.json").read_text())
    shutil.rmtree(machine.root / "store" / "baselines")  # a fresh machine: nothing of its own
    assert call("--engine-version", "0.26.0", "--baseline-file", str(carried), monkeypatch=monkeypatch) == 0
    assert json.loads((machine.root / "out" / "bench.json").read_text())["speedup"] == {"1": 1.3, "4": 1.3, "16": 1.3}
    with pytest.raises(SystemExit, match="is not this configuration's"):
        call("--engine-version", "0.27.0", "--baseline-file", str(carried), monkeypatch=monkeypatch)


def test_a_gate_in_two_calls_measures_the_engine_the_first_left_ready(machine: Machine, monkeypatch) -> None:
    # A cold start on the H100 took 442 s of a call's 570: the start and the measuring get a call each.
    monkeypatch.setattr(on_device, "engine_groups", lambda: {4242})
    monkeypatch.setattr(on_device, "get_json", lambda url, timeout=10: {"data": []})
    with pytest.raises(SystemExit, match="--phase up first"):
        call("--baseline", "--phase", "measure", monkeypatch=monkeypatch)
    assert call("--baseline", "--phase", "up", monkeypatch=monkeypatch) == 0
    assert machine.started == ["none"] and not (machine.root / "out" / "baseline.json").exists()
    assert (machine.root / "out" / "baseline" / "engine.log").is_file()  # the up call returns the start's log
    shutil.rmtree(machine.root / "out")  # `pack` empties $OUT; the engine runs on, logging into the store
    with (machine.root / "store" / "up" / "baseline" / "engine.log").open("a") as live:
        live.write('INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    with pytest.raises(SystemExit, match="another command"):
        call("--baseline", "--phase", "measure", "--set", "serving_max_model_len=4096", monkeypatch=monkeypatch)
    # a second up call of the same command (planned for a start that may outrun one call) finds it READY
    assert call("--baseline", "--phase", "up", monkeypatch=monkeypatch) == 0
    assert machine.started == ["none"]
    assert call("--baseline", "--phase", "measure", monkeypatch=monkeypatch) == 0
    assert machine.started == ["none"]  # measured, not started again
    assert [p["concurrency"] for p in json.loads((machine.root / "out" / "baseline.json").read_text())["sweep"]] == [
        1, 4, 16]  # fmt: skip
    # each client run kept as it finished (a call cut at its bound keeps the levels it measured)
    runs = (machine.root / "out" / "client-runs.jsonl").read_text().splitlines()
    assert len(runs) >= 3 and all("output_throughput" in json.loads(r)["result"] for r in runs)
    log = (machine.root / "out" / "baseline" / "engine.log").read_text()
    assert "startup complete" in log and log.endswith("200 OK\n")  # the start, then the measuring's traffic


def test_the_rust_client_measures_in_its_own_key_and_is_named(machine: Machine, monkeypatch) -> None:
    """--rust-client runs vLLM's own Rust binary for `vllm bench serve` (simulated here: the same result
    file, and each run's argv noted); a baseline another client measured is not divided by."""
    rust = machine.root / "store" / "site-vllm" / "vllm" / "vllm-rs"
    ran = machine.root / "rust-runs"
    rust.write_text(f"#!{sys.executable}\nimport sys\nopen({str(ran)!r}, 'a').write(' '.join(sys.argv[1:3]) + '\\n')\n"
                    "SPEC = " + repr(str(machine.root / "spec-on")) + "\n" + textwrap.dedent(FAKE_CLI))  # fmt: skip
    assert call("--baseline", "--engine-version", "0.33.0", monkeypatch=monkeypatch) == 0  # the Python client
    assert not ran.exists()
    python_key = json.loads((machine.root / "out" / "baseline.json").read_text())["key"]
    assert call("--engine-version", "0.33.0", "--rust-client", monkeypatch=monkeypatch) == 0
    assert ran.read_text().splitlines()[0] == "bench serve"  # the binary, not python -m vllm...
    bench = json.loads((machine.root / "out" / "bench.json").read_text())
    assert bench["baseline"] is None and bench["client"] == on_device.RUST_CLIENT  # not the Python client's
    assert call("--baseline", "--engine-version", "0.33.0", "--rust-client", monkeypatch=monkeypatch) == 0
    kept = json.loads((machine.root / "out" / "baseline.json").read_text())
    assert kept["key"] != python_key and kept["client"] == on_device.RUST_CLIENT
    assert call("--engine-version", "0.33.0", "--rust-client", monkeypatch=monkeypatch) == 0
    assert json.loads((machine.root / "out" / "bench.json").read_text())["speedup"] == {"1": 1.3, "4": 1.3, "16": 1.3}
    rust.unlink()
    with pytest.raises(SystemExit, match=r"--rust-client: no .*vllm-rs"):
        call("--engine-version", "0.33.0", "--rust-client", monkeypatch=monkeypatch)


def test_the_local_exec_runs_the_command_here_and_splits_its_streams(tmp_path: Path) -> None:
    local = on_device.LocalExec(str(tmp_path))
    done = local.exec_run(["sh", "-c", "echo out; echo err >&2; exit 3"], environment={"X": "1"}, demux=True)
    assert (done.exit_code, done.output) == (3, (b"out\n", b"err\n"))
    assert local.put_archive(str(tmp_path / "d"), tar_archive({"a.json": b"{}"}))
    assert (tmp_path / "d" / "a.json").read_bytes() == b"{}"
    # the client's fixed folder is private to each LocalExec: two runs on one machine do not share it
    other = on_device.LocalExec(str(tmp_path))
    assert local.put_archive(WORKDIR, tar_archive({"result.json": b"1"}))
    assert other.put_archive(WORKDIR, tar_archive({"result.json": b"2"}))
    assert local.exec_run(["cat", f"{WORKDIR}/result.json"]).output == b"1"
    assert other.exec_run(["cat", f"{WORKDIR}/result.json"]).output == b"2"


RUNS = Path(__file__).resolve().parents[2] / "data" / "gpu_truth"


@pytest.mark.parametrize("run", ["vllm-gate-budget60", "vllm-gate-budget180"])
def test_the_h200_gate_runs_are_todays_rendering_and_rules(run: str) -> None:
    """The H200's sweeps (vLLM 0.26.0, 2026-12-02): the speed-ups and the crossover line are what the
    gate's rules make of the two recorded sweeps, and the commands are today's rendering of the
    inventory (a change fails this: the runs are owed again)."""
    bench = json.loads((RUNS / run / "bench.json").read_text())
    speedup = rules.speedups(bench["sweep"], bench["baseline"]["sweep"])
    assert {str(c): s for c, s in speedup.items()} == bench["speedup"] and set(speedup) == {1, 4, 16, 64}
    assert bench["crossover"] == rules.crossover(speedup)
    assert bench["gate"]["passed"] and bench["figures"]["acceptance_length"] == 4.0
    assert "H200" in bench["hardware"] and bench["baseline"]["hardware"] == bench["hardware"]
    for name, method in (("command.json", "eagle3"), ("baseline-command.json", "none")):
        record = json.loads((RUNS / run / name).read_text())
        values = on_device.inventory_vars(RUNS.parents[2] / record["inventory"], record["overrides"])
        config = on_device.render(values)
        assert (config if method == "eagle3" else config.speculation_off()).command() == record["rendered_command"]


H100_BASELINES = [("vllm-0.33-full-depth-h100-gate", "vllm", "0.33.0"),
                  ("sglang-0.5.23-full-depth-h100-gate", "sglang", "0.5.23")]  # fmt: skip


@pytest.mark.parametrize(("folder", "engine", "version"), H100_BASELINES)
def test_the_h100_full_depth_baseline_is_todays_rendering_and_key_and_its_sweeps_agree(
    folder: str, engine: str, version: str
) -> None:
    """The speculation-off baseline of Kimi-K2.5 at full depth (16 experts a layer) on the H100 (vLLM
    0.33.0, 2026-12-06; SGLang 0.5.23, 2026-12-07): what the next session's speculative calls take as
    --baseline-file. Its command is today's rendering and its key is the one today's gate computes for
    that engine, form and hardware (a change fails this: the baseline is owed again); every level
    completed in both sweeps."""
    run = RUNS / folder
    base = json.loads((run / "baseline.json").read_text())
    record = json.loads((run / "spec-off-command.json").read_text())
    overrides = [f"specdeploy_engine={engine}", *record["overrides"]]  # as `gate ENGINE` sets it
    values = on_device.inventory_vars(RUNS.parents[2] / record["inventory"], overrides)
    config = on_device.render(values)
    assert config.speculation_off().command() == record["rendered_command"]
    judge = on_device.benchmark_gate(values, config, base["hardware"])
    assert on_device.baseline_key(judge, config, record["model_form"], version) == base["key"]
    assert json.loads((run / "spec-off-verdict.json").read_text())["status"] == "READY"
    assert record["model_form"] == {"form": "full-depth", "layers": 61, "routed_experts_per_layer": 16}
    first, second = base["sweep"], base["repeats"][0]
    assert [p["concurrency"] for p in first] == [p["concurrency"] for p in second] == [1, 4, 16, 64]
    assert all(rules.measured(p) for p in first + second)
    for a, b in zip(first, second, strict=True):  # one engine measured twice: within 5 % at every level
        assert abs(a["output_tokens_per_s"] / b["output_tokens_per_s"] - 1) < 0.05, (a, b)


# (folder, engine, tag, acceptance, the levels where EAGLE-3 paid in both runs)
H100_GATES = [("vllm-0.33-full-depth-h100-gate", "vllm", "acc2.3", 2.3, [1, 4, 16]),
              ("vllm-0.33-full-depth-h100-gate", "vllm", "acc1.6", 1.6, [1, 4, 16]),
              ("sglang-0.5.23-full-depth-h100-gate", "sglang", "acc2.3", 2.3, [1, 4, 16, 64])]  # fmt: skip
# How each harness sets the acceptance (a test-only setting named in command.json)
SET_ACCEPTANCE = {"vllm": "synthetic_acceptance_length", "sglang": "SGLANG_SIMULATE_ACC_LEN"}


@pytest.mark.parametrize(("folder", "engine", "tag", "acceptance", "pays"), H100_GATES)
def test_the_h100_full_depth_gate_is_todays_rendering_rules_and_baseline_and_its_repeats_agree(
    folder: str, engine: str, tag: str, acceptance: float, pays: list[int]
) -> None:
    """The gate at full depth (16 experts a layer) on the H100 at a set acceptance (vLLM 0.33.0,
    2026-12-06; SGLang 0.5.23, 2026-12-07): each speculative run was judged against the kept baseline (its
    key), its speed-ups and crossover are what today's rules make of the recorded sweeps, its command is
    today's rendering, the acceptance measured is the one set, and the two sweeps of the same engine name
    the same crossover (issue 40: both runs must agree)."""
    run = RUNS / folder
    base = json.loads((run / "baseline.json").read_text())
    bench = json.loads((run / f"{tag}-bench.json").read_text())
    record = json.loads((run / f"{tag}-command.json").read_text())
    overrides = [f"specdeploy_engine={engine}", *record["overrides"]]  # as `gate ENGINE` sets it
    values = on_device.inventory_vars(RUNS.parents[2] / record["inventory"], overrides)
    assert on_device.render(values).command() == record["rendered_command"]
    assert record["test_only"][SET_ACCEPTANCE[engine]] == acceptance
    assert bench["baseline"]["key"] == base["key"] and bench["baseline"]["sweep"] == base["sweep"]
    assert bench["hardware"] == base["hardware"] and "H100" in bench["hardware"]
    assert bench["gate"]["passed"] and abs(bench["figures"]["acceptance_length"] - acceptance) < 0.05
    (repeat,) = bench["repeats"]
    assert repeat["baseline_sweep"] == base["repeats"][0]
    lines = []
    for sweep, baseline, kept, line in ((bench["sweep"], base["sweep"], bench["speedup"], bench["crossover"]),
                                        (repeat["sweep"], repeat["baseline_sweep"], repeat["speedup"],
                                         repeat["crossover"])):  # fmt: skip
        assert all(rules.measured(p) for p in sweep) and [p["concurrency"] for p in sweep] == [1, 4, 16, 64]
        assert all(abs(p["acceptance_length"] - acceptance) < 0.1 for p in sweep), sweep
        speedup = rules.speedups(sweep, baseline)
        assert {str(c): s for c, s in speedup.items()} == kept and line == rules.crossover(speedup)
        lines.append([c for c, s in sorted(speedup.items()) if s >= 1.0])
    assert lines[0] == lines[1] == pays, lines  # the same crossover in both runs


def test_the_sglang_full_depth_runs_are_todays_rendering_and_say_what_they_proved() -> None:
    """SGLang 0.5.23 at Kimi-K2.5's full depth on the H100 (2026-12-06): both commands are today's
    rendering; the speculative engine (EAGLE-3, acceptance set 2.3) answered a completion (READY), served
    text-only by the form's config, not by the flag 0.5.23 refuses; the speculation-off start was called
    STALLED while SGLang built its Marlin MoE kernel (its stacks say so: the watch now counts a build as
    progress). No gate figures: the measuring was cut by the session's device time."""
    run = RUNS / "sglang-0.5.23-full-depth-h100"
    for tag in ("spec-off", "acc2.3"):
        record = json.loads((run / f"{tag}-command.json").read_text())
        engine = ["specdeploy_engine=sglang", *record["overrides"]]  # as `gate sglang` sets it
        config = on_device.render(on_device.inventory_vars(RUNS.parents[2] / record["inventory"], engine))
        assert (config.speculation_off() if tag == "spec-off" else config).command() == record["rendered_command"]
        assert record["test_only"]["config_language_model_only"] is True
        assert "--language-model-only" not in record["ran"]
        assert record["model_form"] == {"form": "full-depth", "layers": 61, "routed_experts_per_layer": 16}
    ready = json.loads((run / "acc2.3-verdict.json").read_text())
    assert ready["status"] == "READY" and ready["completion"]["tokens"] == 8
    assert json.loads((run / "acc2.3-command.json").read_text())["test_only"]["SGLANG_SIMULATE_ACC_LEN"] == 2.3
    stalled = json.loads((run / "spec-off-verdict.json").read_text())
    assert stalled["status"] == "STALLED" and "_jit_moe_wna16_marlin_module" in stalled["headline"]
    assert "ninja.py" in (run / "spec-off-stacks.txt").read_text()


def test_repeats_measure_the_same_engine_again_each_against_its_own_baseline_sweep(machine: Machine,
                                                                                  monkeypatch) -> None:  # fmt: skip
    assert call("--baseline", "--repeat", "2", "--engine-version", "0.33.0", monkeypatch=monkeypatch) == 0
    kept = json.loads((machine.root / "out" / "baseline.json").read_text())
    assert len(kept["repeats"]) == 1 and [p["concurrency"] for p in kept["repeats"][0]] == [1, 4, 16]
    assert call("--repeat", "2", "--engine-version", "0.33.0", monkeypatch=monkeypatch) == 0
    assert machine.started == ["none", "eagle3"]  # one start each: the repeats measure the READY engine
    bench = json.loads((machine.root / "out" / "bench.json").read_text())
    (repeat,) = bench["repeats"]
    assert repeat["speedup"] == {"1": 1.3, "4": 1.3, "16": 1.3} and repeat["baseline_sweep"] == kept["repeats"][0]
    assert repeat["crossover"] == bench["crossover"]


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"dummy_load": False, "acceptance": 0.0, **kw})


def test_the_test_only_settings_are_added_to_the_rendering_and_named() -> None:
    spec = '{"method":"eagle3","model":"/opt/drafter","num_speculative_tokens":3}'
    argv, env, named = on_device.test_only(["x", "--speculative-config", spec], "vllm",
                                           _args(dummy_load=True, acceptance=2.3))  # fmt: skip
    assert argv[-2:] == ["--load-format", "dummy"] and env == {}
    assert json.loads(argv[2]) == {**json.loads(spec), "rejection_sample_method": "synthetic",
                                   "synthetic_acceptance_length": 2.3}  # fmt: skip
    assert named == {"load_format": "dummy", "synthetic_acceptance_length": 2.3}
    # speculation off: nothing to set the acceptance of
    assert on_device.test_only(["x"], "vllm", _args(acceptance=2.3)) == (["x"], {}, {})
    argv, env, named = on_device.test_only(["x", "--speculative-algorithm", "EAGLE3"], "sglang", _args(acceptance=1.6))
    assert env == {"SGLANG_SIMULATE_ACC_LEN": "1.6", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
                   "SGLANG_JIT_CACHE_DEBUG": "1"}  # fmt: skip
    assert named["SGLANG_SIMULATE_ACC_LEN"] == 1.6 and argv == ["x", "--speculative-algorithm", "EAGLE3"]
    # SGLang on a Kimi-K2.5 form: text only by the form's config (0.5.23 refuses the flag for the
    # architecture), so the command stays the rendered one and the record names the setting
    for form in (_args(form="full-depth"), _args(architecture="kimi_k25")):
        argv, _, named = on_device.test_only(["x"], "sglang", form)
        assert argv == ["x"] and named == {"config_language_model_only": True, "SGLANG_JIT_CACHE_DEBUG": "1"}
    # every SGLang start says why it passed over a JIT build it found (the H100's misses of 2026-12-07)
    debug = {"SGLANG_JIT_CACHE_DEBUG": "1"}
    assert on_device.test_only(["x"], "sglang", _args(architecture="deepseek_v3")) == (["x"], debug, debug)
    assert on_device.test_only(["x"], "vllm", _args(form="full-depth")) == (["x"], {}, {})


def test_the_text_only_variant_changes_only_the_target_config(tmp_path: Path) -> None:
    models = tmp_path / "kimi"
    (models / "target").mkdir(parents=True)
    (models / "drafter").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"]}))
    (models / "target" / "tokenizer.json").write_text("{}")
    (models / "drafter" / "config.json").write_text('{"d": 1}')
    variant = on_device.text_only_variant(models)
    assert json.loads((variant / "target" / "config.json").read_text()) == {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "language_model_only": True,
    }
    assert json.loads((models / "target" / "config.json").read_text()).get("language_model_only") is None
    assert (variant / "target" / "tokenizer.json").read_text() == "{}"
    assert (variant / "drafter" / "config.json").read_text() == '{"d": 1}'
    assert on_device.text_only_variant(models) == variant  # made once


def test_a_dummy_load_never_fights_a_rendered_loader() -> None:
    with pytest.raises(SystemExit, match="--load-format already"):
        on_device.test_only(["x", "--load-format", "fastsafetensors"], "vllm", _args(dummy_load=True))


def test_pack_leaves_one_file_holding_everything(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    (out / "speculative" / "diagnostics" / "x").mkdir(parents=True)
    (out / "speculative" / "diagnostics" / "x" / "stacks.txt").write_text("deep")
    (out / "bench.json").write_text("{}")
    monkeypatch.setattr(gpu_machine, "OUT", out)
    on_device.pack("acc2.3")
    assert [p.name for p in out.iterdir()] == ["acc2.3.tgz"]
    with tarfile.open(out / "acc2.3.tgz") as tar:
        assert {"bench.json", "speculative/diagnostics/x/stacks.txt"} <= set(tar.getnames())


def test_a_gate_call_is_bounded_by_what_is_left_of_the_sessions_device_time(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    now = [10_000.0]
    monkeypatch.setattr(on_device.time, "time", lambda: now[0])
    on_device.receive()  # the machine's first call marks when it was taken (its start counted in)
    assert on_device.held_since() == 10_000.0 - on_device.MACHINE_START_S
    assert on_device.bound(570) == 570
    now[0] += 1_300  # 1,330 s held: 470 left, less the margin to stop and pack
    assert on_device.bound(570) == on_device.SESSION_S - 1_330 - on_device.PACK_MARGIN_S
    on_device.receive()  # a later call keeps the first mark
    assert on_device.held_since() == 10_000.0 - on_device.MACHINE_START_S
    now[0] += 3_600
    assert on_device.bound(570) == 1


def test_the_budget_left_in_an_answer_resets_the_bounds_clock(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    now = [10_000.0]
    monkeypatch.setattr(on_device.time, "time", lambda: now[0])
    on_device.receive(1_800)  # the first call assumes a MACHINE_START_S start
    now[0] += 10
    on_device.receive(left_s=1_500)  # its answer said 1,500 left: the start was charged 290 s, not 30
    assert on_device.bound(570) == 570
    now[0] += 1_200
    assert on_device.bound(570) == 1_500 - 1_200 - on_device.PACK_MARGIN_S
    on_device.receive()  # a later call without it keeps the reading
    assert on_device.bound(570) == 1_500 - 1_200 - on_device.PACK_MARGIN_S


def test_a_session_resumed_with_less_device_time_bounds_its_calls_by_what_status_said(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    now = [10_000.0]
    monkeypatch.setattr(on_device.time, "time", lambda: now[0])
    on_device.receive(1_000)
    on_device.receive(1_800)  # only the first call's figure counts
    now[0] += 600  # 630 s held of 1,000
    assert on_device.bound(570) == 1_000 - 630 - on_device.PACK_MARGIN_S


@pytest.mark.parametrize(("arg", "mib", "experts"), [("auto", 143_771, 32), ("auto", 81_559, 16), ("24", 81_559, 24)])
def test_the_full_depth_form_keeps_the_experts_the_lent_gpu_holds(arg: str, mib: int, experts: int) -> None:
    # nvidia-smi's memory.total on the lent H200 and H100 (KINDS.md): 32 experts (66.86 GiB of weights,
    # measured) do not fit the H100's 80 GB with a KV cache; 16 do.
    assert on_device.experts_for(arg, mib) == experts


def test_the_model_form_is_part_of_the_baseline_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(on_device, "experts_for", lambda arg, mib=None: 16 if arg == "auto" else int(arg))
    h100 = argparse.Namespace(form="full-depth", layers=61, experts="auto", architecture="kimi_k25")
    h200 = argparse.Namespace(form="full-depth", layers=61, experts="32", architecture="kimi_k25")
    assert on_device.model_form(h100) == {"form": "full-depth", "layers": 61, "routed_experts_per_layer": 16}
    assert json.dumps(on_device.model_form(h100)) != json.dumps(on_device.model_form(h200))


def test_the_harness_mounts_the_products_engine_cache_keyed_by_the_carried_payload(tmp_path, monkeypatch) -> None:
    """issue 36 through the GPU harness: the product's cache variables (serve.engine_cache), their folder
    keyed by the payload's digest (that machine's image) and the architecture, linked at CACHE_MOUNT."""
    from specdeploy.serve import engine_cache  # noqa: PLC0415

    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    placed: list[tuple[Path, Path]] = []
    monkeypatch.setattr(on_device, "place", lambda link, to: placed.append((link, to)))
    (tmp_path / "store" / "sglang").mkdir(parents=True)
    (tmp_path / "store" / "sglang" / "SHA256SUMS").write_text(f"{'cd' * 32}  payload.tar\n")
    values = on_device.inventory_vars(
        gpu_machine.ROOT / "inventories/gpu-h200-full-depth", ["specdeploy_engine=sglang"]
    )
    args = argparse.Namespace(engine="sglang", no_engine_cache=False)
    config = on_device.with_engine_cache(on_device.render(values), args)
    folder = tmp_path / "store" / "engine-cache" / "sglang-cdcdcdcdcdcd-cpu"  # (no nvidia-smi here)
    assert config.cache_dir == str(folder) and folder.is_dir()
    assert placed == [(Path(engine_cache.CACHE_MOUNT), folder)]
    assert config.environment()["SGLANG_CACHE_DIR"] == f"{engine_cache.CACHE_MOUNT}/sglang"
    off = on_device.with_engine_cache(
        on_device.render(values), argparse.Namespace(engine="sglang", no_engine_cache=True)
    )
    assert "SGLANG_CACHE_DIR" not in off.environment()
    # a cache an earlier machine carried seeds the folder of the same key before the start
    seeded = tmp_path / "cache-made-there" / "engine-cache" / folder.name / "sglang-jit" / "sm90"
    seeded.mkdir(parents=True)
    (seeded / "module.so").write_bytes(b"built")
    monkeypatch.setattr(gpu_machine, "OUT", tmp_path / "out")
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "cache-made-there")
    carried_cache.cache_out("sglang", [])
    carried_cache.keep(tmp_path / "out", into=tmp_path / "store" / "carried-cache")
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    on_device.with_engine_cache(on_device.render(values), args)
    assert (folder / "sglang-jit" / "sm90" / "module.so").read_bytes() == b"built"


def test_a_start_still_making_progress_at_the_calls_end_is_watched_on_by_the_next_up(machine: Machine,
                                                                                    monkeypatch) -> None:  # fmt: skip
    """The H200, 2026-12-06: SGLang's first-use kernel build kept its start past the watch's 480 s
    (TIMEOUT, "still making progress") and the harness stopped it. Now the watch gets what is left of the
    call, an engine still starting is left running (and `stop --keep-starting` spares it), and the next
    `--phase up` watches that engine on instead of starting another; measure refuses it until READY."""
    timeouts: list[float] = []

    def slow_start(config, args, out: Path) -> tuple[int, str, float]:
        timeouts.append(args.timeout)
        out.mkdir(parents=True, exist_ok=True)
        ran = on_device.test_only(on_device.engine_argv(config.command()), args.engine, args)[0]
        (out / "command.json").write_text(json.dumps({"ran": ran}))
        (out / "engine.log").write_text("Capturing prefill shape (num_tokens=8192)\n")
        return (
            3,
            "TIMEOUT 545.0s not ready after --timeout 545s (stage 'capturing CUDA graphs', still making progress)",
            545.0,
        )

    monkeypatch.setattr(on_device, "start_watched", slow_start)
    monkeypatch.setattr(on_device, "engine_groups", lambda: {4242})
    monkeypatch.setattr(on_device, "engine_pid", lambda: 4242)
    stopped: list[str] = []
    monkeypatch.setattr(on_device, "stop_engines", lambda: stopped.append("stop"))
    monkeypatch.setattr(on_device, "bound", lambda most: 570)
    monkeypatch.setattr(on_device, "get_json", lambda url, timeout=10: {"data": []})
    assert call("--baseline", "--phase", "up", monkeypatch=monkeypatch) == 0
    assert timeouts == [570 - on_device.UP_MARGIN_S] and stopped == []  # the call's time; left running
    up = json.loads((machine.root / "store" / "up" / "baseline" / "up.json").read_text())
    assert up["starting"] is True
    with pytest.raises(SystemExit, match="still starting"):
        call("--baseline", "--phase", "measure", monkeypatch=monkeypatch)
    on_device.stop(keep_starting=True)
    assert stopped == []
    watched: list[list[str]] = []

    def attach(argv, **_):
        if "watch" not in argv:  # the hardware probe
            return types.SimpleNamespace(returncode=0, stdout="model name\t: Test CPU\n4\n")
        watched.append(argv)
        return types.SimpleNamespace(returncode=0, stdout="READY 12.0s READY\n")

    monkeypatch.setattr(on_device.subprocess, "run", attach)
    assert call("--baseline", "--phase", "up", monkeypatch=monkeypatch) == 0
    (argv,) = watched
    assert argv[argv.index("--pid") + 1] == "4242" and "--" not in argv  # the same engine, not a new one
    up = json.loads((machine.root / "store" / "up" / "baseline" / "up.json").read_text())
    assert up["exit"] == 0 and up["starting"] is False and up["seconds"] >= 545.0
    assert machine.started == []  # no second engine
    on_device.stop(keep_starting=True)
    assert stopped == ["stop"]  # nothing starting any more: a leftover is stopped


def test_prebuild_jit_builds_in_the_engines_interpreter_and_environment_and_says_so(tmp_path: Path,
                                                                                    monkeypatch) -> None:  # fmt: skip
    """`--prebuild-jit` runs the build in the interpreter and environment command.json names (here a stand-in
    for SGLang's build that writes a kernel where SGLANG_JIT_CACHE_DIR says), records what it built and how
    long in command.json's `prebuilt`, and leaves a failure or a timeout to the engine. Only for SGLang."""
    cache = tmp_path / "cache"
    jit = cache / "sglang-jit"
    config = types.SimpleNamespace(cache_dir=str(cache))
    out = tmp_path / "out"
    out.mkdir()
    env = {"SGLANG_JIT_CACHE_DIR": str(jit), "PATH": "/usr/bin:/bin"}
    (out / "command.json").write_text(json.dumps({"ran": [sys.executable, "-m", "sglang.launch_server"], "env": env}))
    said: list[str] = []
    monkeypatch.setattr(gpu_machine, "log", said.append)
    monkeypatch.setenv("CUDA_HOME", "/the/machines/cuda")  # the machine's own, not in command.json
    monkeypatch.setattr(on_device, "SGLANG_PREBUILD", textwrap.dedent("""
        import os, pathlib
        assert os.environ["CUDA_HOME"] == "/the/machines/cuda", "the engine inherits the machine's variables"
        built = pathlib.Path(os.environ["SGLANG_JIT_CACHE_DIR"]) / "sm90a" / "sgl_kernel_jit_moe_wna16_marlin_x"
        built.mkdir(parents=True)
        (built / "marlin_x.so").write_bytes(b"k")
        print("prebuilt 2 Marlin MoE variants in 0.1 s")
    """))  # fmt: skip
    args = argparse.Namespace(prebuild_jit=True, engine="sglang")
    spent = on_device.prebuild_jit(config, args, out)
    prebuilt = json.loads((out / "command.json").read_text())["prebuilt"]
    assert isinstance(spent, float) and spent == prebuilt["seconds"]
    assert prebuilt["exit"] == 0 and prebuilt["built"] == ["marlin_x"] and "prebuilt 2" in prebuilt["said"][-1]
    assert "not in the start's seconds" in said[-1]
    monkeypatch.setattr(on_device, "SGLANG_PREBUILD", "raise SystemExit('nvcc: not found')")
    on_device.prebuild_jit(config, args, out)  # a failure: said, and the start goes on
    prebuilt = json.loads((out / "command.json").read_text())["prebuilt"]
    assert prebuilt["exit"] == 1 and prebuilt["built"] == [] and prebuilt["said"] == ["nvcc: not found"]
    monkeypatch.setattr(on_device, "SGLANG_PREBUILD", "import time; time.sleep(5)")
    monkeypatch.setattr(on_device, "PREBUILD_TIMEOUT_S", 0.5)
    on_device.prebuild_jit(config, args, out)
    assert json.loads((out / "command.json").read_text())["prebuilt"]["exit"] is None
    (out / "command.json").write_text("{}")
    assert on_device.prebuild_jit(config, argparse.Namespace(prebuild_jit=True, engine="vllm"), out) == 0  # SGLang only
    assert on_device.prebuild_jit(config, argparse.Namespace(prebuild_jit=False, engine="sglang"), out) == 0
    assert json.loads((out / "command.json").read_text()) == {}


def test_the_watch_after_a_prebuild_gets_what_is_left_of_the_call() -> None:
    """A prebuild runs inside the same bounded `--phase up` call: its seconds come off the watch's
    `--timeout`, so the watch reaches its verdict (and up.json) before the call's own `timeout` cuts it."""
    watch = ["python3", "on_device.py", "watch", "--timeout", "545.0", "--diagnostics", "d", "--", "engine"]
    assert on_device.shortened(watch, 320.0) == [*watch[:4], "225.0", *watch[5:]]
    assert on_device.shortened(watch, 0.0) == watch
    assert on_device.shortened(watch, 520.0)[4] == "60.0"  # the watch's floor: it still gives a verdict


def test_a_start_records_which_kernels_it_built_beside_those_it_found(tmp_path: Path, monkeypatch) -> None:
    """A seeded engine cache shows whether the engine used it: a kernel already there before the start and
    unchanged is not "built"; a new one, or one rewritten, is."""
    cache = tmp_path / "cache"
    kept = cache / "sglang-jit" / "sm90a" / "sgl_kernel_jit_kept" / "build-1" / "kept.so"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"x" * 10)
    config = types.SimpleNamespace(cache_dir=str(cache))
    before = on_device.kernels(config)
    monkeypatch.setattr(gpu_machine, "log", lambda line: None)
    new = cache / "sglang-jit" / "sm90a" / "sgl_kernel_jit_moe_wna16_marlin" / "build-2" / "marlin.so"
    new.parent.mkdir(parents=True)
    new.write_bytes(b"y" * 20)
    on_device.kernels_record(config, tmp_path, before)
    record = json.loads((tmp_path / "engine-cache-kernels.json").read_text())
    assert list(record["before"]) == ["sglang-jit/sm90a/sgl_kernel_jit_kept/build-1/kept.so"]
    assert record["built"] == ["sglang-jit/sm90a/sgl_kernel_jit_moe_wna16_marlin/build-2/marlin.so"]
    # A later call (the watch resumed on the same start) keeps the first call's "before".
    on_device.kernels_record(config, tmp_path)
    assert json.loads((tmp_path / "engine-cache-kernels.json").read_text())["before"] == record["before"]


def test_the_engine_is_told_its_cache_through_the_folder_itself_never_the_link(tmp_path, monkeypatch) -> None:
    """H100, 2026-12-07: through the harness's link at CACHE_MOUNT, SGLang 0.5.23 recorded each JIT build's
    own staging `cuda.cu` among its dependencies (it compares resolved paths with its unresolved staging
    folder), so no later process found a build: the prebuilt Marlin kernel was built again in the capture.
    The variables the engine gets now name the keyed folder, which no link stands in."""
    from specdeploy.serve import engine_cache  # noqa: PLC0415

    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    monkeypatch.setattr(on_device, "place", lambda link, to: None)
    values = on_device.inventory_vars(
        gpu_machine.ROOT / "inventories/gpu-h200-full-depth", ["specdeploy_engine=sglang"]
    )
    config = on_device.with_engine_cache(on_device.render(values), argparse.Namespace(engine="sglang",
                                                                                    no_engine_cache=False))  # fmt: skip
    env = on_device.unlinked(config.environment(), config)
    named = {k: v for k, v in env.items() if k in engine_cache.VARIABLES["sglang"]}
    assert named["SGLANG_JIT_CACHE_DIR"] == f"{Path(config.cache_dir).resolve()}/sglang-jit"
    assert set(named) == set(engine_cache.VARIABLES["sglang"])
    assert all(Path(v).is_relative_to(Path(config.cache_dir).resolve()) for v in named.values())
    assert not any(engine_cache.CACHE_MOUNT in v for v in env.values())
    assert {k: v for k, v in env.items() if k not in named} == {
        k: v for k, v in config.environment().items() if k not in named
    }  # nothing else touched
    # a folder reached through a link of its own is named by its real path
    (tmp_path / "elsewhere").symlink_to(tmp_path / "store")
    linked = types.SimpleNamespace(cache_dir=str(tmp_path / "elsewhere" / "engine-cache" / Path(config.cache_dir).name))
    assert on_device.unlinked({"X": engine_cache.CACHE_MOUNT}, linked) == {"X": config.cache_dir}
    assert on_device.unlinked({"X": engine_cache.CACHE_MOUNT}, types.SimpleNamespace(cache_dir="")) == {
        "X": engine_cache.CACHE_MOUNT
    }


def test_a_jit_build_recording_a_file_since_gone_is_named_unfindable(tmp_path: Path, monkeypatch) -> None:
    """The recorded leaf of the H100 run (tests/data/gpu_truth/sglang-0.5.23-full-depth-h100-gate/
    acc1.6-linked-cache-jit-leaf/) names its staging `cuda.cu` first: SGLang can never take it again, and
    the start's kernel record says so. A leaf whose recorded files are all there is not named."""
    leaf_data = RUNS / "sglang-0.5.23-full-depth-h100-gate" / "acc1.6-linked-cache-jit-leaf"
    recorded = json.loads((leaf_data / "deps-0465d43c7a73c337.sgl_deps.json").read_text())
    assert recorded[0][0] == "abs" and "/.staging-" in recorded[0][1] and recorded[0][1].endswith("/cuda.cu")
    cache = tmp_path / "cache"
    dead = cache / "sglang-jit" / "sm90a" / "sgl_kernel_jit_moe_wna16_marlin" / "build-1" / "deps-0465d43c7a73c337"
    dead.mkdir(parents=True)
    (dead / "sgl_deps.json").write_text(json.dumps(recorded))
    header = tmp_path / "dequant.h"
    header.write_text("// a dependency still in place")
    good = cache / "sglang-jit" / "sm90a" / "sgl_kernel_jit_norm" / "build-2" / "deps-2"
    good.mkdir(parents=True)
    (good / "sgl_deps.json").write_text(json.dumps([["abs", str(header), "00"], ["kernels", "csrc/x.h", "11"]]))
    torn = cache / "sglang-jit" / "sm90a" / "sgl_kernel_jit_rope" / "build-3" / "deps-3"
    torn.mkdir(parents=True)
    (torn / "sgl_deps.json").write_text('[["abs", "/x"')  # half-written
    assert on_device.unfindable(cache) == [
        "sglang-jit/sm90a/sgl_kernel_jit_moe_wna16_marlin/build-1/deps-0465d43c7a73c337",
        "sglang-jit/sm90a/sgl_kernel_jit_rope/build-3/deps-3",
    ]
    said: list[str] = []
    monkeypatch.setattr(gpu_machine, "log", said.append)
    on_device.kernels_record(types.SimpleNamespace(cache_dir=str(cache)), tmp_path, {})
    record = json.loads((tmp_path / "engine-cache-kernels.json").read_text())
    assert len(record["unfindable"]) == 2
    assert said[-1].startswith("engine cache: 2 JIT builds no later start can find") and "moe_wna16_marlin" in said[-1]
    header.unlink()  # the good leaf's own file gone: it is unfindable too
    assert len(on_device.unfindable(cache)) == 3


def test_the_engines_own_metrics_are_kept_and_a_silent_one_is_only_logged(tmp_path: Path) -> None:
    exposition = b'# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name="m"} 2.3\n'

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(exposition if self.path == "/metrics" else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        on_device.capture_metrics(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert (tmp_path / "metrics.txt").read_bytes() == exposition
    (tmp_path / "metrics.txt").unlink()
    on_device.capture_metrics(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")  # nothing listens now
    assert not (tmp_path / "metrics.txt").exists()
