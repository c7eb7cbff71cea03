"""`python -m specdeploy.gpu.cli facts`: run nvidia-smi on this host and print GPU facts as JSON.

This is what the Ansible fact script calls on the target, so it stays stdlib-only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.gpu.checks import (
    DRIVER_FIX,
    driver_problems,
    foreign_process_problems,
    gpu_count_problems,
    nccl_recommendations,
)
from specdeploy.gpu.facts import CSV_FORMAT, QUERY_APPS_FIELDS, QUERY_GPU_FIELDS, GpuFacts, collect


def _run(smi: str, *args: str) -> str:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        raise SpecdeployError(f"{smi}: not found", hint="is the NVIDIA driver installed?") from None
    except subprocess.TimeoutExpired:
        raise SpecdeployError(f"`{smi} {' '.join(args)}` hung for 60 s", hint="check `dmesg` for Xid errors") from None
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()
        raise SpecdeployError(
            f"`{smi} {' '.join(args)}` failed ({done.returncode}): {output}",
            hint=f"on a Blackwell host, 'No devices were found' usually means the proprietary module is loaded: "
            f"{DRIVER_FIX}",
        )
    return done.stdout


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def gather(smi: str, driver_version_file: Path) -> GpuFacts:
    return collect(
        xml=_run(smi, "-q", "-x"),
        topo=_run(smi, "topo", "-m"),
        query_gpu=_run(smi, f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", f"--format={CSV_FORMAT}"),
        apps=_run(smi, f"--query-compute-apps={','.join(QUERY_APPS_FIELDS)}", f"--format={CSV_FORMAT}"),
        driver_version_file=_read_optional(driver_version_file),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.gpu.cli")
    commands = parser.add_subparsers(dest="command", required=True)
    facts_cmd = commands.add_parser("facts", help="print GPU facts as JSON (plus problems when --tp is given)")
    facts_cmd.add_argument("--smi", default="nvidia-smi", help="the nvidia-smi to run")
    facts_cmd.add_argument("--tp", type=int, help="tensor parallel size to check the GPU count against")
    facts_cmd.add_argument("--pp", type=int, default=1, help="pipeline parallel size")
    facts_cmd.add_argument("--driver-version-file", type=Path, default=Path("/proc/driver/nvidia/version"))
    facts_cmd.add_argument("--cmdline-file", type=Path, default=Path("/proc/cmdline"))
    args = parser.parse_args(argv)
    try:
        facts = gather(args.smi, args.driver_version_file)
    except SpecdeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    data: dict[str, object] = facts.to_json()
    if args.tp is not None:
        data["problems"] = [
            *gpu_count_problems(facts, args.tp, args.pp),
            *driver_problems(facts),
            *foreign_process_problems(facts),
        ]
        data["nccl"] = nccl_recommendations(facts, iommu_fixed=False, cmdline=_read_optional(args.cmdline_file) or "")
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
