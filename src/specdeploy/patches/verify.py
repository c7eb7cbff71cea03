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

    @property
    def ok(self) -> bool:
        return not self.findings


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
        if install.release[:2] >= (0, 22):
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
    else:
        _verify_sglang(install, findings, checks)
    probe = "not run (static checks failed)"
    if not findings:
        probe = import_probe(install, python or sys.executable, findings)
    return Report(install, findings, checks, probe)
