"""Write what the declaration (specdeploy.serve.schema) gives: the role's defaults/main.yml and
meta/argument_specs.yml, ServingConfig's fields (specdeploy.serve.knob_fields), and the table of each
knob's engine words in docs/serve.md, so that none can drift from the others.

    python -m specdeploy.serve.generate [--check] [--role roles/serving] [--root .]      (make generate)

--check writes nothing and exits 1 when a file differs from what the declaration gives.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from specdeploy.serve.knob import REQUIRED, UNSET, Knob
from specdeploy.serve.schema import ENGINES, KNOBS

GENERATED = "# Generated from src/specdeploy/serve/schema.py by `make generate`: edit the declaration, not this file."
HEADER = "One variable set for both engines; specdeploy.serve.config renders it into the command line."
MAX_LINE = 140  # .yamllint's line-length
# The role's entry points: every one validates the same options (a YAML anchor).
ENTRY_POINTS = {
    "main": "Roll the engine out, watched, with rollback.",
    "check": "Check the serving variables before anything touches a host.",
    "rollback": "Swap the running engine with the previous one, watched.",
}


def scalar(value: Any) -> str:
    """VALUE as YAML in flow style: plain where it reads back unchanged, else double-quoted."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{scalar(k)}: {scalar(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value if _reads_back(value) else json.dumps(value, ensure_ascii=False)
    return json.dumps(value)


def _reads_back(text: str) -> bool:
    if not text or text != text.strip() or text[0] in "'\"{[&*!%@|>" or " #" in text:
        return False
    try:
        return bool(yaml.safe_load(f"k: {text}") == {"k": text})
    except yaml.YAMLError:
        return False


def _comments(note: str, indent: str = "") -> list[str]:
    return [f"{indent}# {line}" if line else f"{indent}#" for line in note.splitlines()]


def _default_line(knob: Knob) -> list[str]:
    line = f"{knob.variable}: {scalar(knob.default)}" + (f"  # {knob.aside}" if knob.aside else "")
    if len(line) <= MAX_LINE:
        return [line]
    return [f"{knob.variable}: >-", f"  {knob.default}"]  # a long expression: folded, one line of text


def render_defaults(knobs: tuple[Knob, ...] = KNOBS) -> str:
    lines = ["---", GENERATED, f"# {HEADER}"]
    for knob in knobs:
        if knob.default is UNSET:  # optional, without a default (argument_specs documents it)
            continue
        lines += _comments(knob.note) + _default_line(knob)
    return "\n".join(lines) + "\n"


def _option(knob: Knob) -> list[str]:
    spec: dict[str, Any] = {"type": knob.type, "description": knob.doc}
    if not knob.derived and knob.default is not UNSET:  # a Jinja default is the role's, not the spec's
        spec["default"] = knob.default
    if knob.choices:
        spec["choices"] = list(knob.choices)
    if knob.type == "list":
        spec["elements"] = "str"
    if knob.no_log:
        spec["no_log"] = True
    return [f"      {knob.variable}:"] + [f"        {key}: {scalar(value)}" for key, value in spec.items()]


def render_argument_specs(knobs: tuple[Knob, ...] = KNOBS) -> str:
    lines = ["---", GENERATED,
             "# One option set for the three entry points (a YAML anchor: the options cannot drift apart).",
             "argument_specs:"]  # fmt: skip
    for number, (entry, description) in enumerate(ENTRY_POINTS.items()):
        lines += [f"  {entry}:", f"    short_description: {scalar(description)}"]
        if number:
            lines.append("    options: *serving_options")
            continue
        lines.append("    options: &serving_options")
        for knob in knobs:
            lines += _option(knob)
    return "\n".join(lines) + "\n"


def files(role: Path) -> dict[Path, str]:
    return {role / "defaults/main.yml": render_defaults(), role / "meta/argument_specs.yml": render_argument_specs()}


# ---------------------------------------------------------------- ServingConfig's fields

FIELDS_MODULE = Path("src/specdeploy/serve/knob_fields.py")
FIELDS_DOC = '''"""ServingConfig's fields: one per knob that feeds the engine, typed and defaulted as its declaration
(specdeploy.serve.schema) says; ServingConfig (specdeploy.serve.config) adds what is not a knob.

Generated from src/specdeploy/serve/schema.py by `make generate`: edit the declaration, not this file.
"""'''


def python_value(value: Any) -> str:
    """VALUE as ruff's formatter writes a literal (double quotes)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple):
        return "(" + ", ".join(python_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise ValueError(f"no literal for {value!r}")


def _field_lines(knob: Knob) -> list[str]:
    """The knob's doc as a comment (wrapped within ruff's 120), then its field."""
    comment = [f"    # {line}" for line in textwrap.wrap(knob.doc, 114)]
    default = knob.config_default
    if default is REQUIRED:
        return [*comment, f"    {knob.field}: {knob.annotation}"]
    if isinstance(default, dict):  # a dataclass takes no mutable default
        if default:
            raise ValueError(f"{knob.variable}: a mapping field's default must be empty")
        return [*comment, f"    {knob.field}: {knob.annotation} = field(default_factory=dict)"]
    return [*comment, f"    {knob.field}: {knob.annotation} = {python_value(default)}"]


def render_fields(knobs: tuple[Knob, ...] = KNOBS) -> str:
    fed = [k for k in knobs if k.field]
    ordered = sorted(fed, key=lambda k: k.config_default is not REQUIRED)  # a dataclass wants the required first
    body = [line for knob in ordered for line in _field_lines(knob)]
    dataclasses = "dataclass, field" if any("default_factory" in line for line in body) else "dataclass"
    imports = [f"from dataclasses import {dataclasses}"]
    if any("Any" in k.annotation for k in fed):
        imports.append("from typing import Any")
    return "\n".join([FIELDS_DOC, "", "from __future__ import annotations", "", *imports, "", "",
                      "@dataclass(frozen=True)", "class KnobFields:", *body]) + "\n"  # fmt: skip


# ---------------------------------------------------------------- the docs' table of engine words

DOCS = Path("docs/serve.md")
TABLE_START = "<!-- generated by `make generate` from specdeploy.serve.schema: each knob in each engine's words -->"
TABLE_END = "<!-- end of the generated table -->"


def _default_cell(knob: Knob) -> str:
    if isinstance(knob.default, bool):
        return "on" if knob.default else "off"
    return "the engine's" if knob.default in ("", 0) else f"`{knob.default}`"


def render_table(knobs: tuple[Knob, ...] = KNOBS) -> str:
    """Every knob with engine words: each engine's flag, key or variable (the flags it owns), and its default."""
    # The engines without their releases: a new pin changes no generated file (the page's prose names them).
    names = {"vllm": "vLLM", "sglang": "SGLang"}
    lines = [f"| variable | {' | '.join(names[e] for e in ENGINES)} | default |", "|---" * (len(ENGINES) + 2) + "|"]
    for knob in (k for k in knobs if k.engines):
        cells = ["; ".join(w.cell() for w in knob.words(e)) or "(none)" for e in ENGINES]
        lines.append(f"| `{knob.variable}` | {' | '.join(cells)} | {_default_cell(knob)} |")
    return "\n".join(lines)


def docs_page(text: str) -> str:
    """TEXT (docs/serve.md) with its generated table rewritten."""
    pattern = re.compile(re.escape(TABLE_START) + r"\n.*?" + re.escape(TABLE_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{DOCS}: no generated table ({TABLE_START} ... {TABLE_END})")
    return pattern.sub(lambda _: f"{TABLE_START}\n{render_table()}\n{TABLE_END}", text)


def project_files(root: Path) -> dict[Path, str]:
    """The generated files outside the role: ServingConfig's fields and the docs' table."""
    docs = root / DOCS
    return {root / FIELDS_MODULE: render_fields(), docs: docs_page(docs.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.serve.generate", description=__doc__)
    parser.add_argument("--role", type=Path, default=Path("roles/serving"), help="the serving role's folder")
    parser.add_argument("--root", type=Path, default=Path("."), help="the project's folder (src/, docs/)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    wanted = {**files(args.role), **project_files(args.root)}
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from specdeploy.serve.schema: run make generate", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
