"""The fit preflight decides on the host (specdeploy_model_fit: READ_SCRIPT's reads, then fit_for) and
`specdeploy plan --fit` on paper: the same reads and the same decision, never the weights."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specdeploy.cli import main
from specdeploy.errors import SpecdeployError
from specdeploy.preflight import memory, model_files, weights
from specdeploy_testbed import kimi_headers, real_shapes, tiny_configs

IDS = {"[BOS]": 0, "[EOS]": 1, "[PAD]": 2, "<|media_pad|>": 3}
H100_MIB = 81_559  # nvidia-smi on the lent H100 (tests/data/gpu_truth/gpu-h100.csv)
ROOT = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The H100's full-depth form (16 routed experts) and its drafter, as folders."""
    root = tmp_path_factory.mktemp("kimi")
    target = real_shapes.target_config(IDS, layers=61, experts=16)
    drafter = real_shapes.drafter_config(target)
    return (kimi_headers.write_form(root / "target", kimi_headers.target(61, 16), target),
            kimi_headers.write_form(root / "drafter", kimi_headers.drafter(drafter), drafter))  # fmt: skip


def read_on_host(model: Path, drafter: str = "") -> dict[str, model_files.ModelFiles]:
    """READ_SCRIPT as the action runs it on the host (here: sh, head, od, base64 of this machine)."""
    done = subprocess.run(["sh", "-c", model_files.READ_SCRIPT, "sh", str(model), drafter],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return model_files.parse_read(done.stdout)


def test_the_hosts_reads_give_the_headers_and_a_cache_short_of_one_sequence_is_refused(kimi: tuple[Path, Path]) -> None:
    target, drafter = kimi
    read = read_on_host(target, str(drafter))
    assert len(read["target"].headers) == len(kimi_headers.target(61, 16)) and read["drafter"].headers
    serving = memory.Serving("vllm", max_model_len=4096, speculative=True)
    fits = model_files.fit_for(serving, read["target"], read["drafter"], H100_MIB)
    assert fits.fit is not None and fits.fit.problems() == [] and 200_000 < fits.fit.kv_tokens < 300_000
    too_long = memory.Serving("vllm", max_model_len=400_000, speculative=True)
    refused = model_files.fit_for(too_long, read["target"], read["drafter"], H100_MIB)
    assert refused.fit is not None
    (problem,) = refused.fit.problems()
    assert (
        problem.startswith("serving_max_model_len=400000: the KV cache holds")
        and "serving_gpu_memory_fraction" in problem
    )


def test_a_model_not_on_the_host_yet_is_skipped_not_refused(tmp_path: Path, kimi: tuple[Path, Path]) -> None:
    serving = memory.Serving("vllm", max_model_len=400_000)
    nothing = model_files.fit_for(serving, read_on_host(tmp_path / "absent").get("target"), None, H100_MIB)
    assert nothing.fit is None and "not there yet" in nothing.note
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text("{}")
    half = model_files.fit_for(serving, read_on_host(tmp_path / "config-only")["target"], None, H100_MIB)
    assert half.fit is None and "safetensors are not there yet" in half.note
    no_drafter = model_files.fit_for(memory.Serving("vllm", speculative=True), read_on_host(kimi[0])["target"],
                                     None, H100_MIB)  # fmt: skip
    assert no_drafter.fit is None and "drafter" in no_drafter.note


def test_without_gpus_vllm_on_cpu_has_the_cache_its_variable_sets(tmp_path: Path) -> None:
    target = tiny_configs.target_config()
    folder = kimi_headers.write_form(tmp_path / "tiny", {}, target)
    read = read_on_host(folder)["target"]
    cpu = model_files.cpu_kv_gib({"VLLM_CPU_KVCACHE_SPACE": "1"})
    fits = model_files.fit_for(memory.Serving("vllm", max_model_len=512), read, None, 0, cpu)
    assert fits.fit is not None and fits.fit.problems() == []
    short = model_files.fit_for(memory.Serving("vllm", max_model_len=2_000_000), read, None, 0, cpu)
    assert short.fit is not None and short.fit.problems()
    assert model_files.fit_for(memory.Serving("vllm"), read, None, 0, None).fit is None  # nothing said: no fit


def test_plan_fit_prints_one_gpus_memory_for_an_inventory(
    kimi: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter = kimi
    inventory = str(ROOT / "inventories" / "example-8gpu")
    args = ["plan", "--fit", "--inventory", inventory, "--model", str(target), "--drafter", str(drafter),
            "--gpu-memory-mib", "97887"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "vllm, TP 8 x PP 1" in out and "weights " in out and "max concurrency" in out and "65,536" in out
    assert main([*args, "--engine", "sglang", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["kv_tokens"] > 0 and said["max_model_len"] == 65_536 and said["problems"] == []
    assert main([*args[:-2], "--gpu-memory-mib", "16000"]) == 1  # a 16 GB card: no room left for a cache
    assert "REFUSED" in capsys.readouterr().out
    assert main(["plan", "--fit", "--inventory", inventory]) == 2  # no model, no GPU memory: said, no traceback
    assert "plan --fit needs --model" in capsys.readouterr().err
    with pytest.raises(SpecdeployError, match="serving values"):
        model_files.local_fit({"serving_tensor_parallel_size": "{{ tp }}"}, "vllm", target, None, 97887)


class _Here:
    """A connection whose commands run on this machine (the host's read script, as root: we are)."""

    def __init__(self) -> None:
        self.commands = self

    def as_root(self, *argv: str) -> list[str]:
        return list(argv)


class _Templar:
    def template(self, value: object) -> object:
        return value


def run_action(args: dict[str, object], task_vars: dict[str, object]) -> dict[str, object]:
    """specdeploy_model_fit's act as the role calls it, its SSH round run here."""
    from tests.support import action_docs  # noqa: PLC0415

    action = object.__new__(action_docs.load_plugin(ROOT, "specdeploy_model_fit").ActionModule)
    action.task_vars, action._templar, action._host_connection = task_vars, _Templar(), _Here()
    spec = action.ARGUMENTS
    full = {name: args.get(name, spec[name].get("default")) for name in spec}
    result: dict[str, object] = action.act(full)
    return result


def test_the_preflight_action_refuses_before_any_load_and_skips_a_model_not_there(kimi: tuple[Path, Path]) -> None:
    target, drafter = kimi
    args = {"model_path": str(target), "drafter_path": str(drafter), "profile": "vllm-cuda", "gpu_memory_mib": H100_MIB}
    fits = run_action({**args, "serving": {"serving_max_model_len": 4096}}, {})
    assert not fits.get("failed") and fits["problems"] == [] and "KV cache" in str(fits["msg"])
    refused = run_action(args, {"serving_max_model_len": 400_000})  # the inventory's value, the role's defaults else
    assert refused["failed"] and "serving_max_model_len=400000: the KV cache holds" in str(refused["msg"])
    absent = run_action({**args, "model_path": str(target.parent / "absent")}, {"serving_max_model_len": 400_000})
    assert absent.get("skipped_fit") and not absent.get("failed")
    cpu = run_action({**args, "profile": "vllm-cpu", "gpu_memory_mib": 0},
                     {"serving_max_model_len": 400_000, "serving_env": {"VLLM_CPU_KVCACHE_SPACE": "1"}})  # fmt: skip
    assert cpu["failed"] and "the KV cache holds" in str(cpu["msg"])


def test_the_role_hands_the_action_only_arguments_it_takes() -> None:
    import yaml  # noqa: PLC0415

    from tests.support import action_docs  # noqa: PLC0415

    spec = action_docs.load_plugin(ROOT, "specdeploy_model_fit").ActionModule.ARGUMENTS
    tasks = yaml.safe_load((ROOT / "roles/preflight/tasks/host.yml").read_text())
    (task,) = [t["specdeploy_model_fit"] for t in tasks if "specdeploy_model_fit" in t]
    assert set(task) <= set(spec) and set(task["serving"]) <= set(memory.Serving.VARIABLES)


def test_a_checkpoint_not_downloaded_gives_its_index_total_over_the_ranks(tmp_path: Path) -> None:
    """model.safetensors.index.json alone: total_size / (TP x PP), said to be an estimate."""
    folder = tmp_path / "index-only"
    folder.mkdir()
    target = real_shapes.target_config(IDS, layers=61, experts=16)
    (folder / "config.json").write_text(json.dumps(target))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 8 * 2**36}}))
    serving = memory.Serving("vllm", weights.Layout(8), max_model_len=4096)
    fits = model_files.fit_for(serving, model_files.read_local(folder), None, H100_MIB)
    assert fits.fit is not None and fits.fit.weights == 2**36 and "estimated" in fits.note


def test_a_file_that_is_no_safetensors_is_named_and_nothing_refused(tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "broken.safetensors").write_bytes(b"\xff" * 16)
    read = read_on_host(folder)["target"]
    fits = model_files.fit_for(memory.Serving("vllm", max_model_len=400_000), read, None, H100_MIB)
    assert fits.fit is None and "broken.safetensors" in fits.note
