"""No import circle: no module of specdeploy, nor of the test bed's package, imports (at its top level) a
module that imports it back, directly or through others. Read from the source with ast; nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"specdeploy": ROOT / "src" / "specdeploy", "specdeploy_testbed": ROOT / "testbed" / "specdeploy_testbed"}


def modules(package: str, folder: Path) -> dict[str, Path]:
    """Dotted name → file, for every module of the package (a package is its __init__.py)."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runs_on_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported: not function bodies, nor `if TYPE_CHECKING:`."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _runs_on_import(node.body)
            yield from _runs_on_import(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _runs_on_import(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _runs_on_import(node.body)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules `name` imports at its top level: `from pkg import mod` names the module where one exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runs_on_import(ast.parse(path.read_text(encoding="utf-8")).body):
        found |= named(node, package, known)
    return found & known - {name}


def named(node: ast.AST, package: str, known: set[str]) -> set[str]:
    """The modules an import statement names: `from pkg import mod` names the module where one exists."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom):
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
        source = ".".join(part for part in (base, node.module or "") if part)
        return {f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names}
    return set()


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as its modules in order (the first again at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every module below it is

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], node, nxt]  # an open module is on the path
            if nxt not in state and (found := visit(nxt, [*path, node])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return None


def import_graph(package: str, folder: Path) -> dict[str, set[str]]:
    found = modules(package, folder)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_imports_one_that_imports_it_back(package: str) -> None:
    graph = import_graph(package, PACKAGES[package])
    assert len(graph) > 5  # the package was found and read
    circle = cycle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_check_sees_a_circle_through_relative_and_absolute_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("try:\n    from . import c\nexcept ImportError:\n    pass\n")
    (pkg / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert cycle(import_graph("pkg", pkg)) is None  # a type checker's import runs never
    (pkg / "sub" / "c.py").write_text("def later():\n    import pkg.a\n")
    assert cycle(import_graph("pkg", pkg)) is None  # nor does one inside a function, at import time
    (pkg / "sub" / "c.py").write_text("from ..a import VALUE\n")
    assert cycle(import_graph("pkg", pkg)) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]


def unit(name: str, package: str) -> str:
    """A module's unit: its subpackage of the package (`specdeploy.serve`), or itself at the package's root."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else package


def every_import(name: str, path: Path, known: set[str]) -> set[str]:
    """Every known module `name` imports anywhere (a function's import too: it is a loop all the same,
    only later), except a type checker's."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                   and node.test.id == "TYPE_CHECKING" for n in ast.walk(node)}  # fmt: skip
    found = set()
    for node in ast.walk(tree):
        if id(node) not in typing_only:
            found |= named(node, package, known)
    return found & known - {name}


def package_graph(package: str, folder: Path) -> dict[str, set[str]]:
    """Unit → the units it imports (a subpackage or a root module of the package)."""
    found = modules(package, folder)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        graph.setdefault(unit(name, package), set()).update(
            unit(other, package) for other in every_import(name, path, set(found))
        )
    return {u: targets - {u, package} for u, targets in graph.items()}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_imports_one_that_imports_it_back(package: str) -> None:
    """Between packages too (records -> serve.prewarm while serve.rollout -> records is no loop of files,
    but it is one of rooms): record types sit below everything that writes or reads them."""
    graph = package_graph(package, PACKAGES[package])
    assert len(graph) > 3
    circle = cycle(graph)
    assert circle is None, "import loop between packages: " + " -> ".join(circle or [])


def test_the_package_check_sees_a_loop_through_a_function_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from pkg.low import b\n")
    (pkg / "low" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import a\n"
    )
    assert cycle(package_graph("pkg", pkg)) is None
    (pkg / "low" / "c.py").write_text("def later():\n    from pkg.high import a\n")
    assert cycle(package_graph("pkg", pkg)) == ["pkg.high", "pkg.low", "pkg.high"]
