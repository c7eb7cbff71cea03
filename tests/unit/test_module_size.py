"""No module of specdeploy runs past 500 lines: one that grows past it is split along its domain's lines
(public names, no private name imported across modules), not given a higher limit."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "specdeploy"
MAX_LINES = 500


def too_long(folder: Path, limit: int = MAX_LINES) -> list[str]:
    """'path: N lines' for every .py file under FOLDER longer than LIMIT lines, path relative to FOLDER's parent."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(folder.parent)}: {lines} lines")
    return found


def test_no_module_of_specdeploy_exceeds_500_lines() -> None:
    assert list(PACKAGE.rglob("*.py")), PACKAGE
    offending = too_long(PACKAGE)
    assert not offending, f"modules over {MAX_LINES} lines (split them by domain): " + "; ".join(offending)


def test_a_module_over_the_limit_is_named_with_its_length(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_long(package) == [f"pkg/sub/long.py: {MAX_LINES + 1} lines"]
