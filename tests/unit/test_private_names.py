"""The lint check that interfaces are public (tests/support/check_private_names.py) can fail."""

from __future__ import annotations

from pathlib import Path

from tests.support import check_private_names as check


def test_the_tree_uses_no_other_modules_private_names() -> None:
    assert check.main() == 0


def test_an_import_or_a_call_of_another_modules_private_name_is_named() -> None:
    text = "from specdeploy.serve.rollout import _matches\n\ndef go(r):\n    return r.host._get('x')\n"
    found = list(check.violations(Path("m.py"), text))
    assert len(found) == 2 and "_matches" in found[0] and "_get" in found[1]


def test_a_files_own_private_names_are_its_own() -> None:
    text = ("class A:\n    def _since(self):\n        return 1\n\n    def same(self, other):\n"
            "        return self._since() == other._since() and super()._x()\n")  # fmt: skip
    assert list(check.violations(Path("m.py"), text)) == []
