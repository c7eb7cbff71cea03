"""`make bench`: how long `specdeploy patch apply` + `verify` take on real extracted releases.

Figures are measured in this run only; ratios compare steps of the same run.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from specdeploy import pins
from specdeploy.engine_image import wheels
from specdeploy.patches import engine_install, patchset
from specdeploy.patches.verify import verify


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    rows = []
    for version in ("0.16.0", "0.17.1", "0.18.0", pins.VLLM_CUDA):
        source = wheels.release_sources("vllm", version)
        with tempfile.TemporaryDirectory() as tmp:
            site = Path(tmp) / "site-packages"
            shutil.copytree(source, site)
            install = engine_install.detect("vllm", site)
            _, t_apply = timed(lambda: patchset.apply(patchset.plan(install)))  # noqa: B023
            report, t_verify = timed(lambda: verify(install))  # noqa: B023
            _, t_again = timed(lambda: patchset.apply(patchset.plan(install)))  # noqa: B023
            assert report.ok, report.findings
            rows.append((version, t_apply, t_verify, t_again))
    print(f"{'vLLM':>8} {'apply s':>8} {'verify s':>9} {'apply+verify s':>15} {'2nd apply s':>12} {'2nd/1st':>8}")
    for version, t_apply, t_verify, t_again in rows:
        ratio = t_again / t_apply if t_apply else float("nan")
        print(f"{version:>8} {t_apply:8.2f} {t_verify:9.2f} {t_apply + t_verify:15.2f} {t_again:12.2f} {ratio:8.2f}")


if __name__ == "__main__":
    main()
