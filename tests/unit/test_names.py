"""The names the roles share with the Python code, defined once (specdeploy.names) and handed to the
roles by roles/specdeploy_defaults: its file follows the module, the roles' defaults render what they
rendered when each wrote its value literally, the argument specs document those values, and no role,
play or inventory defines one of them again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy import names
from specdeploy.engine_image import profiles
from tests.unit.templating import FILTERS, ROOT, group_vars, render, role_defaults

# What the role defaults that named a shared value rendered before issue 25 (each wrote it literally).
BEFORE: dict[str, Any] = {
    "engine_image_profile": "vllm-cpu",
    "preflight_engine_profile": "vllm-cpu",
    "preflight_model_path": "/srv/specdeploy/models/target",
    "preflight_serving_port": 8000,
    "router_port": 8080,
    "router_metrics_port": 29000,
    "sentinel_router_port": 8080,
    "sentinel_control_port": 8081,
    "serving_engine": "vllm",
    "serving_port": 8000,
    "serving_model_path": "/srv/specdeploy/models/target",
    "serving_state_dir": "/var/lib/specdeploy/serving",
}
# The plays of ansible/site.yml: the roles each lists (specdeploy_defaults first), whose defaults it sees.
PLAYS = {
    "preflight": ("specdeploy_defaults", "preflight"),
    "engine_image": ("specdeploy_defaults", "engine_image"),
    "router": ("specdeploy_defaults", "router", "sentinel"),
    "deploy": ("specdeploy_defaults", "serving"),
}


def test_the_defaults_role_hands_every_shared_name_through_its_filter():
    defaults = yaml.safe_load((ROOT / "roles/specdeploy_defaults/defaults/main.yml").read_text())
    assert defaults == {
        f"{names.ROLE_PREFIX}{key}": f"{{{{ '{key}' | specdeploy_name }}}}" for key in names.ROLE_DEFAULTS
    }
    rendered = render(defaults)
    assert rendered == {f"{names.ROLE_PREFIX}{key}": value for key, value in names.ROLE_DEFAULTS.items()}
    with pytest.raises(KeyError, match="no shared name 'nope'"):
        FILTERS["specdeploy_name"]("nope")


def test_every_play_lists_the_defaults_role_first():
    for playbook in ("ansible/site.yml", "ansible/rollback.yml"):
        for play in yaml.safe_load((ROOT / playbook).read_text()):
            assert play["roles"][0] == {"role": "specdeploy_defaults"}, (playbook, play["name"])


@pytest.mark.parametrize("play", PLAYS)
def test_the_roles_defaults_render_as_they_did_when_written_literally(play):
    values = render(role_defaults(*PLAYS[play]))
    mine = {k: v for k, v in BEFORE.items() if k in values}
    assert mine and {k: values[k] for k in mine} == mine
    assert all(type(values[k]) is type(v) for k, v in mine.items())  # ports stay numbers


def test_the_inventory_still_wins_over_the_shared_names():
    values = render({**role_defaults(*PLAYS["router"]), "router_port": 9090})
    assert (values["router_port"], values["sentinel_router_port"]) == (9090, 9090)
    values = render({**role_defaults(*PLAYS["preflight"]), "engine_image_profile": "sglang-cuda", "serving_port": 1})
    assert (values["preflight_engine_profile"], values["preflight_serving_port"]) == ("sglang-cuda", 1)
    # The example inventory picks the engine; its CUDA profile follows (it wrote "{{ specdeploy_engine }}-cuda").
    for engine in ("vllm", "sglang"):
        example = render({**role_defaults(*PLAYS["deploy"]), **group_vars("example-8gpu"), "specdeploy_engine": engine})
        assert (example["engine_image_profile"], example["serving_engine"]) == (f"{engine}-cuda", engine)


def _specs(role: str) -> dict[str, Any]:
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]
    return dict(specs["main"]["options"])


def test_the_argument_specs_document_the_shared_values():
    """Argument specs' defaults are documentation (Ansible sets none): held to specdeploy.names here."""
    engine_image = _specs("engine_image")["engine_image_profile"]
    assert (engine_image["default"], engine_image["choices"]) == (names.DEFAULT_PROFILE, list(profiles.PROFILES))
    router = _specs("router")
    assert (router["router_port"]["default"], router["router_metrics_port"]["default"]) == (
        names.ROUTER_PORT, names.ROUTER_METRICS_PORT)  # fmt: skip
    assert _specs("sentinel")["sentinel_control_port"]["default"] == names.SENTINEL_PORT
    serving = _specs("serving")
    assert serving["serving_port"]["default"] == names.SERVING_PORT
    assert serving["serving_state_dir"]["default"] == names.SERVING_STATE_DIR
    assert serving["serving_model_path"]["default"] == names.MODEL_PATH


# ---------------------------------------------------------------- defined once

# Files still allowed a literal definition (none left).
PENDING: set[str] = set()
# Generated from specdeploy.names (make generate), and documentation checked above.
GENERATED = {"roles/serving/defaults/main.yml", "roles/serving/meta/argument_specs.yml"}
YAML_DEFINITIONS = [
    re.escape(names.ENGINE_CONTAINER) + r"(?![\w-])",
    re.escape(names.SERVING_STATE_DIR),
    re.escape(names.MODEL_PATH),
    r"split\('-'\)",
    r"\}\}-cuda",  # the profile -> engine rule, or its reverse, in Jinja
    rf"default\('?(?:{names.DEFAULT_PROFILE}|{names.ROUTER_PORT}|{names.SENTINEL_PORT}|{names.SERVING_PORT})'?\)",
    rf"^\s*\w+: ['\"]?(?:{names.ROUTER_PORT}|{names.ROUTER_METRICS_PORT}|{names.SENTINEL_PORT})['\"]?\s*(?:#.*)?$",
    rf"^\s*\w+: ['\"]?{names.DEFAULT_PROFILE}['\"]?\s*(?:#.*)?$",
]
# The test bed picks the CPU profile on purpose (it has no GPU): a choice, not the default again.
CHOICES = {("inventories/local/group_vars/all.yml", "engine_image_profile: vllm-cpu")}
PYTHON_DEFINITIONS = [
    rf"[\"']{re.escape(names.ENGINE_CONTAINER)}[\"']",
    rf"[\"']{re.escape(names.SERVING_STATE_DIR)}[\"']",
    rf"[\"']{re.escape(names.MODEL_PATH)}[\"']",
    rf"\b(?:{names.ROUTER_PORT}|{names.ROUTER_METRICS_PORT}|{names.SENTINEL_PORT})\b",
    rf"(?:\bor|default=|\.get\([^)]*,)\s*[\"']{names.DEFAULT_PROFILE}[\"']",
    r"\(0, 1[678]\)|\(0, 22\)",  # the engine release boundaries (specdeploy.engine_releases)
]


def _files(patterns: tuple[str, ...]) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern) if ".venv" not in p.parts)


def test_no_role_play_or_inventory_defines_a_shared_name_again():
    found = []
    for path in _files(("roles/**/*.yml", "roles/**/*.j2", "ansible/**/*.yml", "inventories/**/*.yml")):
        rel = str(path.relative_to(ROOT))
        if rel in PENDING | GENERATED or rel.endswith("meta/argument_specs.yml"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("#") or (rel, line.strip()) in CHOICES:
                continue
            if any(re.search(p, line) for p in YAML_DEFINITIONS):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == []


def test_no_module_defines_a_shared_name_or_a_release_boundary_again():
    owners = {"src/specdeploy/names.py", "src/specdeploy/engine_releases.py"}
    found = []
    for path in _files(("src/specdeploy/**/*.py", "testbed/**/*.py", "ansible/**/*.py")):
        rel = str(path.relative_to(ROOT))
        # ansible/library: documentation generated from the action plugins (make generate), whose defaults these are.
        if rel in owners | PENDING or rel.startswith("ansible/library/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(p, line) for p in PYTHON_DEFINITIONS):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert found == []
