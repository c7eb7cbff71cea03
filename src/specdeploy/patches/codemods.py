"""Small, name-anchored libcst edits shared by the patch sets.

Every lookup is by name (class, method, variable, import); a name that is not there raises
AnchorMissing, and nothing is written for the whole patch set.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TypeVar

import libcst as cst
import libcst.matchers as m

from specdeploy.errors import SpecdeployError


class AnchorMissing(SpecdeployError):
    """The engine source does not have the shape this patch set was written for."""

    def __init__(self, file: str, anchor: str, version: str) -> None:
        super().__init__(
            f"refusing to patch {file} (engine {version}): anchor not found: {anchor}",
            hint="this engine version's source differs from what the patch set expects; nothing was written",
        )
        self.file, self.anchor, self.version = file, anchor, version


class Anchors:
    """Lookups that raise AnchorMissing with the file and version filled in."""

    def __init__(self, file: str, version: str) -> None:
        self.file, self.version = file, version

    def missing(self, anchor: str) -> AnchorMissing:
        return AnchorMissing(self.file, anchor, self.version)

    def top_class(self, module: cst.Module, name: str) -> cst.ClassDef:
        for stmt in module.body:
            if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
                return stmt
        raise self.missing(f"class {name}")

    def method(self, cls: cst.ClassDef, name: str) -> cst.FunctionDef:
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
        raise self.missing(f"{cls.name.value}.{name}()")

    def import_from(self, module: cst.Module, module_suffix: str, sibling: str) -> cst.ImportFrom:
        """The top-level `from ...<module_suffix> import (...)` that already imports `sibling`."""
        for stmt in module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if (
                    isinstance(small, cst.ImportFrom)
                    and small.module is not None
                    and _dotted(small.module).split(".")[-1] == module_suffix
                    and not isinstance(small.names, cst.ImportStar)
                    and any(_alias_name(a) == sibling for a in small.names)
                ):
                    return small
        raise self.missing(f"`from ...{module_suffix} import {sibling}`")


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _alias_name(alias: cst.ImportAlias) -> str:
    return _dotted(alias.name)


T = TypeVar("T", cst.Arg, cst.ImportAlias, cst.Element)


def append_items(items: Sequence[T], new: Sequence[T]) -> list[T]:
    """Append to a comma-separated sequence, keeping its one-line or one-per-line layout."""
    out = list(items)
    for item in new:
        if not out:
            out.append(item)
            continue
        last = out[-1]
        separator = out[-2].comma if len(out) > 1 else cst.MaybeSentinel.DEFAULT
        if not isinstance(separator, cst.Comma):
            separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        out[-1] = last.with_changes(comma=separator)
        out.append(item.with_changes(comma=last.comma))
    return out


def class_has_base(cls: cst.ClassDef, name: str) -> bool:
    return any(_dotted(arg.value) == name for arg in cls.bases)


def add_base(cls: cst.ClassDef, name: str) -> cst.ClassDef:
    if class_has_base(cls, name):
        return cls
    return cls.with_changes(bases=append_items(cls.bases, [cst.Arg(cst.Name(name))]))


def add_import_name(node: cst.ImportFrom, name: str) -> cst.ImportFrom:
    assert not isinstance(node.names, cst.ImportStar)
    if any(_alias_name(a) == name for a in node.names):
        return node
    return node.with_changes(names=append_items(node.names, [cst.ImportAlias(cst.Name(name))]))


def has_method(cls: cst.ClassDef, name: str) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in cls.body.body)


def add_methods(cls: cst.ClassDef, source: str) -> cst.ClassDef:
    """Append the methods in `source` that the class does not define yet."""
    parsed = cst.parse_module(textwrap.dedent(source).strip() + "\n")
    new = [s for s in parsed.body if isinstance(s, cst.FunctionDef) and not has_method(cls, s.name.value)]
    if not new:
        return cls
    body = [*cls.body.body, *(fn.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for fn in new)]
    return cls.with_changes(body=cls.body.with_changes(body=body))


def statement(source: str) -> cst.BaseStatement:
    return cst.parse_statement(textwrap.dedent(source).strip() + "\n")


def mentions_attribute(node: cst.CSTNode, attr: str) -> bool:
    return bool(m.findall(node, m.Attribute(attr=m.Name(attr))))
