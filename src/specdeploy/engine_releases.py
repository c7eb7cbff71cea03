"""The engine releases where something specdeploy relies on changes, each boundary once
(docs/engine-facts.md gives the sources). Compared with a release's (major, minor).

Standard library only: the patch code imports it inside the engine image, the filters on the controller.
"""

from __future__ import annotations

# vLLM before 0.16 wraps a bare DeepseekV2Model in Kimi-K2.5: no language model to delegate EAGLE-3
# to, so nothing to patch. 0.16 and 0.17 are patched (specdeploy.patches.vllm_eagle3).
VLLM_EAGLE3_PATCHABLE = (0, 16)
# From vLLM 0.18 EAGLE-3 for DeepSeek-V3/Kimi-K2.5 is native: the target whitelist lists them, the
# drafter's Kimi-K2.5 branch is there, and MLA EAGLE-3 drafters (Eagle3DeepseekV2ForCausalLM) load.
VLLM_EAGLE3_NATIVE = (0, 18)
# From vLLM 0.22 SpeculativeConfig has no EAGLE-3 target whitelist (the SupportsEagle3 interface decides).
VLLM_EAGLE3_WHITELIST_REMOVED = (0, 22)


def release_text(release: tuple[int, ...]) -> str:
    """(0, 18) -> "0.18"."""
    return ".".join(map(str, release))
