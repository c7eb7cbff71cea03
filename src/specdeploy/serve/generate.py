"""Write roles/serving/defaults/main.yml and meta/argument_specs.yml from the declaration
(specdeploy.serve.schema), so that the role's interface cannot drift from ServingConfig.

    python -m specdeploy.serve.generate [--check] [--role roles/serving]      (make generate)

--check writes nothing and exits 1 when a file differs from what the declaration gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from specdeploy.serve.schema import KNOBS, UNSET, Knob

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdeploy.serve.generate", description=__doc__)
    parser.add_argument("--role", type=Path, default=Path("roles/serving"), help="the serving role's folder")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    stale = [path for path, text in files(args.role).items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path} differs from specdeploy.serve.schema: run make generate", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(files(args.role)[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
