"""The loads step (gpu_truth/loads.py): the engine's own load figures, the watchdog's stage seconds, and
the wait that stops an engine once its load is over, held to real engine log lines."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpu_truth import loads, on_device
from gpu_truth import machine as gpu_machine

REAL_LOGS = Path(__file__).parents[2] / "data" / "real_logs"


def test_the_engine_figures_are_read_from_vllm_and_sglang_logs_of_the_h100() -> None:
    vllm = next(REAL_LOGS.glob("h100-vllm-0.33-kimi-k25-full-depth-16e-spec-off*.log")).read_text(errors="replace")
    figures = loads.engine_figures(vllm)
    assert figures["engine_load_s"] is not None and figures["engine_load_s"] > 1
    assert figures["engine_weights_gib"] == 44.7  # the dummy load's 16 experts a layer (docs/gpu-truth.md)
    # real lines of the H200 runs (2026-12-02): SGLang's target, then its drafter; vLLM's default loader
    sglang = ("[2026-12-02 17:20:45] Load weight end. elapsed=0.28 s, type=DeepseekV3ForCausalLM, avail mem=139.06 GB, "
              "mem usage=0.03 GB.")  # fmt: skip
    assert loads.engine_figures(sglang) == {"engine_load_s": 0.28, "engine_weights_gib": None, "reading_s": None}
    default_loader = (
        "(EngineCore pid=3374) INFO 12-02 16:55:42 [default_loader.py:430] Loading weights took 0.04 seconds"
    )
    assert loads.engine_figures(default_loader)["reading_s"] == 0.04


def test_the_weights_stage_lasts_until_the_next_stage_begins() -> None:
    verdict = {"stages": [{"stage": "resolving config", "at_s": 3.0}, {"stage": "loading weights", "at_s": 40.5},
                          {"stage": "compiling (torch.compile / autotune)", "at_s": 58.25}]}  # fmt: skip
    assert loads.stage_seconds(verdict) == 17.75
    assert loads.stage_seconds({"stages": verdict["stages"][:2]}) is None  # stopped before the next one
    assert loads.stage_seconds({}) is None


def engine(tmp_path: Path, script: str) -> tuple[Path, subprocess.Popen[str]]:
    log = tmp_path / "engine.log"
    body = textwrap.dedent(script).format(log=str(log))
    return log, subprocess.Popen([sys.executable, "-c", body], text=True)


def test_the_wait_ends_when_the_stage_after_the_load_begins(tmp_path: Path) -> None:
    log, proc = engine(
        tmp_path,
        """
        import time
        with open({log!r}, "a", buffering=1) as f:
            f.write("Loading weights took 3.10 seconds\\n")
            time.sleep(0.5)
            f.write("INFO [model_runner.py:428] Model loading took 35.02 GiB memory and 3.512 seconds\\n")
            time.sleep(1.0)
            f.write("(EngineCore pid=1) INFO 12-06 09:35:58 [monitor.py:40] [backbone] Starting torch.compile\\n")
            time.sleep(60)
    """,
    )
    started = time.monotonic()
    try:
        text = loads.wait_for_load(log, proc, bound_s=30)
    finally:
        proc.kill()
    assert "Starting torch.compile" in text and time.monotonic() - started < 10
    assert loads.engine_figures(text)["engine_load_s"] == 3.512


def test_the_wait_ends_when_the_engine_dies_or_the_bound_passes(tmp_path: Path) -> None:
    log, proc = engine(
        tmp_path,
        """
        with open({log!r}, "a") as f:
            f.write("ValueError: Load format `bogus` is not supported\\n")
    """,
    )
    text = loads.wait_for_load(log, proc, bound_s=30)
    assert "not supported" in text and loads.engine_figures(text)["engine_load_s"] is None
    (tmp_path / "quiet").mkdir()
    log, proc = engine(
        tmp_path / "quiet",
        """
        import time
        time.sleep(60)
    """,
    )
    started = time.monotonic()
    try:
        assert loads.wait_for_load(log, proc, bound_s=1.5) == ""
    finally:
        proc.kill()
    assert time.monotonic() - started < 5


def test_a_load_line_with_no_next_stage_waits_only_its_grace(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(loads, "NEXT_STAGE_S", 1.0)
    log, proc = engine(
        tmp_path,
        """
        import time
        with open({log!r}, "a", buffering=1) as f:
            f.write("Model loading took 35.02 GiB memory and 3.512 seconds\\n")
            time.sleep(60)
    """,
    )
    started = time.monotonic()
    try:
        loads.wait_for_load(log, proc, bound_s=30)
    finally:
        proc.kill()
    assert time.monotonic() - started < 6


def args_for(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="step")
    parent = argparse.ArgumentParser(add_help=False)
    for flag, default in (("--inventory", "inventories/gpu-h200"), ("--tag", ""), ("--architecture", "kimi_k25"),
                          ("--drafter-ids", ""), ("--form", "tiny"), ("--experts", "auto")):  # fmt: skip
        parent.add_argument(flag, default=default)
    parent.add_argument("engine")
    for flag in ("--set", "--env", "--site"):
        parent.add_argument(flag, action="append", default=[] if flag != "--site" else None)
    parent.add_argument("--layers", type=int, default=61)
    parent.add_argument("--stall-timeout", type=float, default=240)
    parent.add_argument("--timeout", type=float, default=480)
    parent.add_argument("--dummy-load", action="store_true")
    parent.add_argument("--acceptance", type=float, default=0.0)
    loads.add_parser(sub, [parent])
    return parser.parse_args(["loads", "vllm", *argv])


def test_each_case_renders_the_operators_variables_and_keeps_the_figures(tmp_path: Path, monkeypatch) -> None:
    """The wiring of a case, with the machine's parts faked (no GPU, no vmtouch here): the rendered command
    carries the loader and the warmed page cache's environment, the engine is stopped after its load, and
    the record holds the engine's seconds and the stage table's."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 2_000_000)
    monkeypatch.setattr(gpu_machine, "STORE", tmp_path / "store")
    monkeypatch.setattr(gpu_machine, "OUT", tmp_path / "out")
    monkeypatch.setattr(loads, "real_files", lambda layers: target)
    monkeypatch.setattr(loads, "evict", lambda files: 0.0)
    monkeypatch.setattr(loads, "resident", lambda files: 1.0)
    monkeypatch.setattr(loads, "dd", lambda files: {"bytes": 2_000_000, "seconds": 0.01, "gb_per_s": 0.2})
    monkeypatch.setattr(on_device, "place", lambda link, to: None)
    stopped: list[float] = []
    monkeypatch.setattr(on_device, "stop_engines", lambda: stopped.append(time.monotonic()))
    rendered: list[dict[str, object]] = []

    def watch_command(config, args, out):  # the watch and engine: a log, then the verdict at the stop
        out.mkdir(parents=True, exist_ok=True)
        rendered.append({"argv": config.command(), "env": config.environment()})
        script = textwrap.dedent(f"""
            import json, signal, sys, time
            def stop(*_):
                json.dump({{"stages": [{{"stage": "loading weights", "at_s": 1.0}},
                                       {{"stage": "compiling (torch.compile / autotune)", "at_s": 1.5}}],
                           "headline": "exited"}}, open({str(out / "verdict.json")!r}, "w"))
                sys.exit(1)
            signal.signal(signal.SIGTERM, stop)
            with open({str(out / "engine.log")!r}, "a", buffering=1) as f:
                f.write("Model loading took 0.01 GiB memory and 0.4 seconds\\n")
                f.write("[backbone] Starting torch.compile\\n")
            time.sleep(30)
        """)
        return [sys.executable, "-c", script], {}

    monkeypatch.setattr(on_device, "watch_command", watch_command)
    real_popen = subprocess.Popen

    class Watched(real_popen):  # type: ignore[misc,valid-type]
        def communicate(self, *a, **k):  # the stop_engines fake stops nothing: stop the fake engine here
            self.terminate()
            return super().communicate(*a, **k)

    monkeypatch.setattr(loads.subprocess, "Popen", Watched)
    args = args_for("--loader", "fastsafetensors", "--case", "cold", "--case", "warm")
    assert loads.loads(args, on_device) == 0
    assert len(rendered) == 2 and len(stopped) == 2
    assert all("--load-format" in r["argv"] and "fastsafetensors" in r["argv"] for r in rendered)
    assert "--speculative-config" not in rendered[0]["argv"]  # a load needs no drafter
    records = [json.loads(line) for line in (tmp_path / "out" / "loads" / "loads.jsonl").read_text().splitlines()]
    assert [(r["loader"], r["case"]) for r in records] == [("fastsafetensors", "cold"), ("fastsafetensors", "warm")]
    assert records[0]["engine_load_s"] == 0.4 and records[0]["stage_load_s"] == 0.5
    assert records[0]["gb_per_s"] == round(2_000_000 / 0.5 / 1e9, 2) and records[0]["resident_after_evict"] == 0.0
    assert (tmp_path / "out" / "loads" / "loads-all.jsonl").read_text().count("\n") == 2


def test_a_warmed_cache_sets_the_loaders_own_environment(tmp_path: Path, monkeypatch) -> None:
    """fastsafetensors reads with O_DIRECT past the page cache unless told (specdeploy.serve.loaders): a
    prewarmed case renders FASTSAFETENSORS_ODIRECT=0, as the rollout does."""
    values = on_device.inventory_vars(gpu_machine.ROOT / loads.INVENTORY, [
        "specdeploy_engine=vllm", "serving_load_format=fastsafetensors", "serving_gpus=device_requests",
        "serving_warm_page_cache=true"])  # fmt: skip
    assert on_device.render(values).speculation_off().environment().get("FASTSAFETENSORS_ODIRECT") == "0"
