"""The codemod helpers on small sources we wrote; the real releases are in tests/integration."""

from __future__ import annotations

import libcst as cst
import pytest

from specdeploy.patches.codemods import AnchorMissing, Anchors, add_base, add_import_name, add_methods

SOURCE = """\
from .interfaces import A, B
from .interfaces import (
    C,
    D,
)


class One(nn.Module, A):
    def __init__(self):
        pass


class Two(
    nn.Module,
    C,
):
    pass
"""


def module() -> cst.Module:
    return cst.parse_module(SOURCE)


def test_one_line_and_multi_line_layouts_are_kept():
    mod = module()
    anchors = Anchors("x.py", "1.0")
    one_line = anchors.import_from(mod, "interfaces", "B")
    mod = mod.deep_replace(one_line, add_import_name(one_line, "E"))
    multi = anchors.import_from(mod, "interfaces", "D")
    mod = mod.deep_replace(multi, add_import_name(multi, "F"))
    two = anchors.top_class(mod, "Two")
    mod = mod.deep_replace(two, add_base(two, "F"))
    code = mod.code
    assert "from .interfaces import A, B, E\n" in code
    assert "    C,\n    D,\n    F,\n)" in code
    assert "class Two(\n    nn.Module,\n    C,\n    F,\n):" in code
    compile(code, "x.py", "exec")


def test_edits_are_idempotent():
    mod = module()
    anchors = Anchors("x.py", "1.0")
    one = anchors.top_class(mod, "One")
    once = add_methods(add_base(one, "A"), "def f(self):\n    return 1\n")
    twice = add_methods(add_base(once, "A"), "def f(self):\n    return 1\n")
    assert cst.Module(body=[once]).code == cst.Module(body=[twice]).code
    assert cst.Module(body=[once]).code.count("def f(") == 1
    assert add_base(one, "A") is one  # already a base: untouched


@pytest.mark.parametrize(
    ("lookup", "anchor"),
    [
        (lambda a, m: a.top_class(m, "Missing"), "class Missing"),
        (lambda a, m: a.method(a.top_class(m, "One"), "forward"), "One.forward()"),
        (lambda a, m: a.import_from(m, "interfaces", "Z"), "import Z"),
    ],
)
def test_missing_anchor_names_file_anchor_and_version(lookup, anchor):
    with pytest.raises(AnchorMissing) as info:
        lookup(Anchors("pkg/x.py", "9.9.9"), module())
    message = info.value.message
    assert "pkg/x.py" in message and anchor in message and "9.9.9" in message


# A proposer of the shape the drafter-side codemod is anchored on (written here, not upstream's).
PROPOSER = """
class SpecDecodeBaseProposer:
    def load_model(self, target_model):
        if multimodal(target_model):
            if self.get_model_name(target_model) in ["A", "B"]:
                self.model.config.image_token_index = target_model.config.image_token_id
            elif self.get_model_name(target_model) == "C":
                self.model.config.image_token_index = 3
            else:
                self.model.config.image_token_index = target_model.config.image_token_index
"""


def test_the_drafter_branch_goes_before_the_fallback_once():
    from specdeploy.patches.vllm_eagle3 import drafter_knows_kimi_k25_placeholder  # noqa: PLC0415

    anchors = Anchors("eagle.py", "0.17.1")
    once = drafter_knows_kimi_k25_placeholder(cst.parse_module(PROPOSER), anchors).code
    kimi = once.index('== "KimiK25ForConditionalGeneration"')
    assert once.index('== "C"') < kimi < once.index("else:"), once
    assert "target_model.config.media_placeholder_token_id" in once
    again = drafter_knows_kimi_k25_placeholder(cst.parse_module(once), anchors).code
    assert again == once
    namespace: dict[str, object] = {}
    exec(compile(once, "eagle.py", "exec"), namespace)  # still valid Python


def test_the_drafter_codemod_refuses_a_chain_without_the_fallback():
    from specdeploy.patches.vllm_eagle3 import drafter_knows_kimi_k25_placeholder  # noqa: PLC0415

    no_else = PROPOSER.split("            else:", maxsplit=1)[0]
    with pytest.raises(AnchorMissing, match=r"the `else:` that reads config\.image_token_index"):
        drafter_knows_kimi_k25_placeholder(cst.parse_module(no_else), Anchors("eagle.py", "0.17.1"))
    renamed = PROPOSER.replace("get_model_name", "model_name_of")
    with pytest.raises(AnchorMissing, match="get_model_name"):
        drafter_knows_kimi_k25_placeholder(cst.parse_module(renamed), Anchors("eagle.py", "0.17.1"))
