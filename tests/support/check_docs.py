"""Every path, link, make target and module the docs name exists (run by `make lint`).

Read: README.md and every docs/**/*.md. Checked:
- links and images, `[text](target)` and `[text]: target`: a target that is not a URL (`scheme:`) is
  resolved against the page's folder and must exist; its `#anchor`, into a Markdown page (or the page
  itself), must be one that page's headings make;
- repository paths in code (inline code and fenced blocks), token by token: a token whose first
  segment is a top-level folder of the project (`src/`, `roles/`, `tests/`, ... and `docker/`, named
  even before it exists) or a top-level file (`Makefile`, `pyproject.toml`, ...) must exist, unless
  .gitignore covers it (a generated file the docs point to, e.g. `inventories/local/hosts.yml`);
- `make TARGET` in code: the Makefile has that target;
- `specdeploy.a.b` / `specdeploy_testbed.a.b` in inline code: packages and modules down to the first
  part that is neither, which the module reached (or the package's `__init__.py`) must name;
- README.md is at most 200 lines, and links every page docs/*.md (the README is the map).
Not checked: URLs, host paths (`/var/lib/...`, `~/...`), paths outside the project (`../shared/...`),
upstream projects' paths (`vllm/...`), and tokens with a placeholder or glob (`<host>`, `*`, `{a,b}`,
`…`): they name no single file.

    python tests/support/check_docs.py [ROOT]    exit 0: all found; 1: each problem on a line
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

README_MAX_LINES = 200
# Project folders checked even when absent (a doc naming `docker/x` while docker/ is gone is stale).
PROJECT_DIRS = frozenset(
    {".ci", "ansible", "bench", "docker", "docs", "gpu_truth", "inventories", "roles", "src", "testbed", "tests"}
)
PACKAGES = {"specdeploy": Path("src/specdeploy"), "specdeploy_testbed": Path("testbed/specdeploy_testbed")}
PLACEHOLDER = re.compile(r"[<>*?{}\[\]…$|]|\.\.\.")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
MAKE = re.compile(r"(?<![\w./-])make\s+([a-z][\w-]*)")
MODULE = re.compile(r"(?<![\w./-])((?:specdeploy_testbed|specdeploy)(?:\.\w+)+)")
TOKEN_EDGES = "()[],;:'\"!\u201c\u201d\u2018\u2019"  # and curly quotes


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.message}"


def pages(root: Path) -> list[Path]:
    docs = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [root / "README.md", *docs]


def top_level(root: Path, ignored: list[str]) -> tuple[frozenset[str], frozenset[str]]:
    """(folders, files) at the project's top whose names, followed by "/", make a token a path."""
    dirs, files = set(PROJECT_DIRS), set[str]()
    for entry in root.iterdir():
        if entry.name == ".git" or _ignored(entry.name, ignored) or entry.name.endswith(".egg-info"):
            continue
        (dirs if entry.is_dir() else files).add(entry.name)
    return frozenset(dirs), frozenset(f for f in files if not f.startswith("."))


def gitignore(root: Path) -> list[str]:
    path = root / ".gitignore"
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .gitignore covers rel or a folder above it (its plain patterns; no negation)."""
    parts = rel.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        pattern = raw.rstrip("/")
        anchored = pattern.startswith("/") or "/" in pattern
        pattern = pattern.lstrip("/")
        for prefix in prefixes:
            name = prefix if anchored else prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(name, pattern):
                return True
    return False


def make_targets(root: Path) -> frozenset[str]:
    makefile = root / "Makefile"
    if not makefile.is_file():
        return frozenset()
    found = re.findall(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", makefile.read_text(), flags=re.MULTILINE)
    return frozenset(found)


def _code(lines: list[str]) -> list[tuple[int, str, bool]]:
    """(line number, code text, in a fence) for every fenced line and inline code span."""
    out, fenced = [], False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            out.append((number, line, True))
        else:
            out.extend((number, m.group(2), False) for m in INLINE_CODE.finditer(line))
    return out


def _prose(lines: list[str], keep_code: bool = False) -> list[tuple[int, str]]:
    """Lines outside fences, by default with their inline code removed (links in code are not links)."""
    out, fenced = [], False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((number, line if keep_code else INLINE_CODE.sub("", line)))
    return out


def _path_token(token: str, dirs: frozenset[str], files: frozenset[str]) -> str | None:
    token = token.strip(TOKEN_EDGES).removeprefix("./")
    token = re.sub(r"(::\S*|:\d+(:\d+)?)$", "", token)  # file:line, pytest ids
    if PLACEHOLDER.search(token) or "=" in token:
        return None
    first, slash, _ = token.partition("/")
    if (slash and first in dirs) or (not slash and token in files):
        return token.rstrip(".")
    return None


def _module_problem(root: Path, dotted: str) -> str | None:
    package, *parts = dotted.rstrip(".").split(".")
    here = root / PACKAGES[package]
    for part in parts:
        if here.is_dir() and (here / part).is_dir():
            here = here / part
        elif here.is_dir() and (here / f"{part}.py").is_file():
            here = here / f"{part}.py"
        else:  # an attribute: the module (or the package's __init__.py) names it
            module = here if here.is_file() else here / "__init__.py"
            if module.is_file() and re.search(rf"\b{re.escape(part)}\b", module.read_text()):
                return None
            return f"{dotted}: {part!r} is neither a module nor a name in {module.relative_to(root)}"
    return None


def anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub makes of a page's headings: the text as rendered, lowercased, without
    punctuation but `-` and `_`, spaces as `-`; a repeated one gets `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    for _, text in _prose(page.read_text().splitlines(), keep_code=True):
        heading = HEADING.match(text)
        if not heading:
            continue
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return frozenset(seen)


def _link_problems(rel: str, page: Path, lines: list[str]) -> list[Problem]:
    problems = []
    for number, text in _prose(lines):
        targets = [m.group(1) for m in LINK.finditer(text)]
        ref = REF_LINK.match(text)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if SCHEME.match(target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                problems.append(Problem(rel, number, f"link target {target} does not exist"))
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(Problem(rel, number, f"link target {target}: no heading makes #{anchor}"))
    return problems


@dataclass(frozen=True)
class _Repo:
    root: Path
    ignored: list[str]
    dirs: frozenset[str]
    files: frozenset[str]
    targets: frozenset[str]


def _code_problems(repo: _Repo, rel: str, lines: list[str]) -> list[Problem]:
    problems = []
    for number, code, fenced in _code(lines):
        for token in code.split():
            path = _path_token(token, repo.dirs, repo.files)
            if path and not (repo.root / path).exists() and not _ignored(path, repo.ignored):
                problems.append(Problem(rel, number, f"{path} does not exist"))
        for match in MAKE.finditer(code):
            if match.group(1) not in repo.targets:
                problems.append(Problem(rel, number, f"make {match.group(1)}: no such target in the Makefile"))
        modules = [] if fenced else [m.group(1) for m in MODULE.finditer(code)]
        problems.extend(Problem(rel, number, msg) for msg in map(partial(_module_problem, repo.root), modules) if msg)
    return problems


def _readme_problems(root: Path) -> list[Problem]:
    readme = root / "README.md"
    if not readme.is_file():
        return []
    problems = []
    text = readme.read_text()
    count = len(text.splitlines())
    if count > README_MAX_LINES:
        problems.append(Problem("README.md", count, f"{count} lines, over {README_MAX_LINES}: move detail to docs/"))
    linked = {(root / m.group(1).split("#", 1)[0]).resolve() for m in LINK.finditer(text)}
    for page in sorted((root / "docs").glob("*.md")):
        if page.resolve() not in linked:
            problems.append(Problem("README.md", 0, f"does not link {page.relative_to(root).as_posix()}"))
    return problems


def check(root: Path) -> list[Problem]:
    root = root.resolve()
    ignored = gitignore(root)
    dirs, files = top_level(root, ignored)
    repo = _Repo(root, ignored, dirs, files, make_targets(root))
    problems: list[Problem] = []
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        if not page.is_file():
            problems.append(Problem(rel, 0, "missing"))
            continue
        lines = page.read_text().splitlines()
        problems += _link_problems(rel, page, lines)
        problems += _code_problems(repo, rel, lines)
    return problems + _readme_problems(root)


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2]
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    checked = len(pages(root))
    if problems:
        print(f"docs: {len(problems)} problem(s) in {checked} pages", file=sys.stderr)
        return 1
    print(f"docs: every path, link, make target and module named in {checked} pages exists")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
