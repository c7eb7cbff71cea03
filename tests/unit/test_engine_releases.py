"""The engine release boundaries, each defined once (specdeploy.engine_releases), decide as the
literal (major, minor) comparisons they replaced did."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdeploy import engine_releases
from specdeploy.engine_image import drafter
from specdeploy.errors import SpecdeployError
from specdeploy.patches import patchset
from specdeploy.patches import verify as patch_verify
from specdeploy.patches.engine_install import EngineInstall


def test_the_boundaries_are_the_releases_the_sources_name():
    assert engine_releases.VLLM_EAGLE3_PATCHABLE == (0, 16)
    assert engine_releases.VLLM_EAGLE3_NATIVE == drafter.MLA_EAGLE3_VLLM == (0, 18)
    assert engine_releases.VLLM_EAGLE3_WHITELIST_REMOVED == (0, 22)
    assert engine_releases.release_text((0, 18)) == "0.18"


@pytest.mark.parametrize(
    ("version", "selected"),
    [("0.15.1", None), ("0.16.0", patchset.VLLM_EAGLE3), ("0.17.1", patchset.VLLM_EAGLE3),
     ("0.18.0", patchset.VLLM_NATIVE), ("0.33.0", patchset.VLLM_NATIVE), ("0.34.0", None)],
)  # fmt: skip
def test_the_patch_set_changes_where_it_did(version, selected):
    install = EngineInstall("vllm", version, Path("/nonexistent"))
    if selected is None:
        with pytest.raises(SpecdeployError):
            patchset.select(install)
        return
    assert patchset.select(install) is selected
    native = selected is patchset.VLLM_NATIVE
    assert (patch_verify.drafter_probe(install, "python3", []) == "not applicable (native)") is native
