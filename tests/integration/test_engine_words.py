"""The serving recipe held to the pinned releases' own source (wheels from PyPI, cached under
.state/wheels): every word specdeploy.serve.engine_words holds is the release's, and every flag,
speculative-config key and environment variable the example inventory renders for each engine is
one that engine declares.

Neither engine's argparse can be imported here: both import torch (and SGLang triton) at module
import, which a CPU-only CI without CUDA wheels cannot install. So the declarations are read as
their parsers read them: vLLM's literal `add_argument("--flag")` calls and its frontend dataclass
fields, SGLang's `A[..., Arg(cli_name=..., aliases=..., action=BooleanOptionalAction)]` fields
that `add_cli_args_from_dataclass` turns into flags, and the literal flags `ServerArgs.add_cli_args`
adds itself."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from specdeploy import pins
from specdeploy.engine_image import wheels
from specdeploy.gate import client
from specdeploy.serve import engine_words, schema
from specdeploy.serve.config import ServingConfig
from tests.unit.templating import by_declaration, role_vars

pytestmark = pytest.mark.integration

# Every recipe knob on, opt-ins included, over the example inventory: each must render a flag the engine has.
# Preflight's verdict for 8 PCIe GPUs with IOMMU on (specdeploy.gpu.checks) adds its flag and environment.
PCIE = {"env": {"NCCL_P2P_DISABLE": "1"}, "vllm_args": ["--disable-custom-all-reduce"],
        "sglang_args": ["--disable-custom-all-reduce"], "reason": "8 GPUs joined only by PCIe"}  # fmt: skip
NOT_SWITCHES = {"serving_encoder_tp_mode": "data", "serving_drain_timeout": 30, "preflight_nccl": PCIE}


def everything(engine: str) -> dict[str, object]:
    """Every opt-in switch ENGINE has words for (schema.Knob.add_engine), on: a switch declared since is
    held to the engine's parser too, unnamed here."""
    switches = {k.variable: True for k in schema.KNOBS if k.type == "bool" and k.default is False and k.words(engine)}
    return {**switches, **NOT_SWITCHES}


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"class {name} is gone: re-read the release"
    return found[0]


def _module_assign(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:  # type: ignore[attr-defined]
            return node.value  # type: ignore[attr-defined,no-any-return]
    raise AssertionError(f"{name} is gone: re-read the release")


def _literal_flags(tree: ast.AST) -> set[str]:
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "add_argument")
    return {a.value for c in calls for a in c.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")}


def _with_negations(flags: set[str]) -> set[str]:
    return flags | {f"--no-{f[2:]}" for f in flags if f.startswith("--")}


@pytest.fixture(scope="module")
def vllm_site() -> Path:
    return wheels.release_sources("vllm", pins.VLLM_CUDA)


@pytest.fixture(scope="module")
def sglang_site() -> Path:
    return wheels.release_sources("sglang", pins.SGLANG_CUDA)


def vllm_flags(site: Path) -> set[str]:
    """`vllm serve`'s flags: EngineArgs' add_argument calls, the frontend's dataclass fields, make_arg_parser's."""
    flags = _literal_flags(ast.parse((site / "vllm/engine/arg_utils.py").read_text()))
    frontend = ast.parse((site / "vllm/entrypoints/common/cli_args.py").read_text())
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        body = _class(frontend, cls).body
        flags |= {"--" + n.target.id.replace("_", "-") for n in body if isinstance(n, ast.AnnAssign)
                  and isinstance(n.target, ast.Name)}  # fmt: skip
    return _with_negations(flags | _literal_flags(frontend))


def sglang_flags(site: Path) -> set[str]:
    """The flags add_cli_args_from_dataclass makes of every field group, and add_cli_args' own."""
    flags: set[str] = set()
    for path in sorted((site / "sglang/srt/arg_groups/fields").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            ann = node.annotation
            if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", "") == "A"):
                continue
            meta = ann.slice.elts[1] if isinstance(ann.slice, ast.Tuple) else None
            keywords = {k.arg: k.value for k in meta.keywords} if isinstance(meta, ast.Call) else {}
            if isinstance(keywords.get("no_cli"), ast.Constant) and keywords["no_cli"].value is True:
                continue
            cli = keywords.get("cli_name")
            name = cli.value if isinstance(cli, ast.Constant) else "--" + node.target.id.replace("_", "-")
            names = {str(name), *(_strings(keywords["aliases"]) if "aliases" in keywords else [])}
            if "BooleanOptionalAction" in ast.dump(keywords.get("action", ast.Constant(None))):
                names |= {f"--no-{n[2:]}" for n in names}
            flags |= names
    server_args = ast.parse((site / "sglang/srt/server_args.py").read_text())
    return flags | _literal_flags(_class(server_args, "ServerArgs"))


def rendered(engine: str, **extra: object) -> ServingConfig:
    values = role_vars("example-8gpu", {"specdeploy_engine": engine, **everything(engine), **extra})
    config = ServingConfig.from_vars(by_declaration(values))
    assert config.problems() == [], config.problems()
    return config


def flags_of(command: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in command if a.startswith("--")]


def test_the_words_are_the_pinned_releases_own(vllm_site, sglang_site):
    registry = ast.parse((vllm_site / "vllm/v1/attention/backends/registry.py").read_text())
    members = [n.targets[0].id for n in _class(registry, "AttentionBackendEnum").body
               if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]  # fmt: skip
    assert tuple(members) == engine_words.VLLM_ATTENTION_BACKENDS
    cache = ast.parse((vllm_site / "vllm/config/cache.py").read_text())
    assert tuple(_strings(_module_assign(cache, "CacheDType"))) == engine_words.VLLM_KV_CACHE_DTYPES
    choices = ast.parse((sglang_site / "sglang/srt/arg_groups/choices.py").read_text())
    assert (
        tuple(_strings(_module_assign(choices, "ATTENTION_BACKEND_CHOICES"))) == engine_words.SGLANG_ATTENTION_BACKENDS
    )
    draft = tuple(_strings(_module_assign(choices, "DRAFT_ATTENTION_BACKEND_CHOICES")))
    assert draft == engine_words.SGLANG_DRAFT_ATTENTION_BACKENDS
    model = (sglang_site / "sglang/srt/arg_groups/fields/model.py").read_text()
    spec = (sglang_site / "sglang/srt/arg_groups/fields/spec.py").read_text()
    for source, field, words in (
        (model, "kv_cache_dtype", engine_words.SGLANG_KV_CACHE_DTYPES),
        (spec, "speculative_draft_kv_cache_dtype", engine_words.SGLANG_DRAFT_KV_CACHE_DTYPES),
    ):
        (node,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.AnnAssign)
                   and getattr(n.target, "id", "") == field]  # fmt: skip
        (given,) = [
            k.value for n in ast.walk(node) if isinstance(n, ast.Call) for k in n.keywords if k.arg == "choices"
        ]
        assert tuple(_strings(given)) == words, field
    server_args = _class(ast.parse((sglang_site / "sglang/srt/server_args.py").read_text()), "ServerArgs")
    (text_only,) = [n.value for n in server_args.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "LANGUAGE_MODEL_ONLY_ARCHITECTURES"]  # fmt: skip
    assert tuple(_strings(text_only)) == engine_words.SGLANG_LANGUAGE_MODEL_ONLY_ARCHITECTURES
    multimodal = ast.parse((vllm_site / "vllm/config/multimodal.py").read_text())
    assert tuple(_strings(_module_assign(multimodal, "MMEncoderTPMode"))) == engine_words.ENCODER_TP_MODES
    speculative = _class(ast.parse((vllm_site / "vllm/config/speculative.py").read_text()), "SpeculativeConfig")
    fields = {n.target.id for n in speculative.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert set(engine_words.VLLM_SPECULATIVE_KEYS) <= fields, set(engine_words.VLLM_SPECULATIVE_KEYS) - fields


def test_the_example_inventory_renders_only_flags_each_pinned_engine_declares(vllm_site, sglang_site):
    declared = {"vllm": vllm_flags(vllm_site), "sglang": sglang_flags(sglang_site)}
    # The parsers can still fail to be read: a handful of flags every serve takes must be found.
    assert {"--tensor-parallel-size", "--host", "--tool-call-parser", "--no-enable-expert-parallel"} <= declared["vllm"]
    assert {"--tp-size", "--host", "--tool-call-parser", "--no-mm-enable-dp-encoder", "--ep"} <= declared["sglang"]
    for engine in ("vllm", "sglang"):
        command = rendered(engine).command()
        unknown = [f for f in flags_of(command) if f not in declared[engine]]
        assert unknown == [], (engine, unknown, command)
    for rank in (0, 1):  # the multi-node flags too (vLLM's rank 1 runs headless)
        for engine in ("vllm", "sglang"):
            nodes = {"serving_nnodes": 2, "serving_node_rank": rank, "serving_master_addr": "10.0.0.1"}
            command = rendered(engine, **nodes).command()
            assert [f for f in flags_of(command) if f not in declared[engine]] == [], (engine, rank, command)
        # vLLM's data-parallel launch over hosts (serving_multi_node: data_parallel), head and headless replica.
        replicas = {"serving_nnodes": 2, "serving_node_rank": rank, "serving_master_addr": "10.0.0.1",
                    "serving_multi_node": "data_parallel"}  # fmt: skip
        command = rendered("vllm", **replicas).command()
        assert "--data-parallel-address" in command
        assert [f for f in flags_of(command) if f not in declared["vllm"]] == [], (rank, command)


def test_the_speculative_config_and_environment_are_the_engines_own(vllm_site, sglang_site):
    command = rendered("vllm").command()
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec["attention_backend"] == "TRITON_MLA" and spec["kv_cache_dtype"] == "fp8"
    assert set(spec) <= set(engine_words.VLLM_SPECULATIVE_KEYS)
    envs = _module_assign(ast.parse((vllm_site / "vllm/envs.py").read_text()), "environment_variables")
    assert isinstance(envs, ast.Dict)
    vllm_env = {k.value for k in envs.keys if isinstance(k, ast.Constant)}
    # The variable the project once advised: vLLM 0.33 warns of it as unknown and ignores it.
    assert "VLLM_ATTENTION_BACKEND" not in vllm_env
    environ = (sglang_site / "sglang/srt/environ.py").read_text()
    for engine, known in (
        ("vllm", lambda name: name in vllm_env),
        ("sglang", lambda name: f"    {name} = " in environ),
    ):
        env = rendered(engine).environment()
        ours = [n for n in env if n.startswith(("VLLM_", "SGLANG_"))]
        assert engine_words.PCIE_ALLREDUCE_ENV[engine] in ours
        assert [n for n in ours if not known(n)] == [], (engine, ours)
    sglang = rendered("sglang").command()
    assert sglang[sglang.index("--kv-cache-dtype") + 1] == "fp8_e4m3"  # SGLang's word for vLLM's fp8
    assert sglang[sglang.index("--speculative-draft-kv-cache-dtype") + 1] == "fp8_e4m3"


def test_the_gates_clients_take_only_flags_their_pinned_release_declares(vllm_site, sglang_site):
    """The benchmark gate's command for each engine's own client: `vllm bench serve` (serve.py and its
    dataset arguments) and SGLang's `sglang.benchmark.serving`."""
    vllm_bench = _literal_flags(ast.parse((vllm_site / "vllm/benchmarks/serve.py").read_text()))
    for path in sorted((vllm_site / "vllm/benchmarks/datasets").glob("*.py")):
        vllm_bench |= _literal_flags(ast.parse(path.read_text()))
    sglang_bench = _literal_flags(ast.parse((sglang_site / "sglang/benchmark/serving.py").read_text()))
    for engine, declared in (("vllm", vllm_bench), ("sglang", sglang_bench)):
        run = client.BenchRun("/models/target", "tiny", "http://127.0.0.1:8000", 8, 4, 64, 80.0, True, engine)
        flags = set(flags_of(run.command()[3:]))  # (without the timeout wrapper)
        assert len(flags) > 15 and flags - declared == set(), (engine, sorted(flags - declared))
    assert "--trust-remote-code" in vllm_bench and "--flush-cache" in sglang_bench


def test_the_engine_caches_variables_are_the_pinned_releases_own(vllm_site, sglang_site):
    """specdeploy.serve.engine_cache: each variable it sets is one the pinned release reads, and the
    VLLM_* ones it relies on staying out of vLLM's compile-cache key are in envs.compile_factors' ignored set."""
    from specdeploy.serve import engine_cache  # noqa: PLC0415

    tree = ast.parse((vllm_site / "vllm/envs.py").read_text())
    envs = _module_assign(tree, "environment_variables")
    assert isinstance(envs, ast.Dict)
    assert "VLLM_CACHE_ROOT" in {k.value for k in envs.keys if isinstance(k, ast.Constant)}
    factors = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "compile_factors")
    ignored = next(n.value for n in ast.walk(factors) if isinstance(n, ast.AnnAssign | ast.Assign)
                   and "ignored_factors" in ast.unparse(n))  # fmt: skip
    assert set(engine_cache.VLLM_UNHASHED) <= set(_strings(ignored))
    # vLLM keeps a Triton cache the caller gives (compilation/compiler_interface.initialize_inductor_cache)
    assert 'os.environ.get("TRITON_CACHE_DIR")' in (vllm_site / "vllm/compilation/compiler_interface.py").read_text()
    assert "    SGLANG_CACHE_DIR = " in (sglang_site / "sglang/srt/environ.py").read_text()
    # SGLang's JIT build cache reads its own variable, not SGLANG_CACHE_DIR (0.5.23): each is set
    jit = (sglang_site / "sglang/kernels/jit/utils/compile/cache.py").read_text()
    assert 'envs.SGLANG_JIT_CACHE_DIR.get() or "~/.cache/sglang/jit"' in jit
    assert {"SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR"} <= set(engine_cache.VARIABLES["sglang"])
    vllm_env = replace(rendered("vllm"), cache_dir="/c").environment()
    assert vllm_env["VLLM_CACHE_ROOT"] == f"{engine_cache.CACHE_MOUNT}/vllm"


def test_a_draft_schedule_is_vllms_own_key_held_to_its_own_rules_and_sglangs_reason_is_its_own(vllm_site, sglang_site):
    """issue 37: num_speculative_tokens_per_batch_size is a SpeculativeConfig field of (start, end, length) triples;
    the rules draft_schedule checks before any host are the ones vLLM raises once the model is loaded; SGLang's
    words for its adaptive steps are the ones the refusal quotes."""
    command = rendered("vllm", serving_speculative_schedule=[[1, 8, 3], [9, 64, 1], [65, 1024, 0]]).command()
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 8, 3], [9, 64, 1], [65, 1024, 0]]
    assert set(spec) <= set(engine_words.VLLM_SPECULATIVE_KEYS)
    speculative = _class(ast.parse((vllm_site / "vllm/config/speculative.py").read_text()), "SpeculativeConfig")
    (field,) = [n for n in speculative.body if isinstance(n, ast.AnnAssign)
                and getattr(n.target, "id", "") == "num_speculative_tokens_per_batch_size"]  # fmt: skip
    assert ast.unparse(field.annotation) == "list[tuple[int, int, int]] | None"
    rules = (vllm_site / "vllm/v1/spec_decode/dynamic/utils.py").read_text()
    for said in ("must be positive", "must be >= 0", "must be non-overlapping", "must start at 1", "must not be empty"):
        assert said in rules, said
    # The silent clamp to num_speculative_tokens, which draft_schedule refuses instead.
    assert re.search(r"min\(\s*vllm_num_speculative_tokens,", rules)
    spec_fields = (sglang_site / "sglang/srt/arg_groups/fields/spec.py").read_text()
    assert "dynamically adjusts num_steps based on acceptance rate" in spec_fields
    assert "speculative_adaptive_config" in spec_fields and "per_batch_size" not in spec_fields


def test_the_monitoring_metric_names_are_each_pinned_engines_own(vllm_site, sglang_site):
    """specdeploy.monitoring.engine_metrics: every metric a rule or panel reads is declared by the pinned
    release (a prometheus_client Counter adds `_total` to a name declared without it), and the labels they
    filter on are the engine's: vLLM's `finished_reason` strings and `position`."""
    from specdeploy.monitoring import engine_metrics  # noqa: PLC0415

    sources = {
        "vllm": "\n".join(p.read_text() for p in [*(vllm_site / "vllm/v1/metrics").glob("*.py"),
                                                  vllm_site / "vllm/v1/spec_decode/metrics.py"]),
        "sglang": (sglang_site / "sglang/srt/observability/metrics_collector.py").read_text(),
    }  # fmt: skip
    for metrics in (engine_metrics.VLLM, engine_metrics.SGLANG):
        text = sources[metrics.engine]
        missing = [n for n in metrics.names() if f'"{n}"' not in text and f'"{n.removesuffix("_total")}"' not in text]
        assert not missing, f"{metrics.engine} declares no {missing}: re-read the release"
    engine_init = (vllm_site / "vllm/v1/engine/__init__.py").read_text()
    assert 'FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")' in engine_init
    assert 'pos_labelnames = labelnames + ["position"]' in sources["vllm"]
    # SGLang's acceptance is a gauge it sets (mostrecent): avg_over_time, never rate()
    gauge = sources["sglang"].split('name="sglang:spec_accept_length"')[0].rsplit("Gauge(", 1)[1]
    assert "Counter(" not in gauge
