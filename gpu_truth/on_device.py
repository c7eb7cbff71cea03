"""The GPU truth steps, run on the lent GPU machine (no network, no Docker, its own python3 and
torch), one step per device call while the machine stays warm:

    python3 gpu_truth/on_device.py receive            # keep the payload parts this call carried
    python3 gpu_truth/on_device.py install vllm       # rejoin, check, pip install --no-deps --target
    python3 gpu_truth/on_device.py serve vllm [--set serving_KEY=VALUE ...] [--tag NAME]

`serve` makes the tiny models there, renders the engine's command with the project's own
`serve.config` from a GPU inventory (inventories/gpu-h200), starts it under `specdeploy watch`,
runs the benchmark gate's client (vLLM's `vllm bench serve`, as the gate runs it), reads the
acceptance figures (vLLM's /metrics through the client; SGLang's own /get_server_info), stops the
engine, and leaves the log, the verdict and the figures in $OUT. Paths outside the checkout
(/root/gpu-truth) live only while the machine stays up.

Test-bed tooling: never shipped in the wheel or an engine image.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import types
import urllib.request
from pathlib import Path
from typing import Any

# Run as a script, gpu_truth/ is on the path and the checkout is not: the harness's own modules need it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_truth import carried_cache, live_panels, loads, machine

PORT = 8000


# ---------------------------------------------------------------- receive, install


# The session's device time, counted from the machine's start (the lease counts its ~30-s start too):
# a call's bound is what is left of it, so the last gate call is cut by its own timeout (and packs what
# it measured) rather than by the lease (which returns only what was already under $OUT).
SESSION_S, MACHINE_START_S, PACK_MARGIN_S = 1800, 30, 45


def held_since() -> float:
    """When this machine was taken: written by its first call (the store lives while it stays up)."""
    mark = machine.STORE / "held-since"
    if not mark.is_file():
        machine.STORE.mkdir(parents=True, exist_ok=True)
        mark.write_text(f"{time.time() - MACHINE_START_S:.0f}")
    return float(mark.read_text())


def budget(seconds: int | None = None) -> int:
    """The session's device time when this machine was taken (status's budget_left_s, given to the first
    `receive`; a session resumed after a cut has less than SESSION_S)."""
    mark = machine.STORE / "budget"
    if seconds is not None and not mark.is_file():
        machine.STORE.mkdir(parents=True, exist_ok=True)
        mark.write_text(str(seconds))
    return int(mark.read_text()) if mark.is_file() else SESSION_S


def bound(most: float) -> int:
    """Seconds a gate call may run: MOST, or less where less of the session's device time is left."""
    left = budget() - (time.time() - held_since()) - PACK_MARGIN_S
    return max(1, int(min(most, left)))


def receive(budget_s: int | None = None, left_s: int | None = None) -> None:
    """Moves what this call carried into the store; says which parts each engine still lacks. LEFT_S:
    the budget_left_s of an earlier call's answer, so the bounds count from what the lease really
    charged (a start took 267 s of it on the H100 on 2026-12-05, none on 2026-12-06: not MACHINE_START_S)."""
    if left_s is not None:
        machine.STORE.mkdir(parents=True, exist_ok=True)
        (machine.STORE / "budget").write_text(str(left_s))
        (machine.STORE / "held-since").write_text(f"{time.time():.0f}")
    held_since()
    budget(budget_s)
    for engine_dir in sorted(machine.CARRIED.glob("*")) if machine.CARRIED.is_dir() else []:
        store = machine.STORE / engine_dir.name
        store.mkdir(parents=True, exist_ok=True)
        for item in engine_dir.iterdir():
            if item.is_file():
                shutil.copy2(item, store / item.name)
    for store in sorted(p for p in machine.STORE.glob("*") if (p / "SHA256SUMS").is_file()):
        want = {n: d for n, d in machine.sums(store).items() if n.startswith("part-")}
        bad = [n for n in want if (store / n).is_file() and machine.sha256(store / n) != want[n]]
        for name in bad:
            (store / name).unlink()
        have = sorted(n for n in want if (store / n).is_file())
        missing = sorted(set(want) - set(have))
        machine.log(f"{store.name}: {len(have)}/{len(want)} parts"
                    + (f"; missing {' '.join(missing)}" if missing else "")
                    + (f"; dropped (checksum) {' '.join(bad)}" if bad else ""))  # fmt: skip


def site(engine: str) -> Path:
    return machine.STORE / f"site-{engine}"


def install(engine: str, leave_out: list[str]) -> None:
    store = machine.STORE / engine
    want = machine.sums(store)
    parts = sorted(n for n in want if n.startswith("part-"))
    missing = [n for n in parts if not (store / n).is_file()]
    if missing:
        raise SystemExit(f"{engine}: parts missing: {' '.join(missing)} (carry them, then `receive`)")
    started = time.monotonic()
    tar_path = store / "payload.tar"
    with tar_path.open("wb") as out:
        for name in parts:
            out.write((store / name).read_bytes())
    if machine.sha256(tar_path) != want["payload.tar"]:
        raise SystemExit(f"{engine}: the rejoined payload's sha256 differs from SHA256SUMS")
    wheels = store / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(store, filter="data")
    tar_path.unlink()
    chosen = [str(w) for w in sorted(wheels.glob("*.whl")) if not any(w.name.startswith(x) for x in leave_out)]
    target = site(engine) if not leave_out else machine.STORE / f"site-{engine}-without-{'-'.join(leave_out)}"
    shutil.rmtree(target, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--disable-pip-version-check", "--target", str(target)]  # fmt: skip
    subprocess.run([*pip, *chosen], check=True)
    machine.log(f"{engine}: {len(chosen)} wheels installed in {target} in {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------- models, rendering


def tiny_models(architecture: str, variant: str = "") -> Path:
    """The test bed's tiny target and MLA EAGLE-3 drafter, made here with the machine's torch."""
    out = machine.STORE / "models" / f"{architecture}{variant}"
    if (out / "drafter" / "SHA256SUMS").is_file():
        return out
    env = {**os.environ, "PYTHONPATH": str(machine.ROOT / "testbed"), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "specdeploy_testbed.tiny_models", str(out), "--always-accept",
                    "--architecture", architecture], check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    machine.log(f"tiny {architecture} target + drafter made in {time.monotonic() - started:.1f} s at {out}")
    return out


# The full-depth form's weights, measured on the H200 (2026-12-04, 32 experts): 66.86 GiB, of which the
# routed experts are ~44.3 GiB (24.8 MB each: INT4 packed plus group-32 scales, 60 MoE layers). 16
# experts leave ~45 GiB, which fits an 80 GB H100 with the drafter, graphs and a KV cache; 32 do not.
FULL_EXPERTS_MIN_MIB = 120_000


def experts_for(arg: str, gpu_total_mib: int | None = None) -> int:
    """The routed experts per layer: a number as given, or `auto`: 32 on a GPU of 120 GB or more (the
    H200), else 16 (the H100), so one command serves whichever machine the device tool lends."""
    if arg != "auto":
        return int(arg)
    if gpu_total_mib is None:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        gpu_total_mib = int(smi.stdout.split()[0])
    return 32 if gpu_total_mib >= FULL_EXPERTS_MIN_MIB else 16


def model_form(args: argparse.Namespace) -> dict[str, Any]:
    """What was served, named in each command.json and in the baseline's key."""
    if args.form == "tiny":
        return {"form": args.form, "architecture": args.architecture}
    return {"form": args.form, "layers": args.layers, "routed_experts_per_layer": experts_for(args.experts)}


def full_depth_models(layers: int, experts: int) -> Path:
    """Kimi-K2.5 at its real shapes (specdeploy_testbed.real_shapes): config and tokenizer only, for
    `--load-format dummy`; LAYERS deep, EXPERTS routed experts per layer (cut to fit one GPU)."""
    out = machine.STORE / "models" / f"kimi_k25-full-{layers}l-{experts}e"
    if (out / "drafter" / "config.json").is_file():
        return out
    env = {**os.environ, "PYTHONPATH": str(machine.ROOT / "testbed"), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "specdeploy_testbed.real_shapes", str(out), "--layers", str(layers),
                    "--experts", str(experts)], check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    machine.log(f"Kimi-K2.5 model forms ({layers} layers, {experts} routed experts) made in "
        f"{time.monotonic() - started:.1f} s at {out}")  # fmt: skip
    return out


def test_only(
    argv: list[str], engine: str, args: argparse.Namespace
) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """The settings the harness adds to the rendered command, and only these (the record names them):
    random weights of the model's shapes (`--load-format dummy`: no checkpoint on disk) and a set
    acceptance (vLLM 0.33's synthetic rejection sampler in the one --speculative-config; SGLang's
    SGLANG_SIMULATE_ACC_LEN), so a real-shape drafter runs at its real cost with a chosen acceptance."""
    argv, env, named = list(argv), {}, {}
    if args.dummy_load:
        if "--load-format" in argv:
            raise SystemExit("the rendering names a --load-format already: the dummy load would fight it")
        argv += ["--load-format", "dummy"]
        named["load_format"] = "dummy"
    if args.acceptance and engine == "vllm" and "--speculative-config" in argv:
        at = argv.index("--speculative-config") + 1
        spec = json.loads(argv[at])
        spec |= {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": args.acceptance}
        argv[at] = json.dumps(spec, separators=(",", ":"))
        named["synthetic_acceptance_length"] = args.acceptance
    elif args.acceptance and engine == "sglang" and "--speculative-algorithm" in argv:
        # SGLang 0.5.23 (speculative/spec_utils.py): the default token mode emits token id 100 for every
        # accepted token; real-draft-token (topk 1, as rendered) keeps the drafter's tokens.
        env |= {"SGLANG_SIMULATE_ACC_LEN": str(args.acceptance), "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
        named |= {"SGLANG_SIMULATE_ACC_LEN": args.acceptance, "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}
    if engine == "sglang":
        # A JIT build the engine finds and does not take is logged with the file that changed, at info
        # (`kernels/jit/utils/compile/cache.find_prebuilt`); otherwise a miss shows only as a slow capture.
        env["SGLANG_JIT_CACHE_DEBUG"] = "1"
        named["SGLANG_JIT_CACHE_DEBUG"] = "1"
    if serves_kimi_text_only(engine, args):
        named["config_language_model_only"] = True
    return argv, env, named


def serves_kimi_text_only(engine: str, args: argparse.Namespace) -> bool:
    """SGLang on a Kimi-K2.5 model form: the form ships no media-processor code, and SGLang builds
    Kimi-K2.5's processor from it (multimodal/processors/kimi_k25.py) unless the model is text only.
    SGLang 0.5.23 refuses `--language-model-only` for KimiK25ForConditionalGeneration
    (server_args.LANGUAGE_MODEL_ONLY_ARCHITECTURES, arg_groups/model_hook.py) but reads the checkpoint's
    own `language_model_only` (configs/model_config.py: is_lm_only), which the harness sets in a copy
    of the form's config.json: the command stays the rendered one."""
    form, architecture = getattr(args, "form", "tiny"), getattr(args, "architecture", "")
    return engine == "sglang" and (form == "full-depth" or architecture == "kimi_k25")


def text_only_variant(models: Path) -> Path:
    """A copy of MODELS whose target config.json says language_model_only (kept on the machine, made once)."""
    variant = models.with_name(models.name + "-text-only")
    config = variant / "target" / "config.json"
    if not config.is_file():
        shutil.copytree(models, variant, symlinks=True, dirs_exist_ok=True)
        doc = json.loads((models / "target" / "config.json").read_text())
        config.unlink(missing_ok=True)
        config.write_text(json.dumps({**doc, "language_model_only": True}, indent=2))
    return variant


def memory(out: Path) -> dict[str, Any]:
    """The engine's own memory accounting from its log (specdeploy.watch.memory), kept beside it."""
    from specdeploy.watch.memory import memory_figures  # noqa: PLC0415

    path = out / "engine.log"
    found = memory_figures(path.read_text(errors="replace").splitlines() if path.is_file() else [])
    doc = {**found.to_dict(), "summary": found.summary()}
    (out / "memory.json").write_text(json.dumps(doc, indent=2))
    machine.log(f"memory: {doc['summary']}")
    return doc


def inventory_vars(inventory: Path, overrides: list[str]) -> dict[str, Any]:
    import yaml  # noqa: PLC0415 (the machine's PyYAML)

    values = dict(yaml.safe_load((inventory / "group_vars" / "all.yml").read_text()))
    for item in overrides:
        key, _, raw = item.partition("=")
        values[key] = yaml.safe_load(raw) if raw else ""
    return values


def render(values: dict[str, Any]) -> Any:
    """The project's own ServingConfig from the inventory's serving_* variables, as the role hands them."""
    sys.path.insert(0, str(machine.ROOT / "src"))
    from specdeploy.serve.config import ServingConfig  # noqa: PLC0415

    fields = {k.removeprefix("serving_"): v for k, v in values.items() if k.startswith("serving_")}
    fields |= {"engine": values["specdeploy_engine"], "image": "none (the GPU machine's python3 and carried wheels)",
               "page_cache_warmed": values.get("serving_warm_page_cache", False)}  # fmt: skip
    config = ServingConfig.from_vars(fields)
    problems = config.problems()
    if problems:
        raise SystemExit("the inventory's serving variables are refused:\n- " + "\n- ".join(problems))
    return config


def place(link: Path, target: Path) -> None:
    """The rendered command names the container's paths (/models/target, the baked-in drafter);
    here they are links to the tiny models."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def engine_argv(command: list[str]) -> list[str]:
    """`vllm ...` as the image's console script would run it, from the carried site."""
    if command[0] == "vllm":
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", *command[1:]]
    if command[0] == "python3":
        return [sys.executable, *command[1:]]
    return command


# ---------------------------------------------------------------- serve, measure, stop


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def capture_metrics(where: Path, base: str = "") -> None:
    """WHERE/metrics.txt: the READY engine's own `/metrics` after the gate's traffic, the exposition
    roles/monitoring scrapes. No SGLang runs on the test bed, so this is where the dashboards' SGLang
    queries can be held to real series (a later step). A failure is logged, never fatal."""
    try:
        with urllib.request.urlopen(f"{base or f'http://127.0.0.1:{PORT}'}/metrics", timeout=10) as resp:
            (where / "metrics.txt").write_bytes(resp.read())
        machine.log(f"/metrics kept: {(where / 'metrics.txt').stat().st_size} bytes")
    except OSError as exc:
        machine.log(f"/metrics not kept: {exc}")


ENGINE_MARKERS = ("vllm.entrypoints", "sglang.launch_server", "sglang.srt")


def engine_groups() -> set[int]:
    """The process groups of engines this harness started (the watch starts each in a session of its own)."""
    groups = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(m in cmd for m in ENGINE_MARKERS):
                groups.add(os.getpgid(int(proc.name)))
        except (OSError, ProcessLookupError):
            continue
    return groups - {os.getpgid(0)}


def stop_engines() -> None:
    """SIGTERM to each engine's group, SIGKILL after 30 s, then whatever still holds the GPU."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        groups = engine_groups()
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        deadline = time.monotonic() + wait
        while groups and engine_groups() and time.monotonic() < deadline:
            time.sleep(0.5)
    used = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False).stdout.split()  # fmt: skip
    for pid in used:
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


class LocalExec:
    """The engine's container, as the benchmark gate's client uses it, on a machine without Docker:
    its files and commands are this machine's; the client (`vllm ...`, `python3 -m ...`) runs on this
    python3 with one engine's carried site alone (SGLang's pins, openai among them, would shadow vLLM's)."""

    def __init__(self, engine_sites: str, keep: Path | None = None, rust_bench: Path | None = None) -> None:
        self.env = {**os.environ, "PYTHONPATH": engine_sites, "HF_HUB_OFFLINE": "1"}
        self.keep = keep  # each client run's result, appended as it finishes (a cut call keeps them)
        self.rust_bench = rust_bench  # vLLM's own Rust client, run for `vllm bench serve` (rust_client)
        # The client's folder (gate.client.WORKDIR, fixed inside a container) made private here: two runs
        # on one machine (a CI run and the unit tests beside it, 2026-12-07) overwrote each other's results.
        self.folder = tempfile.TemporaryDirectory(prefix="specdeploy-bench-")  # removed with this object
        self.workdir = self.folder.name

    def here(self, text: str) -> str:
        from specdeploy.gate.client import WORKDIR  # noqa: PLC0415

        return text.replace(WORKDIR, self.workdir)

    def put_archive(self, path: str, data: bytes) -> bool:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(self.here(path), filter="data")
        return True

    def exec_run(self, cmd: list[str], *, environment: dict[str, str] | None = None, demux: bool = False) -> Any:
        argv = [self.here(a) for a in cmd]
        if "vllm" in argv:
            at = argv.index("vllm")
            rust = self.rust_bench is not None and argv[at + 1 : at + 3] == ["bench", "serve"]
            argv[at : at + 1] = [str(self.rust_bench)] if rust else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
        argv = [sys.executable if a == "python3" else a for a in argv]
        done = subprocess.run(argv, capture_output=True, env={**self.env, **(environment or {})}, check=False)
        output = (done.stdout, done.stderr) if demux else done.stdout + done.stderr
        if self.keep is not None and argv[:1] == ["cat"] and argv[-1].endswith(".json") and done.returncode == 0:
            with self.keep.open("a") as kept:
                kept.write(json.dumps({"at": time.strftime("%H:%M:%S"), "result": json.loads(done.stdout)}) + "\n")
        return types.SimpleNamespace(exit_code=done.returncode, output=output)


def bench(config: Any, out: Path, *, prompts: int, concurrency: int, tokens: int) -> dict[str, Any]:
    """One run of the benchmark gate's client (specdeploy.gate.client.run), here on the host."""
    from specdeploy.gate import client  # noqa: PLC0415
    from specdeploy.serve.config import MODEL_MOUNT  # noqa: PLC0415

    run = client.BenchRun(model_path=MODEL_MOUNT, served_model_name=config.served_model_name,
                          base_url=f"http://127.0.0.1:{PORT}", num_prompts=prompts, concurrency=concurrency,
                          max_tokens=tokens, timeout_s=300, trust_remote_code=config.trust_remote_code)  # fmt: skip
    local = LocalExec(str(site("vllm")))
    try:
        figures = client.run(local, run, client.prompts()[:prompts], config.api_key)
    except client.BenchFailed as exc:
        return {"error": str(exc)}
    shutil.copy(Path(local.workdir) / client.RESULT, out / "bench-result.json")
    return {"figures": figures.to_dict(), "summary": figures.summary(), "client": client.describe(run)}


def prepare(args: argparse.Namespace) -> tuple[Path, dict[str, Any], Any]:
    """$OUT's folder for this run, the inventory's variables and the rendered config, with the
    paths the command names linked to the tiny models made here."""
    out = machine.OUT / args.tag if args.tag else machine.OUT
    out.mkdir(parents=True, exist_ok=True)
    values = inventory_vars(machine.ROOT / args.inventory, [f"specdeploy_engine={args.engine}", *args.set])
    models = (full_depth_models(args.layers, model_form(args)["routed_experts_per_layer"]) if args.form == "full-depth"
              else tiny_models(args.architecture))  # fmt: skip
    if args.drafter_ids:
        variant = machine.STORE / "models" / f"{args.architecture}-ids-{args.drafter_ids.replace(',', '-')}"
        if not variant.is_dir():
            shutil.copytree(models, variant, symlinks=True)
            cfg = json.loads((variant / "drafter" / "config.json").read_text())
            ids = [int(i) for i in args.drafter_ids.split(",")]
            cfg["eagle_aux_hidden_state_layer_ids"] = ids
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
            (variant / "drafter" / "config.json").write_text(json.dumps(cfg, indent=2))
        models = variant
    if serves_kimi_text_only(args.engine, args):
        models = text_only_variant(models)
    config = with_engine_cache(render(values), args)
    from specdeploy.serve.config import MODEL_MOUNT  # noqa: PLC0415

    place(Path(MODEL_MOUNT), models / "target")
    place(Path(config.drafter_path), models / "drafter")
    return out, values, config


def with_engine_cache(config: Any, args: argparse.Namespace) -> Any:
    """CONFIG with the product's engine cache (specdeploy.serve.engine_cache): its folder keyed by the
    engine, the carried payload's digest (this machine's "image") and the GPUs' architecture, at
    CACHE_MOUNT as the container would see it, and the engine's cache variables pointing into it."""
    from dataclasses import replace  # noqa: PLC0415

    from specdeploy.serve import engine_cache  # noqa: PLC0415

    if getattr(args, "no_engine_cache", False):
        return config
    digest = (
        machine.sums(machine.STORE / args.engine).get("payload.tar", "0" * 64)
        if (machine.STORE / args.engine).is_dir()
        else "0" * 64
    )
    try:
        caps = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, check=False).stdout.splitlines()  # fmt: skip
    except OSError:  # no driver: the key says cpu
        caps = []
    key = engine_cache.key(args.engine, f"sha256:{digest}", engine_cache.architecture(caps))
    folder = machine.STORE / "engine-cache" / key
    folder.mkdir(parents=True, exist_ok=True)
    machine.log(f"engine cache {key}: {carried_cache.seed(folder)}")
    warm = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    place(Path(engine_cache.CACHE_MOUNT), folder)
    machine.log(f"engine cache {key}: " + (f"warm, {warm / 1024**2:.0f} MiB" if warm else "cold"))
    return replace(config, cache_dir=str(folder))


def unlinked(env: dict[str, str], config: Any) -> dict[str, str]:
    """ENV with each path under CACHE_MOUNT (here a link to the keyed folder: a container has a bind mount)
    named through the folder itself. SGLang 0.5.23 leaves a build's own staging files out of the dependency
    list it keys the build by, telling them apart by comparing each *resolved* path with its *unresolved*
    staging folder (`kernels/jit/utils/compile/cache._to_entries`). Through a link every build recorded its
    staging `cuda.cu`, gone once the build is published, and no later process could find it (H100,
    2026-12-07: the prebuilt Marlin kernel built again inside the capture, 370 s)."""
    from specdeploy.serve.engine_cache import CACHE_MOUNT  # noqa: PLC0415

    folder = str(Path(config.cache_dir).resolve()) if getattr(config, "cache_dir", "") else ""
    if not folder:
        return env
    return {k: folder + v[len(CACHE_MOUNT) :] if v == CACHE_MOUNT or v.startswith(f"{CACHE_MOUNT}/") else v
            for k, v in env.items()}  # fmt: skip


def watch_command(config: Any, args: argparse.Namespace, out: Path) -> tuple[list[str], dict[str, str]]:
    """The rendered command under `specdeploy watch` (argv, environment), its command.json written."""
    out.mkdir(parents=True, exist_ok=True)
    sites = ":".join(str(site(e)) if not e.startswith("/") else e for e in args.site or [args.engine])
    env = {**unlinked(config.environment(), config), "PYTHONPATH": sites,
           "PATH": f"{sites.split(':')[0]}/bin:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1",
           **dict(kv.split("=", 1) for kv in args.env)}  # fmt: skip
    argv, extra_env, named = test_only(engine_argv(config.command()), args.engine, args)
    env |= extra_env
    record = {
        "engine": args.engine,
        "rendered_command": config.command(),
        "ran": argv,
        "env": env,
        "inventory": args.inventory,
        "overrides": args.set,
        "architecture": args.architecture,
        "drafter_ids": args.drafter_ids or None,
        "test_only": named,
        "model_form": model_form(args),
    }
    (out / "command.json").write_text(json.dumps(record, indent=2))
    machine.log(f"rendered: {' '.join(config.command())}")
    watch = [sys.executable, str(Path(__file__).resolve()), "watch", "--log-file", str(out / "engine.log"),
             "--url", f"http://127.0.0.1:{PORT}", "--json", str(out / "verdict.json"), "--no-progress",
             "--stall-timeout", str(args.stall_timeout), "--timeout", str(args.timeout or WATCH_TIMEOUT_S),
             "--diagnostics", str(out / "diagnostics"),
             *(["--speculative"] if counts_drafts(config, args) else []),
             "--", "/usr/bin/env", *(f"{k}={v}" for k, v in env.items()), *argv]  # fmt: skip
    # py-spy (carried in each engine's payload) on the watch's PATH: a STALLED verdict dumps the stacks.
    return watch, {**os.environ, "PATH": f"{site(args.engine)}/bin:{os.environ['PATH']}"}


def kernels(config: Any) -> dict[str, list[float]]:
    """The compiled kernels (`*.so`) in the start's engine cache: relative path -> [bytes, mtime]."""
    folder = Path(getattr(config, "cache_dir", "") or "/nonexistent")
    return {str(p.relative_to(folder)): [p.stat().st_size, round(p.stat().st_mtime)]
            for p in sorted(folder.rglob("*.so")) if p.is_file()} if folder.is_dir() else {}  # fmt: skip


def kernels_record(config: Any, out: Path, before: dict[str, list[float]] | None = None) -> None:
    """OUT/engine-cache-kernels.json: the kernels before the start (BEFORE, kept from the call that started
    it) and after its verdict, and which it built or rebuilt. So a seeded cache shows whether the engine
    used it (2026-12-07, H200: a seeded SGLang start still ran nvcc for >240 s, and nothing said on what)."""
    record = out / "engine-cache-kernels.json"
    if before is None:
        before = json.loads(record.read_text())["before"] if record.is_file() else {}
    after = kernels(config)
    built = sorted(k for k, v in after.items() if before.get(k) != v)
    dead = unfindable(Path(getattr(config, "cache_dir", "") or "/nonexistent"))
    record.write_text(json.dumps({"before": before, "after": after, "built": built, "unfindable": dead}, indent=2))
    machine.log(
        f"engine cache: {len(before)} kernels before the start, {len(after)} after; built: "
        + (", ".join(Path(k).stem for k in built) or "none")
    )
    if dead:
        names = ", ".join(Path(d).parts[2] if len(Path(d).parts) > 2 else d for d in dead)
        machine.log(f"engine cache: {len(dead)} JIT builds no later start can find (a file their sgl_deps.json "
            f"records is gone): {names}")  # fmt: skip


def unfindable(folder: Path) -> list[str]:
    """SGLang's JIT builds under FOLDER that no later process can find: SGLang takes a build only when every
    dependency its `sgl_deps.json` records still hashes as recorded (`cache.find_prebuilt`), so one that
    records a file since gone (its own staging `cuda.cu`, 2026-12-07) is built again by every start. Only
    absolute entries are checked: the anchored ones (`kernels`, `tvm_ffi`, ...) resolve against the
    engine's own packages."""
    dead = []
    for deps in sorted(folder.rglob("sgl_deps.json")) if folder.is_dir() else []:
        try:
            entries = json.loads(deps.read_text())
        except (OSError, ValueError):
            entries = None  # unreadable: SGLang skips the leaf too
        if entries is None or any(e[0] == "abs" and not Path(e[1]).is_file() for e in entries):
            dead.append(str(deps.parent.relative_to(folder)))
    return dead


# SGLang 0.5.23 JIT-builds two WNA16 Marlin MoE variants one after the other inside its first prefill
# CUDA-graph capture (H100, 2026-12-07: about 319 s and 286 s of a 775 s capture, from the built files'
# times in engine-cache-kernels.json: `moe_wna16_marlin_bf16_t_false_false_true_{false,true}_true`).
# `--prebuild-jit` builds them at once, before the start, with SGLang's own `parallel_compile`, into the
# engine cache the start then finds (each build keyed by SGLang as the engine would key it: the same
# interpreter, environment and arguments). Its arguments: (dtype, is_ep, has_bias, expert_ids_are_sorted,
# zero_inactive_output, has_inactive_prefix_count), as the kernels' names spell them.
SGLANG_PREBUILD = """
import time, torch
from sglang.kernels.jit.utils import parallel_compile
from sglang.kernels.ops.moe.moe_wna16_marlin import _jit_moe_wna16_marlin_module as marlin
started = time.monotonic()
parallel_compile([lambda zero=zero: marlin(torch.bfloat16, False, False, True, zero, True) for zero in (False, True)])
print(f"prebuilt 2 Marlin MoE variants in {time.monotonic() - started:.1f} s")
from sglang.kernels.jit.utils.compile import toolchain
print("with (host, device) compilers", toolchain.compilers())
"""
PREBUILD_TIMEOUT_S = 420  # both variants at once took ~320 s each alone on the H100


def prebuild_jit(config: Any, args: argparse.Namespace, out: Path) -> float:
    """`--prebuild-jit` (SGLang): its slow JIT kernels built in parallel before the start, in the engine's
    interpreter and environment (out/command.json). Test-only, named in command.json's `prebuilt`: the
    start's READY then leaves out what the prebuild took. A failure is logged and left to the engine,
    which builds what it does not find. Returns its seconds (0 when none ran)."""
    if not getattr(args, "prebuild_jit", False) or args.engine != "sglang":
        return 0.0
    record = json.loads((out / "command.json").read_text())
    before = kernels(config)
    started = time.monotonic()
    try:
        # The engine's own environment: the watch's (this process's) with command.json's on top, as
        # `/usr/bin/env K=V ...` gives it. command.json's alone (2026-12-07, H100) lacked the machine's own
        # variables, and SGLang keyed its build differently (its compiler and packages are in the key): the
        # engine rebuilt the prebuilt variant under another build-<key> folder, 3.3 MB there, 5.3 MB here.
        done = subprocess.run([record["ran"][0], "-c", SGLANG_PREBUILD], env={**os.environ, **record["env"]},
                              capture_output=True, text=True, timeout=PREBUILD_TIMEOUT_S, check=False)  # fmt: skip
        code, said = done.returncode, (done.stdout + done.stderr).strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        code, said = None, [f"not done in {PREBUILD_TIMEOUT_S} s: left to the engine"]
    after = kernels(config)
    built = sorted(Path(k).stem for k, v in after.items() if before.get(k) != v)
    seconds = round(time.monotonic() - started, 1)
    record["prebuilt"] = {"exit": code, "seconds": seconds, "built": built, "said": said}
    (out / "command.json").write_text(json.dumps(record, indent=2))
    machine.log(f"prebuild (test-only, not in the start's seconds): exit {code} in {seconds} s; built: "
        f"{', '.join(built) or 'none'}; {' | '.join(said)}")  # fmt: skip
    return seconds


def shortened(watch: list[str], spent: float) -> list[str]:
    """The watch's argv with SPENT seconds taken off its `--timeout`: a prebuild runs inside the same
    bounded call, and a watch given the whole bound after it would be cut by the call's own `timeout`
    (no verdict, no up.json: the next call could not go on with the start)."""
    at = watch.index("--timeout") + 1
    return [*watch[:at], str(max(60.0, float(watch[at]) - spent)), *watch[at + 1 :]]


def start_watched(config: Any, args: argparse.Namespace, out: Path) -> tuple[int, str, float]:
    """The rendered command started under `specdeploy watch`, which returns at its verdict and leaves
    a READY engine running (stop_engines() stops it): (exit, verdict line, seconds)."""
    watch, watch_env = watch_command(config, args, out)
    watch = shortened(watch, prebuild_jit(config, args, out))
    before = kernels(config)
    started = time.monotonic()
    watched = subprocess.run(watch, capture_output=True, text=True, check=False, env=watch_env)
    verdict_line = (watched.stdout.strip().splitlines() or ["(no verdict)"])[0]
    machine.log(f"watch exit {watched.returncode}: {verdict_line}")
    print(watched.stdout[-4000:])
    memory(out)
    kernels_record(config, out, before)
    return watched.returncode, verdict_line, round(time.monotonic() - started, 1)


def serve(args: argparse.Namespace) -> int:
    out, _, config = prepare(args)
    code, verdict_line, seconds = start_watched(config, args, out)
    result: dict[str, Any] = {"verdict": verdict_line, "watch_exit": code, "watch_s": seconds}
    try:
        if code == 0 and not args.no_bench:
            result["bench"] = bench(config, out, prompts=args.prompts, concurrency=args.concurrency, tokens=args.tokens)
            machine.log(f"bench: {result['bench'].get('summary') or result['bench'].get('error')}")
            if args.engine == "sglang":
                try:
                    info = get_json(f"http://127.0.0.1:{PORT}/get_server_info")
                    states = info.get("internal_states") or [{}]
                    result["sglang_avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
                    (out / "sglang-server-info.json").write_text(json.dumps(info, indent=2, default=str))
                except Exception as exc:
                    result["sglang_server_info_error"] = repr(exc)
                machine.log(f"SGLang avg_spec_accept_length: {result.get('sglang_avg_spec_accept_length')}")
    finally:
        stop_engines()
    (out / "result.json").write_text(json.dumps(result, indent=2))
    return code


def benchmark_gate(values: dict[str, Any], config: Any, hardware_line: str | None = None) -> Any:
    """The benchmark gate as the serving action builds it, from the inventory's serving_bench_* and
    this machine's hardware line (or HARDWARE_LINE, a record's)."""
    from specdeploy.gate.benchmark import HARDWARE_PROBE, BenchmarkGate, hardware  # noqa: PLC0415
    from specdeploy.gate.rules import GateSettings  # noqa: PLC0415

    named = {k.removeprefix("serving_bench_"): v for k, v in values.items() if k.startswith("serving_bench_")}
    named["budget"] = named.pop("budget_s", 60)  # (the role hands serving_bench_budget_s as `budget`)
    settings = GateSettings.from_vars(named)
    if settings.problems():
        raise SystemExit("the inventory's benchmark settings are refused:\n- " + "\n- ".join(settings.problems()))
    if hardware_line is None:
        probe = subprocess.run(["sh", "-c", HARDWARE_PROBE], capture_output=True, text=True, check=False)
        hardware_line = hardware(probe.stdout)
    return BenchmarkGate.for_engine(settings, config, hardware_line)


def baseline_key(judge: Any, config: Any, form: dict[str, Any], engine_version: str) -> str:
    """The key a baseline is kept and found under: the rendered flags name /models/target whatever
    form lies there, so the form joins the gate's own key (flags, release, hardware, sweep)."""
    return str(judge.baseline_key(f"{config.baseline_digest()} {json.dumps(form, sort_keys=True)}", engine_version))


# vLLM >= 0.33 ships its benchmark client in Rust beside the Python one (`vllm/vllm-rs`): the binary
# `VLLM_USE_RUST_BENCH=1 vllm bench serve` execs with the same arguments (vllm/entrypoints/cli/benchmark/
# main.py), here run directly. The Python client spends ~20 s of each run importing vLLM and loading the
# tokenizer (H100, 2026-12-06: the runs 31-36 s apart for levels of 10-17 s), ten runs a measuring call.
RUST_CLIENT = "vllm-rs bench serve"


def rust_client(args: argparse.Namespace) -> Path | None:
    """The carried vLLM's Rust client when --rust-client asks for it; refused where the release has none."""
    if not args.rust_client:
        return None
    binary = site(args.engine) / "vllm" / "vllm-rs"
    if args.engine != "vllm" or not binary.is_file():
        raise SystemExit(f"--rust-client: no {binary} (vLLM 0.33's wheel ships it; SGLang has none): "
                         "run the gate without --rust-client")  # fmt: skip
    binary.chmod(binary.stat().st_mode | 0o111)
    return binary


def client_name(args: argparse.Namespace) -> str:
    from specdeploy.gate.client import name  # noqa: PLC0415

    return RUST_CLIENT if args.rust_client else name(args.engine)


def gate(args: argparse.Namespace) -> int:
    """The gate's sweep and speculation-off baseline, as a rollout runs them, in two device calls
    (each under the per-call limit): `--baseline` measures the same flags without the drafter and
    keeps the result in the store under its baseline key (the host's record's part); the next call
    measures the speculative engine and judges it against it (bench.json, the crossover line).

    `--repeat N` measures the same READY engine's sweep N times: the n-th speculative sweep is divided
    by the n-th baseline sweep, so each repeat has its own crossover line and the runs can be held
    to each other (a gate whose crossover moves between runs of one configuration measures noise)."""
    out, values, config = prepare(args)  # (puts the checkout's src/ on the path)
    judge = benchmark_gate(values, config)
    # the engine's own client, from its own site; each of its runs kept in $OUT as it finishes
    local = LocalExec(str(site(args.engine)), keep=out / "client-runs.jsonl", rust_bench=rust_client(args))
    engine, where = (config.speculation_off(), out / "baseline") if args.baseline else (config, out / "speculative")
    # a sweep divides by a baseline measured with the same client: the Rust one joins the key
    form = model_form(args) | ({"client": RUST_CLIENT} if args.rust_client else {})
    key = baseline_key(judge, config, form, args.engine_version)
    kept = machine.STORE / "baselines" / f"{key.removeprefix('sha256:')[:16]}.json"
    baseline: dict[str, Any] | None = None
    if not args.baseline:
        baseline, source = kept_baseline(kept, key, args.baseline_file)
        machine.log(f"baseline {key[:19]}: {source}")
    started = start_watched(engine, args, where) if args.phase == "all" else engine_up(engine, args, where)
    if started is None:  # --phase up: the engine left READY for the next call
        return 0 if engine_groups() else 1
    try:
        # The product's Prometheus scrapes the engine through the traffic; its dashboard's queries are
        # asked after it (gpu_truth/live_panels.py): SGLang's panels meet real series nowhere else.
        with live_panels.watching(args.engine, PORT, where, machine.STORE, machine.log) as ask_panels:
            if args.baseline:
                measure_baseline(judge, local, started, args, kept=kept, out=out, key=key)
            elif started[0] == 0:
                measure_speculative(judge, local, started, args, out=out, baseline=baseline)
            if started[0] == 0:
                capture_metrics(where)
                ask_panels()
    finally:
        stop_engines()
        live_log = live_records(where) / "engine.log"
        if args.phase == "measure" and live_log.is_file():  # the whole log: the start, then the traffic
            shutil.copy(live_log, where / "engine.log")
    return started[0]


def measure_baseline(judge: Any, local: LocalExec, started: tuple[int, str, float], args: argparse.Namespace,
                     *, kept: Path, out: Path, key: str) -> None:  # fmt: skip
    """The speculation-off engine's sweep, kept under its key (and each repeat's as it comes)."""
    code, verdict_line, seconds = started
    measured: dict[str, Any] = {"sweep": [], "note": f"the speculation-off engine was not READY ({verdict_line})"}
    begun = time.monotonic()
    if code == 0:
        measured = judge.baseline(local, None)
    machine.log(f"baseline: READY in {seconds} s, measured in {time.monotonic() - begun:.1f} s: "
        + ", ".join(f"{p['concurrency']}: {p.get('output_tokens_per_s', p.get('error'))}"
                    for p in measured["sweep"]))  # fmt: skip
    doc = {"key": key, "start_s": seconds, "verdict": verdict_line, "client": client_name(args), **measured,
           "repeats": []}  # fmt: skip
    keep(doc, kept, out)
    for n in range(2, args.repeat + 1) if code == 0 and measured.get("max_tokens") else ():
        doc["repeats"].append(judge.sweep(local, int(measured["max_tokens"])))
        machine.log(f"baseline, sweep {n}: " + ", ".join(f"{p['concurrency']}: {p.get('output_tokens_per_s')}"
                                                for p in doc["repeats"][-1]))  # fmt: skip
        keep(doc, kept, out)


def measure_speculative(judge: Any, local: LocalExec, started: tuple[int, str, float], args: argparse.Namespace,
                        *, out: Path, baseline: dict[str, Any] | None) -> None:  # fmt: skip
    """The gate on the READY speculative engine against BASELINE (bench.json, the crossover line),
    then each repeat's sweep against the baseline's repeat of the same number."""
    from specdeploy.gate import rules  # noqa: PLC0415

    verdict = json.loads((out / "speculative" / "verdict.json").read_text())
    result = judge(local, verdict, None, None, baseline)
    report = {**result.report, "start_s": started[2], "client": client_name(args), "repeats": []}
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    machine.log(result.message)
    repeats = (baseline or {}).get("repeats") or []
    tokens = int((baseline or {}).get("max_tokens") or (result.report.get("figures") or {}).get("max_tokens")
                 or rules.CALIBRATION_TOKENS)  # fmt: skip
    for n in range(2, args.repeat + 1):
        sweep = judge.sweep(local, tokens)
        against = repeats[n - 2] if len(repeats) >= n - 1 else []
        speedup = rules.speedups(sweep, against) if against else {}
        line = (
            rules.crossover(speedup, rules.failed_levels(sweep, against))
            if against
            else "no baseline sweep of this repeat"
        )
        report["repeats"].append({"sweep": sweep, "baseline_sweep": against,
                                  "speedup": {str(c): x for c, x in sorted(speedup.items())},
                                  "crossover": line})  # fmt: skip
        (out / "bench.json").write_text(json.dumps(report, indent=2))
        machine.log(f"sweep {n}: {line}")


def engine_up(config: Any, args: argparse.Namespace, out: Path) -> tuple[int, str, float] | None:
    """A gate in two device calls, so a cold start (442 s on the H100) and the measuring each have a
    call's 10 minutes: `--phase up` starts the engine under the watchdog and leaves it READY (it runs in
    its own session, which outlives the call while the machine stays warm), its records kept in the
    store; `--phase measure` finds that engine, running the same command, and returns its start's
    (exit, verdict line, seconds) with the records back in OUT. None: `up` is done."""
    up = live_records(out)
    if args.phase == "up":
        if ready_already(config, args, up):
            machine.log(f"the engine an earlier --phase up started for {out.name} is READY and answers: nothing to do")
            shutil.copytree(up, out, dirs_exist_ok=True)
            return None
        started = resumed(config, args, up)
        if started is None:
            shutil.rmtree(up, ignore_errors=True)
            # Watched into the store: the engine writes its log there for as long as it runs (this call's
            # $OUT is packed and emptied at its end; the measuring call's traffic would go to a deleted file).
            # The watch may take what is left of this call: a start still making progress at its end is
            # left running, and the next `--phase up` watches it on (SGLang's first-use kernel build took
            # more than 400 s of a 480-s watch on the H200, 2026-12-06).
            args.timeout = args.timeout or max(60.0, bound(GATE_BOUND_S) - UP_MARGIN_S)
            started = start_watched(config, args, up)
        code, verdict_line, seconds = started
        going = code != 0 and still_starting(verdict_line) and bool(engine_groups())
        if code != 0 and not going:
            stop_engines()
        (up / "up.json").write_text(json.dumps({"exit": code, "verdict": verdict_line, "seconds": seconds,
                                                "starting": going}))  # fmt: skip
        shutil.copytree(up, out, dirs_exist_ok=True)
        if going:
            machine.log(f"still starting after {seconds} s, left running: the same gate with --phase up watches it on")
        return None
    if not (up / "up.json").is_file():
        raise SystemExit(f"no engine was started for {out.name}: run the same gate with --phase up first")
    ran = json.loads((up / "command.json").read_text())["ran"]
    if ran != test_only(engine_argv(config.command()), args.engine, args)[0]:
        raise SystemExit(
            f"the running engine was started with another command ({up / 'command.json'}): --phase up again"
        )
    try:
        get_json(f"http://127.0.0.1:{PORT}/v1/models")
    except OSError as exc:
        raise SystemExit(f"the engine started for {out.name} does not answer ({exc}): --phase up again") from exc
    shutil.copytree(up, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("diagnostics"))
    started = json.loads((up / "up.json").read_text())
    if started.get("starting"):
        raise SystemExit(f"the engine started for {out.name} is still starting: the same gate with --phase up first")
    return int(started["exit"]), str(started["verdict"]), float(started["seconds"])


# What a gate's `--phase up` leaves of its call for the pack and the answer; the watch's bound elsewhere.
GATE_BOUND_S, UP_MARGIN_S, WATCH_TIMEOUT_S = 570, 25, 480.0


def still_starting(verdict_line: str) -> bool:
    """A watch that ran out of time while the engine still made progress (not stalled, not dead)."""
    return verdict_line.startswith("TIMEOUT") and "still making progress" in verdict_line


def ready_already(config: Any, args: argparse.Namespace, up: Path) -> bool:
    """Whether an earlier `--phase up` of this same command left its engine READY and answering (a second
    up call, planned for a start that may outrun one call, then has nothing to do)."""
    record = up / "up.json"
    if not record.is_file() or not (up / "command.json").is_file():
        return False
    done = json.loads(record.read_text())
    ran = json.loads((up / "command.json").read_text())["ran"]
    if (
        done.get("starting")
        or done.get("exit") != 0
        or ran != test_only(engine_argv(config.command()), args.engine, args)[0]
    ):
        return False
    try:
        get_json(f"http://127.0.0.1:{PORT}/v1/models")
    except OSError:
        return False
    return True


def resumed(config: Any, args: argparse.Namespace, up: Path) -> tuple[int, str, float] | None:
    """An engine an earlier `--phase up` left still starting, watched on to its verdict: (exit, verdict
    line, the seconds of every call's watch together); None when there is none to go on with (a fresh
    start is due), as when it runs another command or has died."""
    record = up / "up.json"
    if not record.is_file() or not json.loads(record.read_text()).get("starting"):
        return None
    before = json.loads(record.read_text())
    ran = json.loads((up / "command.json").read_text())["ran"]
    pid = engine_pid()
    if ran != test_only(engine_argv(config.command()), args.engine, args)[0] or pid is None:
        machine.log("the engine left starting is gone or runs another command: starting afresh")
        stop_engines()
        return None
    timeout = max(60.0, bound(GATE_BOUND_S) - UP_MARGIN_S)
    machine.log(f"watching on the engine left starting (pid {pid}, {before['seconds']} s so far)")
    watch = [sys.executable, str(Path(__file__).resolve()), "watch", "--pid", str(pid), "--log-file",
             str(up / "engine.log"), "--url", f"http://127.0.0.1:{PORT}", "--json", str(up / "verdict.json"),
             "--no-progress", "--stall-timeout", str(args.stall_timeout), "--timeout", str(timeout),
             "--diagnostics", str(up / "diagnostics"),
             *(["--speculative"] if counts_drafts(config, args) else [])]  # fmt: skip
    begun = time.monotonic()
    watch_env = {**os.environ, "PATH": f"{site(args.engine)}/bin:{os.environ['PATH']}"}
    watched = subprocess.run(watch, capture_output=True, text=True, check=False, env=watch_env)
    verdict_line = (watched.stdout.strip().splitlines() or ["(no verdict)"])[0]
    seconds = round(float(before["seconds"]) + time.monotonic() - begun, 1)
    machine.log(f"watch exit {watched.returncode}: {verdict_line} ({seconds} s since the start, over the calls)")
    memory(up)
    kernels_record(config, up)
    return watched.returncode, verdict_line, seconds


def stop(keep_starting: bool) -> None:
    if keep_starting and left_starting():
        machine.log("an engine a gate's --phase up left is still starting: left running for the next --phase up")
        return
    stop_engines()


def left_starting() -> bool:
    """Whether a gate's `--phase up` left an engine still starting (up.json says so, and one runs)."""
    marks = machine.STORE.glob("up/*/up.json") if machine.STORE.is_dir() else []
    return any(json.loads(m.read_text()).get("starting") for m in marks) and bool(engine_groups())


def counts_drafts(config: Any, args: argparse.Namespace) -> bool:
    """The watch asks vLLM's EAGLE-3 engine for growing draft counters (SGLang's are not on /metrics)."""
    return bool(args.engine == "vllm" and config.speculative_method == "eagle3")


def engine_pid() -> int | None:
    """The engine's first process (the launcher the watch started): the lowest pid of its command line."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in ENGINE_MARKERS) and "on_device.py" not in cmd:
            found.append(int(proc.name))
    return min(found) if found else None


def live_records(out: Path) -> Path:
    """Where a two-call gate's engine keeps its records while it runs (the store outlives each call)."""
    return machine.STORE / "up" / out.name


def kept_baseline(kept: Path, key: str, carried: Path | None) -> tuple[dict[str, Any] | None, str]:
    """This machine's own baseline, else one measured in an earlier session and kept in the checkout
    (the device time of one session holds a cold baseline or two speculative runs, not all three).
    A carried one counts only under the same key: the same flags, engine release and model."""
    if kept.is_file():
        return json.loads(kept.read_text()), "kept from this machine's --baseline call"
    if carried is None:
        return None, "none (run --baseline first, or give --baseline-file)"
    doc = json.loads(carried.read_text())
    if doc.get("key") != key:
        raise SystemExit(
            f"{carried}: its baseline key {str(doc.get('key'))[:19]} is not this configuration's "
            f"{key[:19]} (the flags, release or model differ): measure it again with --baseline"
        )
    return doc, f"carried from {carried} (measured {doc.get('time', '?')} on {doc.get('hardware', '?')})"


def keep(doc: dict[str, Any], kept: Path, out: Path) -> None:
    """The baseline as measured so far: in the store (the next call's) and in $OUT."""
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(doc, indent=2))
    (out / "baseline.json").write_text(json.dumps(doc, indent=2))


def pack(name: str) -> None:
    """Everything under $OUT into $OUT/NAME.tgz, the rest removed: one file comes back whole."""
    target = machine.OUT.parent / f".{name}.tgz"
    with tarfile.open(target, "w:gz") as tar:
        for item in sorted(machine.OUT.iterdir()):
            tar.add(item, arcname=item.name)
    for item in machine.OUT.iterdir():
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    target.rename(machine.OUT / f"{name}.tgz")
    machine.log(
        f"packed {machine.OUT / f'{name}.tgz'} ({(machine.OUT / f'{name}.tgz').stat().st_size / 1024**2:.1f} MiB)"
    )


def watch(rest: list[str]) -> int:
    """`specdeploy watch` without the CLI's other commands (their imports: Docker, SSH, Ansible)."""
    sys.path.insert(0, str(machine.ROOT / "src"))
    from specdeploy.watch import cli as watch_cli  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="specdeploy watch")
    watch_cli.add_arguments(parser)
    return int(watch_cli.run(parser.parse_args(rest)))


def small_steps(sub: Any) -> None:
    """The parsers of the steps around the engine: receive, stop, pack, bound."""
    receiving = sub.add_parser("receive")
    receiving.add_argument("--budget", type=int, help="status's budget_left_s as this machine starts")
    receiving.add_argument("--left", type=int, help="budget_left_s in the last answer (what the lease charged so far)")
    stopping = sub.add_parser("stop", help="stop any engine an earlier call left (one cut off at its limit)")
    keep = "not an engine a gate's --phase up left still starting (the next watches it on)"
    stopping.add_argument("--keep-starting", action="store_true", help=keep)
    packing = sub.add_parser("pack", help="$OUT as one NAME.tgz (the device returns 8 files, 2 folders down)")
    packing.add_argument("name")
    bounding = sub.add_parser("bound", help="seconds a call may run: MOST, or what is left of the device time")
    bounding.add_argument("most", type=float)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "watch":
        return watch(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    small_steps(sub)
    ins = sub.add_parser("install")
    ins.add_argument("engine")
    ins.add_argument("--leave-out", action="append", default=[], help="wheel name prefix not to install")
    engine_run = argparse.ArgumentParser(add_help=False)  # what `serve` and `gate` share
    engine_run.add_argument("engine", choices=("vllm", "sglang"))
    engine_run.add_argument("--inventory", default="inventories/gpu-h200")
    engine_run.add_argument("--set", action="append", default=[], help="serving_KEY=VALUE (YAML) over the inventory")
    engine_run.add_argument("--env", action="append", default=[], help="KEY=VALUE for the engine, beyond the rendering")
    engine_run.add_argument("--site", action="append", help="engine site folders (default: the engine's)")
    engine_run.add_argument("--architecture", default="kimi_k25", choices=("kimi_k25", "deepseek_v3"))
    engine_run.add_argument("--drafter-ids", default="", help="aux layer ids for a drafter variant, e.g. 3,4,5")
    engine_run.add_argument("--tag", default="", help="subfolder of $OUT")
    engine_run.add_argument("--stall-timeout", type=float, default=240)
    bounds = f"the watch's bound (default {WATCH_TIMEOUT_S:.0f} s; a gate's up: what is left of its call)"
    engine_run.add_argument("--timeout", type=float, default=None, help=bounds)
    engine_run.add_argument(
        "--form",
        default="tiny",
        choices=("tiny", "full-depth", "real-files"),
        help="the test bed's tiny models, or Kimi-K2.5's real shapes (specdeploy_testbed.real_shapes)",
    )
    engine_run.add_argument("--layers", type=int, default=61, help="full-depth: decoder layers")
    engine_run.add_argument(
        "--experts",
        default="auto",
        help="full-depth: routed experts per layer (cut); auto: what fits this GPU (experts_for)",
    )
    engine_run.add_argument("--dummy-load", action="store_true", help="test-only: --load-format dummy")
    engine_run.add_argument("--no-engine-cache", action="store_true", help="no engine cache (every start cold)")
    engine_run.add_argument("--prebuild-jit", action="store_true",
                            help="test-only, SGLang: its Marlin MoE JIT kernels built before the start")  # fmt: skip
    engine_run.add_argument(
        "--acceptance",
        type=float,
        default=0.0,
        help="test-only: a set mean acceptance length (vLLM's synthetic sampler, SGLang's SGLANG_SIMULATE_ACC_LEN)",
    )
    srv = sub.add_parser("serve", parents=[engine_run])
    srv.add_argument("--no-bench", action="store_true")
    srv.add_argument("--prompts", type=int, default=32)
    srv.add_argument("--concurrency", type=int, default=4)
    srv.add_argument("--tokens", type=int, default=64)
    gat = sub.add_parser("gate", parents=[engine_run], help="the gate's sweep against the speculation-off baseline")
    gat.add_argument("--baseline", action="store_true", help="measure and keep the speculation-off baseline")
    gat.add_argument(
        "--baseline-file",
        type=Path,
        help="a baseline.json kept from an earlier session's --baseline (same key), when this machine has none",
    )
    gat.add_argument("--engine-version", default="", help="the engine's version (part of the baseline's key)")
    gat.add_argument(
        "--phase",
        default="all",
        choices=("all", "up", "measure"),
        help="up: start the engine and leave it READY; measure: the gate on the engine `up` left (two calls)",
    )
    gat.add_argument("--repeat", type=int, default=1, help="sweeps of the same READY engine (each its own crossover)")
    gat.add_argument(
        "--rust-client",
        action="store_true",
        help=f"vLLM: the gate's client runs as {RUST_CLIENT} (the carried release's own, same flags)",
    )
    loads.add_parser(sub, [engine_run])
    carried_cache.add_parser(sub)
    args = parser.parse_args()
    if args.step == "gate":
        return gate(args)
    if args.step == "loads":
        return loads.loads(args, sys.modules[__name__])
    if args.step == "bound":
        print(bound(args.most))
        return 0
    done = {
        "receive": lambda: receive(args.budget, args.left),
        "stop": lambda: stop(args.keep_starting),
        "pack": lambda: pack(args.name),
        "install": lambda: install(args.engine, args.leave_out),
        "cache-out": lambda: carried_cache.cache_out(args.engine, args.only),
    }.get(args.step)
    if done:
        done()
        return 0
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
