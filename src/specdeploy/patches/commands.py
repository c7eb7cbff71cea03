"""`specdeploy patch plan|apply|verify`: what each prints and how it exits."""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from rich.console import Console

from specdeploy.patches import engine_install, patchset, triton_kernels
from specdeploy.patches.verify import verify

# soft_wrap: build logs are not terminals, and a wrapped `file:line: reason` would be lost.
out = Console(stderr=True, highlight=False, soft_wrap=True)


def _plan(install: engine_install.EngineInstall, args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    result = patchset.plan(install)
    out.print(
        f"{install.engine} {install.version} in {install.site_packages}: patch set [bold]{result.patch_set.name}[/]"
    )
    out.print(f"  {result.patch_set.note}")
    for planned in result.files:
        state = "will patch" if planned.changes else "already applied"
        out.print(f"  {state}: {planned.patch.path} [dim]({planned.patch.name})[/] {planned.patch.summary}")
        if args.diff and planned.changes:
            diff = difflib.unified_diff(
                planned.before.splitlines(keepends=True),
                planned.after.splitlines(keepends=True),
                f"a/{planned.patch.path}",
                f"b/{planned.patch.path}",
            )
            out.print("".join(diff), markup=False, end="")
    if result.patch_set.native:
        out.print("  nothing to change: support is native")
    pending = [f.patch.name for f in result.pending]
    return 0, {"patch_set": result.patch_set.name, "native": result.patch_set.native, "pending": pending}


def _apply(install: engine_install.EngineInstall, args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    result = patchset.plan(install)  # every codemod succeeds in memory, or nothing is written
    written = patchset.apply(result)
    doc = patchset.manifest(result)
    if result.patch_set.native:
        out.print(f"{install.engine} {install.version}: support is native; no engine file changed")
    elif written:
        for planned in written:
            out.print(f"[green]patched[/] {planned.patch.path} ({planned.patch.name})")
    else:
        out.print(f"{install.engine} {install.version}: every patch is already applied; nothing changed")
    out.print(f"manifest: {install.site_packages / patchset.MANIFEST} ({doc['digest']})")
    return 0, {"changed": [p.patch.path for p in written], "manifest": doc}


def _triton(install: engine_install.EngineInstall, args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    """The image build's own layer: fail unless the triton_kernels vLLM will import is sound."""
    if install.engine != "vllm":
        out.print("triton_kernels: not applicable to", install.engine)
        return 0, {"applicable": False}
    report = triton_kernels.check(install)
    moved: list[str] = []
    if not report.ok and args.fix and report.shadowing:
        moved = [str(p) for p in triton_kernels.quarantine_stray(install)]
        report = triton_kernels.check(install)
    out.print(f"triton_kernels: {report.summary()}" + (f" (moved aside: {moved})" if moved else ""))
    return (0 if report.ok else 1), {"ok": report.ok, "missing": report.missing, "quarantined": moved}


def _verify(install: engine_install.EngineInstall, args: argparse.Namespace) -> tuple[int, dict[str, object]]:
    report = verify(install, python=args.python)
    for check in report.checks:
        out.print(f"[green]✓[/] {check}")
    for finding in report.findings:
        out.print(f"[red]✗[/] {finding}", markup=True)
    triton: dict[str, object] = {"applicable": install.engine == "vllm"}
    if install.engine == "vllm":
        tk = triton_kernels.check(install)
        if not tk.ok and args.fix and tk.shadowing:
            moved = triton_kernels.quarantine_stray(install)
            out.print(f"[yellow]fixed[/] triton_kernels: moved the shadowing copy to {moved[0].parent}")
            triton["quarantined"] = [str(p) for p in moved]
            tk = triton_kernels.check(install)
        mark = "[green]✓[/]" if tk.ok else "[yellow]![/]"
        hint = "" if tk.ok else " (rerun with --fix to move the shadowing copy aside)"
        out.print(f"{mark} triton_kernels: {tk.summary()}{hint}")
        triton.update(ok=tk.ok, shadowing=tk.shadowing, missing=tk.missing, summary=tk.summary())
    for level in report.proof():
        out.print(f"  {level}")
    targets = "deepseek_v3, kimi_k2 and kimi_k25 targets"
    if report.ok:
        out.print(f"[bold green]EAGLE-3 drafters are accepted for {targets} by the source[/] ({install.engine} "
                  f"{install.version}; proven to the levels above, and no further)")  # fmt: skip
    else:
        out.print(f"[bold red]EAGLE-3 drafters would be refused for {targets}[/] ({install.engine} {install.version})")
    return (0 if report.ok else 1), {
        "accepted": report.ok,
        "checks": report.checks,
        "findings": [str(f) for f in report.findings],
        "import_probe": report.import_probe,
        "drafter_probe": report.drafter_probe,
        "spec_decode": report.spec_decode,
        "proof": report.proof(),
        "triton_kernels": triton,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["plan", "apply", "verify", "triton"])
    parser.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    parser.add_argument("--site-packages", required=True, help="the engine's site-packages directory")
    parser.add_argument("--python", help="verify: interpreter for the import probe (default: this one)")
    parser.add_argument("--diff", action="store_true", help="plan: show the unified diff")
    parser.add_argument("--fix", action="store_true", help="verify/triton: move a shadowing triton_kernels aside")
    parser.add_argument("--expect-digest", help="apply: fail unless the manifest digest is this one")
    parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


ACTIONS = {"plan": _plan, "apply": _apply, "verify": _verify, "triton": _triton}


def run(action: str, engine: str, site_packages: Path, args: argparse.Namespace) -> int:
    install = engine_install.detect(engine, site_packages.resolve())
    code, result = ACTIONS[action](install, args)
    expected = getattr(args, "expect_digest", None)
    if code == 0 and expected and action == "apply":
        got = result["manifest"]["digest"]  # type: ignore[index]
        if got != expected:
            out.print(f"[red]patch manifest digest {got} differs from the expected {expected}[/]")
            code = 1
    if args.json:
        print(json.dumps({"engine": engine, "version": install.version, "action": action, **result}, default=str))
    return code
