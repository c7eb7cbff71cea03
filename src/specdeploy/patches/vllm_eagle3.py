"""EAGLE-3 for DeepSeek-V3 / Kimi-K2.5 targets on vLLM 0.16.x and 0.17.x.

Those releases refuse the pairing in three places (docs/engine-facts.md): the target whitelist
in SpeculativeConfig, the missing SupportsEagle3 interface (and aux hidden-state capture) on
DeepseekV2ForCausalLM, and a Kimi-K2.5 wrapper that does not delegate. On the drafter side, the
proposer's load_model gives a multimodal target's image token to the drafter through an if-chain
whose fallback reads `config.image_token_index`, which KimiK25Config does not have: the drafter
would fail to load after the whole target had loaded. 0.18.0 made all four native; the codemods
below make the same structural change on the older sources.
"""

from __future__ import annotations

from typing import cast

import libcst as cst
import libcst.matchers as m

from specdeploy.patches.codemods import (
    Anchors,
    add_base,
    add_import_name,
    add_methods,
    append_items,
    mentions_attribute,
    statement,
)

EAGLE3_TARGET_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
# 0.16 calls the list eagle3_target_supported; 0.17 renamed it aux_hidden_states_supported.
WHITELIST_NAMES = ("eagle3_target_supported", "aux_hidden_states_supported")

SPECULATIVE_CONFIG = "vllm/config/speculative.py"
DEEPSEEK_V2 = "vllm/model_executor/models/deepseek_v2.py"
KIMI_K25 = "vllm/model_executor/models/kimi_k25.py"
EAGLE_PROPOSER = "vllm/v1/spec_decode/eagle.py"
PROPOSER_CLASS = "SpecDecodeBaseProposer"
KIMI_WRAPPER = "KimiK25ForConditionalGeneration"
# The branch 0.18 added, in the same if-chain: Kimi-K2.5's placeholder token is its image token.
KIMI_PLACEHOLDER_BRANCH = f"""
if self.get_model_name(target_model) == "{KIMI_WRAPPER}":
    self.model.config.image_token_index = target_model.config.media_placeholder_token_id
"""

AUX_LAYER_METHODS = """
def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
    self.model.aux_hidden_state_layers = layers

def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
    # The default capture points EAGLE-3 drafters are trained on: early, middle, late.
    num_layers = len(self.model.layers)
    return (2, num_layers // 2, num_layers - 3)
"""

DELEGATING_METHODS = """
def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
    self.language_model.set_aux_hidden_state_layers(layers)

def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
    return self.language_model.get_eagle3_aux_hidden_state_layers()
"""


def _replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    return module if old is new else cast(cst.Module, module.deep_replace(old, new))


def widen_target_whitelist(module: cst.Module, anchors: Anchors) -> cst.Module:
    config = anchors.top_class(module, "SpeculativeConfig")
    name_matcher = m.Name(m.MatchIfTrue(lambda value: value in WHITELIST_NAMES))
    found = m.findall(config, m.Assign(targets=[m.AssignTarget(target=name_matcher)], value=m.List()))
    if len(found) != 1:
        raise anchors.missing(f"SpeculativeConfig: exactly one `{' | '.join(WHITELIST_NAMES)} = [...]`")
    assign = cast(cst.Assign, found[0])
    listed = cast(cst.List, assign.value)
    present = {e.value.evaluated_value for e in listed.elements if isinstance(e.value, cst.SimpleString)}
    new = [cst.Element(cst.SimpleString(f'"{t}"')) for t in EAGLE3_TARGET_MODEL_TYPES if t not in present]
    if not new:
        return module
    widened = assign.with_changes(value=listed.with_changes(elements=append_items(listed.elements, new)))
    return _replace(module, assign, widened)


def _is_layer_loop(node: cst.CSTNode) -> bool:
    return m.matches(
        node,
        m.For(
            target=m.Name("layer"),
            iter=m.Call(
                func=m.Name("islice"), args=[m.Arg(m.Attribute(m.Name("self"), m.Name("layers"))), m.ZeroOrMore()]
            ),
        ),
    )


def _is_return_hidden_states(node: cst.CSTNode) -> bool:
    return m.matches(node, m.SimpleStatementLine(body=[m.Return(m.Name("hidden_states"))]))


def _collect_aux_hidden_states(forward: cst.FunctionDef, anchors: Anchors) -> cst.FunctionDef:
    """Capture `hidden_states + residual` entering each requested layer; return it with the output."""
    if mentions_attribute(forward, "aux_hidden_state_layers"):
        return forward
    where = "DeepseekV2Model.forward"
    for taken in ("idx", "aux_hidden_states"):
        if m.findall(forward, m.Name(taken)):
            raise anchors.missing(f"{where}: the name `{taken}` is already in use")
    body = list(forward.body.body)
    loops = [i for i, stmt in enumerate(body) if _is_layer_loop(stmt)]
    if len(loops) != 1:
        raise anchors.missing(f"{where}: one `for layer in islice(self.layers, ...)` loop")
    returns = [i for i, stmt in enumerate(body) if _is_return_hidden_states(stmt) and i > loops[0]]
    if not returns:
        raise anchors.missing(f"{where}: a final `return hidden_states` after the layer loop")
    loop = cast(cst.For, body[loops[0]])
    capture = statement(
        """
        if idx in self.aux_hidden_state_layers:
            aux_hidden_states.append(hidden_states + residual)
        """
    )
    loop_body = cast(cst.IndentedBlock, loop.body)
    body[loops[0]] = loop.with_changes(
        target=cst.Tuple([cst.Element(cst.Name("idx")), cst.Element(cst.Name("layer"))], lpar=[], rpar=[]),
        iter=cst.Call(
            cst.Name("enumerate"),
            args=[
                cst.Arg(loop.iter),
                cst.Arg(
                    cst.Attribute(cst.Name("self"), cst.Name("start_layer")),
                    keyword=cst.Name("start"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                ),
            ],
        ),
        body=loop_body.with_changes(body=[capture, *loop_body.body]),
    )
    final = returns[-1]
    body.insert(final, statement("if len(aux_hidden_states) > 0:\n    return hidden_states, aux_hidden_states\n"))
    # The new list takes over the loop's leading blank line, so the two read as one block.
    declare = statement("aux_hidden_states: list[torch.Tensor] = []\n").with_changes(leading_lines=loop.leading_lines)
    body[loops[0]] = body[loops[0]].with_changes(leading_lines=[])
    body.insert(loops[0], declare)
    return forward.with_changes(body=forward.body.with_changes(body=body))


def deepseek_v2_supports_eagle3(module: cst.Module, anchors: Anchors) -> cst.Module:
    imports = anchors.import_from(module, "interfaces", "SupportsEagle")
    module = _replace(module, imports, add_import_name(imports, "SupportsEagle3"))

    model = anchors.top_class(module, "DeepseekV2Model")
    init = anchors.method(model, "__init__")
    if not mentions_attribute(init, "aux_hidden_state_layers"):
        declare = statement("self.aux_hidden_state_layers: tuple[int, ...] = ()\n")
        init_block = cast(cst.IndentedBlock, init.body)
        module = _replace(
            module, init, init.with_changes(body=init_block.with_changes(body=[*init_block.body, declare]))
        )
    model = anchors.top_class(module, "DeepseekV2Model")
    forward = anchors.method(model, "forward")
    module = _replace(module, forward, _collect_aux_hidden_states(forward, anchors))

    causal_lm = anchors.top_class(module, "DeepseekV2ForCausalLM")
    anchors.method(causal_lm, "__init__")
    return _replace(module, causal_lm, add_methods(add_base(causal_lm, "SupportsEagle3"), AUX_LAYER_METHODS))


def kimi_k25_delegates_eagle3(module: cst.Module, anchors: Anchors) -> cst.Module:
    imports = anchors.import_from(module, "interfaces", "SupportsPP")
    module = _replace(module, imports, add_import_name(imports, "SupportsEagle3"))
    wrapper = anchors.top_class(module, "KimiK25ForConditionalGeneration")
    init = anchors.method(wrapper, "__init__")
    # 0.15.x built a bare DeepseekV2Model here; delegation needs the 0.16+ registered language model.
    if not m.findall(init, m.AssignTarget(m.Attribute(m.Name("self"), m.Name("language_model")))):
        raise anchors.missing("KimiK25ForConditionalGeneration.__init__: `self.language_model = ...`")
    return _replace(module, wrapper, add_methods(add_base(wrapper, "SupportsEagle3"), DELEGATING_METHODS))


def _is_model_name_chain(node: cst.CSTNode) -> bool:
    """`if self.get_model_name(target_model) ...:` (the multimodal branch's if-chain)."""
    call = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("get_model_name")))
    return m.matches(node, m.If(test=m.Comparison(left=call)))


def _with_branch_before_else(chain: cst.If, branch: cst.If, anchors: Anchors) -> cst.If:
    if isinstance(chain.orelse, cst.If):
        return chain.with_changes(orelse=_with_branch_before_else(chain.orelse, branch, anchors))
    if isinstance(chain.orelse, cst.Else) and mentions_attribute(chain.orelse, "image_token_index"):
        return chain.with_changes(orelse=branch.with_changes(orelse=chain.orelse))
    raise anchors.missing(f"{PROPOSER_CLASS}.load_model: the `else:` that reads config.image_token_index")


def drafter_knows_kimi_k25_placeholder(module: cst.Module, anchors: Anchors) -> cst.Module:
    proposer = anchors.top_class(module, PROPOSER_CLASS)
    load = anchors.method(proposer, "load_model")
    chains = [n for n in m.findall(load, m.If()) if _is_model_name_chain(n)]
    if not chains:
        raise anchors.missing(f"{PROPOSER_CLASS}.load_model: `if self.get_model_name(target_model) ...` chain")
    chain = cast(cst.If, chains[0])  # findall walks outside in: the chain's head comes first
    if m.findall(chain, m.SimpleString(f'"{KIMI_WRAPPER}"')):
        return module  # already there (0.18 has it natively)
    branch = cast(cst.If, statement(KIMI_PLACEHOLDER_BRANCH))
    return _replace(module, chain, _with_branch_before_else(chain, branch, anchors))
