"""The serving interface declared once (specdeploy.serve.schema): the role's files are generated from
it, ServingConfig agrees with it, and the role's variable set built by it renders every engine the
way the hand-kept 33-key mapping in roles/serving/tasks/check.yml did."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.serve import generate, schema
from specdeploy.serve.config import ServingConfig
from specdeploy.serve.variables import problems
from tests.unit.templating import by_declaration, role_vars

ROOT = Path(__file__).parents[3]
ROLE = ROOT / "roles/serving"


def test_the_role_files_are_what_the_declaration_generates():
    """CI's drift check: edit specdeploy/serve/schema.py, then `make generate`."""
    for path, text in {**generate.files(ROLE), **generate.project_files(ROOT)}.items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} drifted from specdeploy.serve.schema: make generate"


def test_the_generated_yaml_keeps_yamllints_line_length():
    """A long knob description broke CI's ansible-lint once: the generator's bound is .yamllint's."""
    assert yaml.safe_load((ROOT / ".yamllint").read_text())["rules"]["line-length"]["max"] == generate.MAX_LINE
    for path, text in generate.files(ROLE).items():
        long = [n for n, line in enumerate(text.splitlines(), 1) if len(line) > generate.MAX_LINE]
        assert not long, f"{path.relative_to(ROOT)}: lines {long} over {generate.MAX_LINE}: shorten schema.py's doc"


def test_the_generated_files_read_back_as_declared():
    defaults = yaml.safe_load(generate.render_defaults())
    assert defaults == {k.variable: k.default for k in schema.KNOBS if k.default is not schema.UNSET}
    specs = yaml.safe_load(generate.render_argument_specs())["argument_specs"]
    assert set(specs) == {"main", "check", "rollback"}
    options = specs["main"]["options"]
    assert all(specs[entry]["options"] == options for entry in specs)
    assert list(options) == [k.variable for k in schema.KNOBS]
    for knob in schema.KNOBS:
        option = options[knob.variable]
        assert option["type"] == knob.type and option["description"] == knob.doc
        assert option.get("choices", []) == list(knob.choices)
        assert option.get("no_log", False) == knob.no_log
        assert option.get("default", schema.UNSET) == (schema.UNSET if knob.derived else knob.default)
    assert options["serving_api_key"]["no_log"] is True


def test_generate_check_fails_on_drift_and_writing_fixes_it(tmp_path, capsys):
    role, root = tmp_path / "serving", tmp_path / "project"
    for path, text in generate.files(ROLE).items():
        (role / path.relative_to(ROLE)).parent.mkdir(parents=True, exist_ok=True)
        (role / path.relative_to(ROLE)).write_text(text.replace("serving_port: 8000", "serving_port: 8001"))
    (root / "docs").mkdir(parents=True)
    (root / generate.FIELDS_MODULE).parent.mkdir(parents=True)
    table = generate.render_table()
    (root / generate.DOCS).write_text((ROOT / generate.DOCS).read_text().replace(table, "| stale |"))
    given = ["--role", str(role), "--root", str(root)]
    assert generate.main(["--check", *given]) == 1
    err = capsys.readouterr().err
    assert "defaults/main.yml differs" in err and "knob_fields.py differs" in err and "serve.md differs" in err
    assert generate.main(given) == 0
    assert generate.main(["--check", *given]) == 0
    assert (root / generate.FIELDS_MODULE).read_text() == (ROOT / generate.FIELDS_MODULE).read_text()
    assert (root / generate.DOCS).read_text() == (ROOT / generate.DOCS).read_text()


# A raw knob (serving_speculative_schedule: text or a list) is kept as text.
TYPES = {"int": {"int"}, "int | None": {"int"}, "float | None": {"float"}, "str": {"str", "path", "raw"},
         "str | None": {"str"}, "bool": {"bool"},
         "tuple[str, ...]": {"list"}, "dict[str, str]": {"dict"}, "dict[str, Any]": {"dict"}}  # fmt: skip


def test_serving_config_fields_are_the_declarations_knobs():
    """Every field but the baked-in drafter path, the engine cache's host folder (the deploy's, from the
    image) and the schedule auto chose (the rollout's) is one knob of the declared type, with its default."""
    fields = {f.name: f for f in dataclasses.fields(ServingConfig)}
    assert set(fields) - {"drafter_path", "cache_dir", "resolved_schedule"} == set(schema.BY_FIELD)
    assert len(schema.BY_FIELD) == len([k for k in schema.KNOBS if k.field])  # one knob per field
    required = {name for name, f in fields.items() if f.default is f.default_factory is dataclasses.MISSING}
    assert required == {"engine", "image", "model_path", "served_model_name"}
    for name, knob in schema.BY_FIELD.items():
        assert knob.type in TYPES[str(fields[name].type)], (name, fields[name].type, knob.type)
        if name in required or knob.derived:  # no default here, or the role's is an expression (serving_nccl)
            continue
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if name == "page_cache_warmed":  # the role warms by default; a config built by hand has not
            assert (default, schema.FIELD_DEFAULTS[name]) == (False, True)
            continue
        assert default == schema.FIELD_DEFAULTS[name], name


def test_allowed_values_are_declared_once_and_each_rule_refuses_outside_them():
    for knob in schema.KNOBS:
        if knob.choices:
            assert problems({knob.variable: knob.choices[0]}) == []
            (problem,) = problems({knob.variable: "not-a-choice"})
            assert problem.startswith(f"{knob.variable}='not-a-choice': must be one of {', '.join(knob.choices)}")
    unchecked = {k.variable for k in schema.KNOBS if k.check is None}
    assert unchecked == {"serving_image", "serving_api_key", "serving_nccl", "serving_fleet_address",
                         "serving_fleet_worker", "serving_vmtouch_version"}  # fmt: skip


# ---------------------------------------------------------------- the role's variable set, before and after

# The mapping roles/serving/tasks/check.yml kept by hand until issue 25: key -> the filter it applied.
HAND_KEPT = ["engine", "image", "model_path", "served_model_name", "tensor_parallel_size:int",
             "pipeline_parallel_size:int", "max_model_len:int", "speculative_method", "num_speculative_tokens:int",
             "extra_args", "env", "volumes", "port:int", "bind_address", "gpus", "ipc_mode", "shm_size",
             "memlock_bytes:int", "stack_bytes:int", "nccl", "trust_remote_code:bool", "tool_call_parser",
             "reasoning_parser", "drain_timeout", "attention_backend", "draft_attention_backend", "nnodes", "node_rank",
             "master_addr", "master_port", "load_format"]  # fmt: skip
# Knobs added since (issue 26's recipe, issue 28's multi_node, and any declared late after), out of the
# digest at their defaults: the digests below hold.
RECIPE = {k.field for k in schema.KNOBS if k.late} - {item.partition(":")[0] for item in HAND_KEPT}
assert {"kv_cache_dtype", "pcie_allreduce", "multi_node"} <= RECIPE
PCIE = {"env": {"NCCL_P2P_DISABLE": "1"}, "vllm_args": ["--disable-custom-all-reduce"],
        "sglang_args": ["--disable-custom-all-reduce"], "reason": "8 GPUs joined only by PCIe"}  # fmt: skip
# Digests computed with the code before issue 25 (the hand-kept mapping, its defaults/main.yml and
# ServingConfig), for the same variables: the change restarts no engine.
BEFORE = {
    ("local", ""): "sha256:5765bd277eb43c76a9056f8863ebaa9fba959ec46b56889e54219f6ff264f845",
    ("local", "pcie"): "sha256:c06159bf7bcddee00167fd32e462df969e688a2fc47f16b0564e437c55815b9d",
    ("local", "key"): "sha256:a80cb137e993d2ba74ead128dad58acacb41caba10cc79d22dea524123481f33",
    ("example-8gpu", ""): "sha256:c52dcbc8eb4e96030df0a89d60be5ad90fb634a765476a881207402397f09d01",
    ("example-8gpu", "pcie"): "sha256:52b8063f8c38c65a02a58ca7e57bbcd5d72db2c1d374952174e853664a55fea6",
    ("example-8gpu", "sglang"): "sha256:34d6b73da43a5fb62795605ae07bdbc5c84bfa4a8d7197e0bcad8ade88ab9faf",
    ("example-8gpu", "key"): "sha256:cc5c4210560f7b66131bfef92cbeb0a443c9fd77921bed920f67704cd8858c04",
}
EXTRA = {"": {}, "pcie": {"preflight_nccl": PCIE}, "sglang": {"specdeploy_engine": "sglang"},
         "key": {"serving_bind_address": "0.0.0.0", "serving_api_key": "sk-x"}}  # fmt: skip
# The local inventory as it was then: its --max-num-seqs became serving_max_running_requests (issue 26).
# The example's SM120 recipe came with them too.
THEN = {
    "local": {"serving_extra_args": ["--enforce-eager", "--max-num-seqs", "4"], "serving_max_running_requests": 0},
    "example-8gpu": {
        "serving_attention_backend": "",
        "serving_draft_attention_backend": "",
        **{f"serving_{k}": schema.BY_FIELD[k].default for k in RECIPE},
        "serving_load_format": "",
    },
}


def hand_kept(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for item in HAND_KEPT:
        key, _, applied = item.partition(":")
        value = values[f"serving_{key}"]
        out[key] = int(value) if applied == "int" else str(value).lower() in ("true", "yes", "1") if applied else value
    return {**out, "page_cache_warmed": str(values["serving_warm_page_cache"]).lower() in ("true", "yes", "1")}


@pytest.mark.parametrize(("inventory", "extra"), BEFORE, ids=[f"{i}{'+' if e else ''}{e}" for i, e in BEFORE])
def test_the_role_renders_every_engine_as_the_hand_kept_mapping_did(inventory, extra):
    values = role_vars(inventory, {**EXTRA[extra], **THEN.get(inventory, {})})
    assert problems({k: v for k, v in values.items() if k in schema.RULES}) == []
    collected = by_declaration(values)
    old = hand_kept(values)
    assert set(collected) == set(old) | {"page_cache_warmed"} | RECIPE and "api_key" not in collected
    now = ServingConfig.from_vars({**collected, "api_key": values["serving_api_key"]})
    then = ServingConfig.from_vars({**old, "api_key": values["serving_api_key"]})
    assert now == then and now.container_kwargs("sha256:i") == then.container_kwargs("sha256:i")
    assert now.digest() == BEFORE[inventory, extra]


# ---------------------------------------------------------------- serving_p2p


def test_serving_p2p_overrides_the_verdict_the_engine_gets_and_auto_changes_nothing():
    values = role_vars("example-8gpu", {"preflight_nccl": PCIE})
    auto = by_declaration(values)
    assert auto["nccl"] == PCIE and "p2p" not in auto
    for off in ("off", False):  # unquoted `off` is YAML's false
        assert problems({"serving_p2p": off}) == []
        cfg = ServingConfig.from_vars(by_declaration({**values, "serving_p2p": off}))
        assert cfg.environment()["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in cfg.command()
        assert "serving_p2p: off" in cfg.nccl["reason"]
    on = ServingConfig.from_vars(by_declaration({**values, "serving_p2p": "on"}))
    assert "NCCL_P2P_DISABLE" not in on.environment() and "--disable-custom-all-reduce" not in on.command()
    assert on.nccl["reason"].startswith("p2p-ok: serving_p2p: on (the operator's override of: p2p-broken)")
    assert on.digest() != ServingConfig.from_vars(auto).digest()
    cpu = by_declaration({**role_vars("local", {}), "serving_p2p": "auto"})
    assert cpu["nccl"] == {}
    (problem,) = problems({"serving_p2p": "sometimes"})
    assert problem == "serving_p2p='sometimes': must be one of auto, on, off"
