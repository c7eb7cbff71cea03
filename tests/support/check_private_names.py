"""Interfaces are public: no module imports or calls another module's underscore name (src/, ansible/).

A name with one leading underscore is its own file's: a file may use its own (on `self`, `cls`,
`super()`, or another object of a class it defines), never another's. Run by `make lint`; the unit
test tests/unit/test_private_names.py shows it failing."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("src", "ansible")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_names(tree: ast.AST) -> set[str]:
    """The underscore names this file defines: functions, classes, attributes it assigns."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return {name for name in found if _private(name)}


def _own_object(base: ast.expr) -> bool:
    if isinstance(base, ast.Name) and base.id in ("self", "cls"):
        return True
    return isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"


def _foreign(node: ast.Attribute, own: set[str]) -> bool:
    return _private(node.attr) and node.attr not in own and not _own_object(node.value)


def violations(path: Path, text: str) -> Iterator[str]:
    tree = ast.parse(text)
    own = own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    yield f"{path}:{node.lineno}: imports {node.module}.{alias.name}, another module's private name"
        elif isinstance(node, ast.Attribute) and _foreign(node, own):
            yield f"{path}:{node.lineno}: {ast.unparse(node)[:60]}: another module's private name"


def main() -> int:
    found = [v for tree in TREES for path in sorted((ROOT / tree).rglob("*.py"))
             for v in violations(path.relative_to(ROOT), path.read_text(encoding="utf-8"))]  # fmt: skip
    if found:
        print("\n".join(found))
        print(f"{len(found)} use(s) of another module's private name: make it public, or keep it in its module")
        return 1
    print(f"private names: none used across modules ({', '.join(TREES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
