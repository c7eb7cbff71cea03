"""Role defaults and inventory variables templated as Ansible templates them (native types, our
filters from ansible/filter_plugins), without an Ansible run."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml
from jinja2 import meta
from jinja2.nativetypes import NativeEnvironment

ROOT = Path(__file__).parents[2]


def _filters() -> dict[str, Any]:
    path = ROOT / "ansible/filter_plugins/specdeploy_filters.py"
    spec = importlib.util.spec_from_file_location("specdeploy_filters", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.FilterModule().filters())


FILTERS = _filters()


def role_defaults(*roles: str) -> dict[str, Any]:
    """The roles' defaults/main.yml, merged in order (as a play listing them sees them)."""
    merged: dict[str, Any] = {}
    for role in roles:
        merged |= yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text())
    return merged


def group_vars(inventory: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / f"inventories/{inventory}/group_vars/all.yml").read_text()))


def render(values: dict[str, Any]) -> dict[str, Any]:
    """VALUES with every Jinja expression templated, each once the ones it names are values."""
    values = dict(values)
    env = NativeEnvironment()
    env.filters.update(FILTERS)
    pending = lambda value: isinstance(value, str) and "{{" in value  # noqa: E731
    named = lambda text: meta.find_undeclared_variables(env.parse(text))  # noqa: E731
    for _ in range(8):
        for name, value in values.items():
            if pending(value) and not any(pending(values.get(n)) for n in named(value)):
                values[name] = env.from_string(value).render(values)
    return values


def role_vars(inventory: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The serving role's defaults (and the play's specdeploy_defaults) under the inventory's
    group_vars, templated as Ansible would (our filters too)."""
    return render({**role_defaults("specdeploy_defaults", "serving"), **group_vars(inventory),
                   "engine_image_tag": "specdeploy/engine:t", "ansible_host": "h", **extra})  # fmt: skip


def by_declaration(values: dict[str, Any]) -> dict[str, Any]:
    """What roles/serving/tasks/check.yml does: the varnames query, our names filter, the vars lookup,
    our config filter."""
    names = FILTERS["specdeploy_serving_config_names"]([n for n in values if n.startswith("serving_")])
    return dict(FILTERS["specdeploy_serving_config"]({n: values[n] for n in names}))
