"""The docs check (`make lint`): every path, link, make target and module the docs name exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.check_docs import check, main


def _repo(tmp_path: Path, page: str, readme_extra: str = "") -> Path:
    (tmp_path / "Makefile").write_text("V := 1\nlint: setup ## lint\n\ttrue\ndeploy: setup\n\ttrue\nsetup:\n")
    (tmp_path / ".gitignore").write_text("/.state/\n# generated\n/inventories/local/hosts.yml\n__pycache__/\n")
    serve = tmp_path / "src" / "specdeploy" / "serve"
    serve.mkdir(parents=True)
    (tmp_path / "src" / "specdeploy" / "__init__.py").write_text("__version__ = '1'\n")
    (serve / "__init__.py").write_text("from .config import ServingConfig as ServingConfig\n")
    (serve / "config.py").write_text("class ServingConfig:\n    def render(self): ...\n")
    (tmp_path / "roles" / "serving" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "serving" / "tasks" / "main.yml").write_text("---\n")
    (tmp_path / "inventories" / "local").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(page)
    (tmp_path / "README.md").write_text(f"# The map: `x`\n\n[page](docs/page.md)\n{readme_extra}")
    return tmp_path


def _messages(root: Path) -> list[str]:
    return [p.message for p in check(root)]


GOOD = """# A page

`src/specdeploy/serve/config.py`, `roles/serving/tasks/main.yml:1`, `make deploy HOST=x`, `make lint`,
`specdeploy.serve.config.ServingConfig`, `specdeploy.serve.ServingConfig`, `specdeploy.serve.config`.
Not paths: `/var/lib/specdeploy/serving/rollout.json`, `.state/runs/<host>/<time>/`, `roles/<role>/`,
`src/specdeploy/serve/*.py`, `ansible/{filter,action}_plugins/`, `vllm/v1/spec_decode/eagle.py`,
`../shared/ENGINE_FACTS.md`, `https://example.org/src/x.py`, `src/specdeploy/…`.
Generated (git-ignored): `inventories/local/hosts.yml`.
Links: [readme](../README.md), [a section](../README.md#the-map-x), [here](#a-page), [web](https://example.org/y#z).

```sh
make deploy   # roles/serving/tasks/main.yml
```
"""


def test_the_checker_passes_what_exists(tmp_path: Path) -> None:
    assert check(_repo(tmp_path, GOOD)) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("`src/specdeploy/platforms.py`", "src/specdeploy/platforms.py does not exist"),
        ("see `roles/router/files/constraints.txt` here", "roles/router/files/constraints.txt does not exist"),
        ("run `python3 tests/gone.py -k x`", "tests/gone.py does not exist"),
        ("`docker/engine.Dockerfile.j2` (a project folder, absent)", "docker/engine.Dockerfile.j2 does not exist"),
        ("```\nbench/gone.py   a fenced tree\n```", "bench/gone.py does not exist"),
        ("[gone](gone.md)", "link target gone.md does not exist"),
        ("![shot](shot.png)", "link target shot.png does not exist"),
        ("[gone](../src/specdeploy/gone.py#L3)", "link target ../src/specdeploy/gone.py#L3 does not exist"),
        ("[ref]: missing/file.md", "link target missing/file.md does not exist"),
        ("[a section](../README.md#gone)", "link target ../README.md#gone: no heading makes #gone"),
        ("[here](#page-2)", "link target #page-2: no heading makes #page-2"),
        ("`make deploy-all`", "make deploy-all: no such target in the Makefile"),
        ("`specdeploy.serve.gone`", "'gone' is neither a module nor a name in src/specdeploy/serve/__init__.py"),
        ("`specdeploy.serve.config.Gone`", "'Gone' is neither a module nor a name in src/specdeploy/serve/config.py"),
    ],
)
def test_a_missing_name_is_caught(tmp_path: Path, text: str, expected: str) -> None:
    problems = check(_repo(tmp_path, f"# Page\n\n{text}\n"))
    assert len(problems) == 1, problems
    assert expected in problems[0].message
    assert (problems[0].page, problems[0].line) == ("docs/page.md", 4 if text.startswith("```") else 3)


def test_the_readme_is_a_short_map_of_every_page(tmp_path: Path) -> None:
    root = _repo(tmp_path, GOOD, readme_extra="line\n" * 200)
    (root / "docs" / "orphan.md").write_text("# nobody links me\n")
    assert _messages(root) == ["203 lines, over 200: move detail to docs/", "does not link docs/orphan.md"]


def test_main_exits_1_naming_each_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _repo(tmp_path, "`tests/gone.py`\n")
    assert main(["check_docs.py", str(root)]) == 1
    assert "docs/page.md:1: tests/gone.py does not exist" in capsys.readouterr().err
    (root / "docs" / "page.md").write_text(GOOD)
    assert main(["check_docs.py", str(root)]) == 0
