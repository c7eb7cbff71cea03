"""The action plugins documented for ansible-doc (ansible/library/NAME.py, tests/support/action_docs.py):
the stubs are what the plugins generate, their options are the plugins' argument specs, the real
`ansible-doc` renders each one with the repository's ansible.cfg, and no option carries a secret."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.serve.rollout import Outcome
from tests.support import action_docs

ROOT = Path(__file__).parents[2]
ACTIONS = ("specdeploy_drafter", "specdeploy_engine_image_build", "specdeploy_engine_image_context",
           "specdeploy_model_fit", "specdeploy_monitoring", "specdeploy_serve", "specdeploy_verify")  # fmt: skip
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"  # the venv's (.venv/bin)
SECRET_WORDS = ("key", "token", "password", "secret", "credential")


def arguments(name: str) -> dict[str, dict[str, Any]]:
    spec: dict[str, dict[str, Any]] = action_docs.load_plugin(ROOT, name).ActionModule.ARGUMENTS
    return spec


def stub_strings(name: str, root: Path = ROOT) -> dict[str, str]:
    """The stub's DOCUMENTATION, EXAMPLES and RETURN, read as Ansible reads them (never imported)."""
    tree = ast.parse((root / "ansible/library" / f"{name}.py").read_text())
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)}  # fmt: skip


def assert_options_are_the_spec(options: dict[str, dict[str, Any]], spec: dict[str, dict[str, Any]]) -> None:
    assert sorted(options) == sorted(spec), "the documented options are not the plugin's arguments"
    for arg, want in spec.items():
        doc = options[arg]
        assert doc["type"] == want["type"], arg
        assert bool(doc.get("required", False)) == bool(want.get("required", False)), arg
        assert doc.get("default") == want.get("default"), arg
        assert doc.get("choices") == (list(want["choices"]) if "choices" in want else None), arg
        assert doc["description"], arg


def test_every_action_plugin_has_its_stub_and_no_stub_is_orphaned():
    assert action_docs.plugin_names(ROOT) == list(ACTIONS)
    assert sorted(p.stem for p in (ROOT / "ansible/library").glob("*.py")) == list(ACTIONS)


def test_the_stubs_are_what_the_plugins_generate():
    """CI's drift check (make lint runs it too): edit the plugin's docstring or ARGUMENTS, then `make generate`."""
    for path, text in action_docs.files(ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} drifted from its action plugin: make generate"


@pytest.mark.parametrize("name", ACTIONS)
def test_each_documentation_states_the_plugins_own_argument_spec(name):
    doc = yaml.safe_load(stub_strings(name)["DOCUMENTATION"])
    assert doc["module"] == name
    assert doc["short_description"] and doc["description"]
    assert_options_are_the_spec(doc["options"] or {}, arguments(name))
    assert list(doc["options"] or {}) == list(arguments(name)), "not in the plugin's order"
    assert yaml.safe_load(stub_strings(name)["EXAMPLES"]), "EXAMPLES is empty"
    assert yaml.safe_load(stub_strings(name)["RETURN"]), "RETURN is empty"


def _returned_keys(name: str) -> set[str]:
    """The result keys a plugin can give: its string constants, and what it passes through whole."""
    sources = [ROOT / "ansible/action_plugins" / f"{name}.py"]
    if name == "specdeploy_serve":  # the deploy it hands over to (specdeploy.serve.deploy)
        sources += [ROOT / "src/specdeploy/serve/deploy.py", ROOT / "src/specdeploy/serve/deploy_parts.py"]
    keys = {n.value for source in sources for n in ast.walk(ast.parse(source.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}  # fmt: skip
    if name == "specdeploy_serve":  # {**asdict(outcome), ...}
        keys |= {field.name for field in dataclasses.fields(Outcome)}
    if name == "specdeploy_engine_image_context":  # {**dockerfile.prepare_context(...), ...} (its body: _prepare)
        tree = ast.parse((ROOT / "src/specdeploy/engine_image/dockerfile.py").read_text())
        prepare = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("prepare_context", "_prepare")]
        returned = [
            n.value for f in prepare for n in ast.walk(f) if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict)
        ]
        keys |= {k.value for d in returned for k in d.keys if isinstance(k, ast.Constant)}
    return keys


@pytest.mark.parametrize("name", ACTIONS)
def test_each_documented_return_value_is_one_the_plugin_gives(name):
    documented = set(yaml.safe_load(stub_strings(name)["RETURN"]))
    assert documented - _returned_keys(name) == set()


def test_no_action_takes_a_secret_and_serve_says_where_its_api_key_comes_from():
    for name in ACTIONS:
        for arg, spec in arguments(name).items():
            assert not any(word in arg for word in SECRET_WORDS) and not spec.get("no_log"), f"{name}: {arg}"
    notes = " ".join(yaml.safe_load(stub_strings("specdeploy_serve")["DOCUMENTATION"])["notes"])
    assert "C(serving_api_key)" in notes and "never an argument" in notes


def _ansible_doc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(ANSIBLE_DOC), "-t", "module", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


@pytest.mark.parametrize("name", ACTIONS)
def test_ansible_doc_renders_each_action_with_the_repositorys_config(name, tmp_path):
    """From any folder: ansible.cfg's `library` is resolved against the file's own folder."""
    proc = _ansible_doc(name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = proc.stdout
    assert f"MODULE {name} ({ROOT / 'ansible/library' / name}.py)" in page
    assert "This module has a corresponding action plugin." in page
    for arg, spec in arguments(name).items():  # "= name" when required, "- name" when not
        mark = "=" if spec.get("required") else "-"
        assert re.search(rf"^{mark} {arg}\s", page, re.MULTILINE), f"option {arg} not listed as {mark}"
    assert "EXAMPLES:" in page and "RETURN VALUES:" in page
    if name == "specdeploy_serve":
        assert "NOTES:" in page and "serving_api_key" in page


def test_what_ansible_doc_reads_is_each_plugins_argument_spec(tmp_path):
    proc = _ansible_doc("--json", *ACTIONS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pages = json.loads(proc.stdout)
    assert sorted(pages) == sorted(ACTIONS)
    for name in ACTIONS:
        assert_options_are_the_spec(pages[name]["doc"].get("options") or {}, arguments(name))
        assert pages[name]["return"] and pages[name]["examples"]


# The generator itself, on a copy of the project's plugin folder.


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "ansible/action_plugins", tmp_path / "ansible/action_plugins")
    shutil.copytree(ROOT / "ansible/library", tmp_path / "ansible/library")
    return tmp_path


def test_a_changed_argument_spec_is_drift_until_generated_and_the_hand_written_parts_stay(project, capsys):
    plugin = project / "ansible/action_plugins/specdeploy_drafter.py"
    before = stub_strings("specdeploy_drafter")
    text = plugin.read_text()
    old = '"target_model_path": {\n            "type": "str",\n            "default": "",'
    plugin.write_text(text.replace(old, old.replace('""', '"/m"')))
    assert plugin.read_text() != text
    assert action_docs.main(["--check", "--root", str(project)]) == 1
    assert "specdeploy_drafter.py differs from its action plugin" in capsys.readouterr().err
    assert action_docs.main(["--root", str(project)]) == 0
    assert action_docs.main(["--check", "--root", str(project)]) == 0
    after = stub_strings("specdeploy_drafter", project)
    assert yaml.safe_load(after["DOCUMENTATION"])["options"]["target_model_path"]["default"] == "/m"
    assert (after["EXAMPLES"], after["RETURN"]) == (before["EXAMPLES"], before["RETURN"])


def test_a_new_plugin_gets_a_starter_stub_and_an_orphaned_stub_fails_the_check(project, capsys):
    (project / "ansible/action_plugins/specdeploy_new.py").write_text(
        '"""Action `specdeploy_new`: do one new thing.\n\nAt length."""\n\n'
        "from specdeploy.actions import SpecdeployAction\n\n\n"
        "class ActionModule(SpecdeployAction):\n"
        '    ARGUMENTS = {"what": {"type": "str", "required": True, "description": "What to do."}}\n'
    )  # fmt: skip
    (project / "ansible/library/specdeploy_gone.py").write_text('DOCUMENTATION = ""\n')
    assert action_docs.main(["--root", str(project)]) == 1  # the orphan
    assert "specdeploy_gone.py documents no plugin" in capsys.readouterr().err
    starter = (project / "ansible/library/specdeploy_new.py").read_text()
    assert "short_description: Do one new thing" in starter and "what: <str>" in starter


def test_a_plugin_docstring_without_its_summary_line_or_an_undescribed_argument_is_refused():
    with pytest.raises(ValueError, match="must begin with one line: Action `specdeploy_x`"):
        action_docs.prose("specdeploy_x", "Does things.")
    with pytest.raises(ValueError, match="argument path has no description"):
        action_docs.option("path", {"type": "str"})
    docstring = "Action `specdeploy_x`: do `it`.\n\nMore.\n\nNotes:\n- One\n  line.\n- Two."
    doc = action_docs.prose("specdeploy_x", docstring)
    assert doc == {"short_description": "Do C(it)", "description": ["Do C(it).", "More."],
                   "notes": ["One line.", "Two."]}  # fmt: skip


def test_check_mode_is_refused_by_actions_that_change_hosts_and_run_by_the_read_only_ones(monkeypatch) -> None:
    """`specdeploy deploy --check` promises no change: the build and the rollout must not run for real."""
    import importlib.util  # noqa: PLC0415
    import types  # noqa: PLC0415

    from ansible.plugins.action import ActionBase  # noqa: PLC0415

    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    ran: list[str] = []
    for name, refuses in (("specdeploy_serve", True), ("specdeploy_engine_image_build", True),
                          ("specdeploy_drafter", False), ("specdeploy_verify", False)):  # fmt: skip
        spec = importlib.util.spec_from_file_location(name, ROOT / "ansible" / "action_plugins" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        action = object.__new__(module.ActionModule)
        action._task = types.SimpleNamespace(check_mode=True, action=name)
        monkeypatch.setattr(action, "validate_argument_spec", lambda **_: (None, {}), raising=False)
        monkeypatch.setattr(action, "act", lambda args, name=name: ran.append(name) or {"changed": False})
        out = action.run(task_vars={})
        assert bool(out.get("failed")) is refuses, (name, out)
        if refuses:
            assert "no check mode" in out["msg"] and name not in ran
        else:
            assert name in ran
