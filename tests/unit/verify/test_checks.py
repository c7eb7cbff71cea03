"""The shipped host checks (specdeploy.verify) read the same defaults and pins as the roles."""

from __future__ import annotations

from pathlib import Path

import yaml

from specdeploy import pins
from specdeploy.verify.check_gpu_host import PACKAGE_DEFAULTS

ROLES = Path(__file__).parents[3] / "roles"


def _role_defaults() -> dict[str, object]:
    merged: dict[str, object] = {}
    for role in ("nvidia_driver", "cuda_toolkit", "container_runtime", "router", "serving", "monitoring"):
        merged |= yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    return merged


def test_the_checks_defaults_are_the_roles_defaults():
    defaults = _role_defaults()
    assert {name: defaults[name] for name in PACKAGE_DEFAULTS} == PACKAGE_DEFAULTS


def test_every_pinned_role_variable_reads_pins_yaml():
    defaults = _role_defaults()
    for name in pins.HOST:
        assert defaults[name] == f"{{{{ '{name}' | specdeploy_pin }}}}", name


def test_the_checks_get_no_secret_and_no_untemplated_value():
    from specdeploy.verify import checked_variables  # noqa: PLC0415

    hostvars = {"serving_api_key": "s3cret", "serving_port": 8000, "ansible_password": "x",
                "engine_image_profile": "{{ specdeploy_engine }}-cuda", "engine_image_drafter_path": "/d"}  # fmt: skip
    assert checked_variables(hostvars) == {"serving_port": 8000, "engine_image_drafter_path": "/d"}
