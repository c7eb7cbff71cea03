"""The loads step on the lent GPU machine: the engine's weight load timed on real files, by loader,
with a cold and a warm page cache, with and without the product's prewarm, beside `dd` of the same
files (test-bed tooling, never shipped; docs/gpu-truth.md).

    python3 gpu_truth/on_device.py loads vllm --write            # the files (once) and dd, cold and warm
    python3 gpu_truth/on_device.py loads vllm --loader auto      # the four cases of one loader

The files are Kimi-K2.5's first LAYERS layers as the checkpoint ships them (specdeploy_testbed.real_files,
~35 GB at 4 layers). Each case starts the project's rendered command (the full-depth inventory, speculation
off: a load needs no drafter; `serving_load_format` and `serving_warm_page_cache` set as an operator would)
under `specdeploy watch`, waits for the engine's own "Model loading took" line and the next stage's first
line, then stops it: the figures are the watchdog's stage table ("loading weights") and the engine's own
seconds. The page cache is emptied of the files with `vmtouch -e` and read back with `vmtouch` (mincore),
the prewarm is specdeploy.serve.prewarm's, as a rollout runs it. Each case is appended to loads.jsonl (in
$OUT and in the store) as it ends, so a call cut at its bound keeps the cases it finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from gpu_truth import machine


class Harness(Protocol):
    """What a case takes of on_device.py, which passes itself: the engine rendered, placed, watched and stopped
    as a gate's start is, so a load is timed on the command the product runs."""

    def inventory_vars(self, inventory: Path, overrides: list[str]) -> dict[str, Any]: ...
    def render(self, values: dict[str, Any]) -> Any: ...
    def place(self, link: Path, target: Path) -> None: ...
    def watch_command(self, config: Any, args: argparse.Namespace, out: Path) -> tuple[list[str], dict[str, str]]: ...
    def stop_engines(self) -> None: ...


CASES = ("cold", "cold-prewarm", "warm", "warm-prewarm")
LOADERS = ("auto", "fastsafetensors", "runai_streamer")
# The engine's own end of the load: vLLM 0.33 (v1/worker/gpu_model_runner.py), SGLang 0.5.23 (model_runner.py)
LOADED = re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds|Load weight end\. elapsed=([\d.]+) s")
# vLLM's default loader (model_loader/default_loader.py): the reading alone
WEIGHTS_TOOK = re.compile(r"Loading weights took ([\d.]+) seconds")
# A line of the stage after the load (log_grammar.yaml's COMPILE / KV_CACHE / CUDA_GRAPHS), so the stage
# table closes "loading weights"; bounded by NEXT_STAGE_S when the engine prints none soon.
NEXT_STAGE = re.compile(
    r"Dynamo bytecode transform|Starting torch\.compile|Compiling a graph|torch\.compile took|"
    r"KV cache|Memory profiling|Capturing CUDA graph|Capture cuda graph|Memory pool end"
)
NEXT_STAGE_S = 30.0
WEIGHTS_STAGE = "loading weights"
INVENTORY = "inventories/gpu-h200-full-depth"


def real_layers() -> int:
    """The written checkpoint's default depth: one dense and three MoE layers, ~35 GB (64 GB of disk there)."""
    sys.path.insert(0, str(machine.ROOT / "testbed"))
    from specdeploy_testbed import real_files as maker  # noqa: PLC0415

    return maker.LAYERS


class LocalHost:
    """specdeploy.connection.CommandHost's interface on this machine (that module imports Docker's client)."""

    def command(self, *argv: str) -> list[str]:
        return list(argv)


def tools() -> Path:
    """vmtouch, unpacked from the Debian package the payload carries (`dpkg -x`, never into /)."""
    where = machine.STORE / "tools-root"
    binary = where / "usr" / "bin" / "vmtouch"
    if not binary.is_file():
        debs = sorted((machine.STORE / "tools").glob("vmtouch_*.deb"))  # `receive` keeps what the first call carried
        if not debs:
            raise SystemExit("no vmtouch: carry .gpu-payload/tools/vmtouch_*.deb (make gpu-truth ENGINE=vllm)")
        subprocess.run(["dpkg", "-x", str(debs[0]), str(where)], check=True)
    return binary.parent


def real_files(layers: int) -> Path:
    """The checkpoint's files at LAYERS deep, written once on this machine (its disk is 64 GB)."""
    out = machine.STORE / "models" / f"kimi_k25-files-{layers}l"
    if (out / "target" / "model.safetensors.index.json").is_file():
        return out / "target"
    env = {**os.environ, "PYTHONPATH": str(machine.ROOT / "testbed"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specdeploy_testbed.real_files", str(out), "--layers", str(layers)],
                          check=True, env=env, capture_output=True, text=True)  # fmt: skip
    (out / "written.json").write_text(done.stdout)
    machine.log(f"real files written: {done.stdout.strip()}")
    return out / "target"


def weight_files(target: Path) -> list[Path]:
    return sorted(target.glob("*.safetensors"))


def vmtouch(*argv: str) -> str:
    return subprocess.run([str(tools() / "vmtouch"), *argv], capture_output=True, text=True, check=True).stdout


def resident(files: list[Path]) -> float | None:
    from specdeploy.serve.prewarm import resident_fraction  # noqa: PLC0415

    return resident_fraction(vmtouch("-f", *map(str, files)))


def evict(files: list[Path]) -> float | None:
    """The files out of the page cache (`vmtouch -e`: posix_fadvise DONTNEED); what stays resident after."""
    vmtouch("-e", *map(str, files))
    return resident(files)


def dd(files: list[Path]) -> dict[str, Any]:
    """One sequential read of every file (`dd bs=16M`), as the disk or the page cache gives them."""
    started = time.monotonic()
    for path in files:
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "status=none"], check=True)
    seconds = time.monotonic() - started
    size = sum(p.stat().st_size for p in files)
    return {"bytes": size, "seconds": round(seconds, 2), "gb_per_s": round(size / seconds / 1e9, 2)}


def keep(out: Path, record: dict[str, Any]) -> None:
    """Appended to loads.jsonl in $OUT and in the store (the last call packs the whole table)."""
    line = json.dumps(record) + "\n"
    for folder in (out, machine.STORE / "loads"):
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "loads.jsonl").open("a") as f:
            f.write(line)
    machine.log(
        f"{record.get('loader', 'dd')} {record['case']}: "
        + json.dumps(
            {k: record.get(k) for k in ("resident_before", "engine_load_s", "stage_load_s", "gb_per_s", "error")}
        )
    )


def stage_seconds(verdict: dict[str, Any], stage: str = WEIGHTS_STAGE) -> float | None:
    """The stage's seconds in the watchdog's table: from its start to the next stage's."""
    stages = verdict.get("stages") or []
    for here, after in itertools.pairwise(stages):
        if here.get("stage") == stage:
            return round(float(after["at_s"]) - float(here["at_s"]), 2)
    return None


def engine_figures(text: str) -> dict[str, Any]:
    found = LOADED.search(text)
    took = WEIGHTS_TOOK.search(text)
    figures: dict[str, Any] = {"engine_load_s": None, "engine_weights_gib": None, "reading_s": None}
    if found:
        vllm = found.group(2) is not None
        figures["engine_load_s"] = float(found.group(2) if vllm else found.group(3))
        figures["engine_weights_gib"] = float(found.group(1)) if vllm else None
    if took:
        figures["reading_s"] = float(took.group(1))
    return figures


def wait_for_load(log_file: Path, watched: subprocess.Popen[str], bound_s: float) -> str:
    """Until the engine says its load ended and the next stage began (or NEXT_STAGE_S after the end),
    the watch ends, or BOUND_S pass: the log's text."""
    deadline, loaded_at = time.monotonic() + bound_s, None
    text = ""
    while time.monotonic() < deadline and watched.poll() is None:
        text = log_file.read_text(errors="replace") if log_file.is_file() else ""
        match = LOADED.search(text)
        if match and loaded_at is None:
            loaded_at = time.monotonic()
        if match and (NEXT_STAGE.search(text, match.end()) or time.monotonic() - loaded_at > NEXT_STAGE_S):
            time.sleep(1.0)  # the watch reads the line too
            break
        time.sleep(0.5)
    return log_file.read_text(errors="replace") if log_file.is_file() else text


def one_case(args: argparse.Namespace, harness: Harness, target: Path, *, loader: str, case: str,
             out: Path) -> dict[str, Any]:  # fmt: skip
    files = weight_files(target)
    size = sum(p.stat().st_size for p in files)
    record: dict[str, Any] = {"loader": loader, "case": case, "engine": args.engine, "bytes": size,
                              "files": len(files), "at": time.strftime("%H:%M:%S")}  # fmt: skip
    if case.startswith("cold"):
        record["resident_after_evict"] = evict(files)
    elif (resident(files) or 0) < 0.99:  # warm: the files in the page cache before the engine starts
        dd(files)
    prewarm = case.endswith("prewarm")
    if prewarm:
        from specdeploy.serve.prewarm import Prewarmer  # noqa: PLC0415

        saved_path = os.environ["PATH"]
        os.environ["PATH"] = f"{tools()}:{saved_path}"  # the Prewarmer runs `vmtouch` by name
        try:
            report = Prewarmer(LocalHost(), str(target)).warm()  # type: ignore[arg-type]
        finally:
            os.environ["PATH"] = saved_path
        record["prewarm"] = {k: getattr(report, k) for k in ("warmed", "message", "seconds", "gb_per_s",
                                                             "resident_fraction", "partial")}  # fmt: skip
    record["resident_before"] = resident(files)
    where = out / f"{loader}-{case}"
    # serving_gpus: the inventory's `none` (no Docker there) reads as a CPU build, which refuses the GPU-only
    # loaders; the container's GPU access is no part of the engine's command
    values = harness.inventory_vars(machine.ROOT / args.inventory, [
        f"specdeploy_engine={args.engine}", f"serving_load_format={loader}", "serving_gpus=device_requests",
        f"serving_warm_page_cache={'true' if prewarm else 'false'}", *args.set])  # fmt: skip
    config = harness.render(values).speculation_off()
    from specdeploy.serve.config import MODEL_MOUNT  # noqa: PLC0415

    harness.place(Path(MODEL_MOUNT), target)
    watch, watch_env = harness.watch_command(config, args, where)
    started = time.monotonic()
    watched = subprocess.Popen(watch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=watch_env)
    try:
        text = wait_for_load(where / "engine.log", watched, args.load_bound)
    finally:
        harness.stop_engines()
        try:
            watched.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            watched.kill()
    record["start_to_loaded_s"] = round(time.monotonic() - started, 1)
    record |= engine_figures(text)
    verdict = json.loads((where / "verdict.json").read_text()) if (where / "verdict.json").is_file() else {}
    record["stage_load_s"] = stage_seconds(verdict)
    record["stages"] = verdict.get("stages")
    seconds = record["stage_load_s"] or record["engine_load_s"]
    record["gb_per_s"] = round(size / seconds / 1e9, 2) if seconds else None
    if record["engine_load_s"] is None:
        record["error"] = verdict.get("headline") or "no load line in the engine's log within the bound"
    return record


def loads(args: argparse.Namespace, harness: Harness) -> int:
    out = machine.OUT / (args.tag or "loads")
    out.mkdir(parents=True, exist_ok=True)
    # the full-depth inventory's rendering (its flags; speculation off), on the written files
    args.inventory, args.form, args.layers, args.experts = INVENTORY, "real-files", args.files_layers, "384"
    args.architecture, args.drafter_ids, args.dummy_load, args.acceptance = "kimi_k25", "", False, 0.0
    target = real_files(args.layers)
    files = weight_files(target)
    failed = 0
    if args.write:
        written = target.parent / "written.json"
        keep(out, {"case": "written", **(json.loads(written.read_text()) if written.is_file() else {})})
        keep(out, {"case": "dd cold", "resident_before": evict(files), **dd(files)})
        keep(out, {"case": "dd warm", "resident_before": resident(files), **dd(files)})
    for loader in args.loader:
        for case in args.case or CASES:
            try:
                record = one_case(args, harness, target, loader=loader, case=case, out=out)
            except (OSError, subprocess.CalledProcessError, SystemExit) as exc:
                record = {"loader": loader, "case": case, "error": repr(exc)}
            failed += bool(record.get("error"))
            keep(out, record)
    shutil.copy(machine.STORE / "loads" / "loads.jsonl", out / "loads-all.jsonl")
    return 1 if failed else 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    lds = sub.add_parser("loads", parents=parents, help="the weight load on real files: loaders x page cache x prewarm")
    # (no set_defaults here: the parent's actions are shared with `gate` and `serve`, and would change there)
    lds.add_argument("--files-layers", type=int, default=real_layers(), help="the written checkpoint's depth")
    lds.add_argument("--write", action="store_true", help="the files (once), then dd of them, cold and warm")
    lds.add_argument("--loader", action="append", default=[], choices=LOADERS)
    lds.add_argument("--case", action="append", default=[], choices=CASES)
    lds.add_argument("--load-bound", type=float, default=240, help="seconds one start may take to finish its load")
