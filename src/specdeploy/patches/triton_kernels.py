"""Is the `triton_kernels` that vLLM will import the one it needs?

vLLM bundles a copy at vllm/third_party/triton_kernels, but `import_triton_kernels()` prefers
any `triton_kernels` in site-packages. A stale pip-installed copy then shadows the bundled one,
and from 0.17 the import of `SparseMatrix` fails ("Failed to import Triton kernels"). The
symbols required are read from this vLLM's own import statements, not from a list kept here.
"""

from __future__ import annotations

import ast
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdeploy.patches.engine_install import EngineInstall

PACKAGE = "triton_kernels"


@dataclass
class TritonKernelsReport:
    effective: Path | None
    shadowing: bool
    missing: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.missing

    def summary(self) -> str:
        if self.effective is None:
            return "ok: no triton_kernels installed and none bundled (vLLM's gpt-oss MoE path is off); nothing shadows"
        where = "a site-packages copy SHADOWS vLLM's bundled one" if self.shadowing else "vLLM's bundled copy"
        if not self.missing:
            return f"ok: {where} ({self.effective}) provides every symbol this vLLM imports"
        lacks = "; ".join(f"{mod}: {', '.join(names)}" for mod, names in sorted(self.missing.items()))
        return f"{where} ({self.effective}) lacks symbols this vLLM imports: {lacks}"


def required_symbols(vllm_root: Path) -> dict[str, set[str]]:
    """{module: names} from every `from triton_kernels.X import ...` in vLLM (its bundled copy aside)."""
    needed: dict[str, set[str]] = {}
    for path in vllm_root.rglob("*.py"):
        if "third_party" in path.parts:
            continue
        text = path.read_text(errors="replace")
        if PACKAGE not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PACKAGE):
                needed.setdefault(node.module or PACKAGE, set()).update(a.name for a in node.names)
    return needed


def _module_file(package_root: Path, module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for candidate in (package_root / rel.with_suffix(".py"), package_root / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return package_root / "__init__.py" if module == PACKAGE and (package_root / "__init__.py").is_file() else None


def _top_level_names(path: Path) -> set[str] | None:
    """Names a module defines at top level (None: it defines __getattr__, so anything may exist)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _provided(package_root: Path, module: str, names: set[str]) -> set[str]:
    """Which of `names` the copy at package_root provides for `module`."""
    module_path = _module_file(package_root, module)
    if module_path is None:
        return set()
    defined = _top_level_names(module_path)
    if defined is None:
        return set(names)
    submodules = {p.stem for p in module_path.parent.glob("*.py")} if module_path.name == "__init__.py" else set()
    return {n for n in names if n in defined or n in submodules}


def check(install: EngineInstall) -> TritonKernelsReport:
    """The bundled copy is the reference: a shadowing copy must provide what it provides of vLLM's imports.

    (vLLM also imports ROCm-only and legacy fallbacks inside try/except; the bundled copy lacks
    those too, so they are not requirements.)
    """
    site = install.site_packages
    stray = site / PACKAGE
    bundled = site / "vllm" / "third_party" / PACKAGE
    shadowing = (stray / "__init__.py").is_file()
    effective = stray if shadowing else (bundled if bundled.is_dir() else None)
    report = TritonKernelsReport(effective, shadowing)
    if effective is None or not shadowing:
        return report
    for module, names in required_symbols(site / "vllm").items():
        needed = _provided(bundled, module, names) if bundled.is_dir() else names
        lacking = sorted(needed - _provided(stray, module, needed))
        if lacking:
            report.missing[module] = lacking
    return report


def quarantine_stray(install: EngineInstall) -> list[Path]:
    """Move the shadowing copy and its dist-info aside (kept, not deleted) so the bundled one loads."""
    site = install.site_packages
    dest = site.parent / "specdeploy-quarantine" / time.strftime("%Y%m%dT%H%M%S")
    moved: list[Path] = []
    for path in [site / PACKAGE, *sorted(site.glob(f"{PACKAGE}-*.dist-info"))]:
        if path.exists():
            dest.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(dest / path.name))
            moved.append(dest / path.name)
    return moved
