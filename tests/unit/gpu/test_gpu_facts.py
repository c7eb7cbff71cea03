"""Parsers against the real nvidia-smi captures, and the simulated RTX PRO 6000 host round-tripped through them."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.gpu import cli
from specdeploy.gpu.facts import (
    QUERY_GPU_FIELDS,
    GpuProcess,
    collect,
    facts_from_json,
    parse_compute_apps_csv,
    parse_kernel_module,
    parse_query_gpu_csv,
    parse_smi_xml,
    parse_topo,
)
from specdeploy_testbed import simulated_gpu as simulated
from specdeploy_testbed.simulated_gpu import capture_dir

CAPTURES = capture_dir()
pytestmark = pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"real nvidia-smi captures not found at {CAPTURES}")
X1 = CAPTURES / "h200-x1"
X2 = CAPTURES / "h200-x2-busy"


def read(path: Path) -> str:
    return path.read_text()


def x1_facts(with_version: bool = True):
    return collect(
        read(X1 / "nvidia-smi-q.xml"),
        read(X1 / "topo.txt"),
        query_gpu=read(X1 / "query-gpu.csv"),
        apps=read(X1 / "query-apps.csv"),
        driver_version_file=read(X1 / "versions.txt") if with_version else None,
    )


def x2_facts():
    return collect(
        read(X2 / "nvidia-smi-q-x2-busy.xml"),
        read(X2 / "topo-x2.txt"),
        query_gpu=read(X2 / "query-gpu-x2-busy.csv"),
        apps=read(X2 / "query-apps-x2-busy.csv"),
    )


def listed(text: str) -> list[tuple[int, str, str]]:
    """`nvidia-smi -L` lines: (index, name, uuid)."""
    return [
        (int(m[1]), m[2], m[3]) for m in re.finditer(r"^GPU (\d+): (.+) \(UUID: (\S+)\)$", text, flags=re.MULTILINE)
    ]


def versions(path: Path) -> dict[str, str]:
    """`NVIDIA-SMI version  : 580.159.04`-style lines of versions.txt."""
    return {m[1].strip(): m[2] for m in re.finditer(r"^([A-Za-z -]+?)\s*: (\S+)$", read(path), flags=re.MULTILINE)}


def plain_processes(text: str) -> set[tuple[int, int, str, int]]:
    """(gpu, pid, name, MiB) rows of the plain nvidia-smi table."""
    row = r"^\|\s+(\d+)\s+N/A\s+N/A\s+(\d+)\s+C\s+(\S+)\s+(\d+)MiB \|$"
    return {(int(m[1]), int(m[2]), m[3], int(m[4])) for m in re.finditer(row, text, flags=re.MULTILINE)}


@pytest.mark.parametrize(
    ("xml", "csv"),
    [(X1 / "nvidia-smi-q.xml", X1 / "query-gpu.csv"), (X2 / "nvidia-smi-q-x2-busy.xml", X2 / "query-gpu-x2-busy.csv")],
)
def test_xml_and_query_gpu_csv_agree(xml, csv):
    from_xml = parse_smi_xml(read(xml))
    from_csv = parse_query_gpu_csv(read(csv))
    fields = ("index", "name", "uuid", "pci_bus_id", "memory_total_mib", "memory_used_mib")
    assert [[getattr(g, f) for f in fields] for g in from_xml.gpus] == [
        [getattr(g, f) for f in fields] for g in from_csv
    ]
    assert from_xml.count == int(ET.fromstring(read(xml)).findtext("attached_gpus") or "-1")
    csv_drivers = {line.split(", ")[QUERY_GPU_FIELDS.index("driver_version")] for line in read(csv).splitlines()}
    assert csv_drivers == {from_xml.driver_version}


def test_h200_x1_facts_are_what_the_captures_say():
    facts = x1_facts()
    assert [(g.index, g.name, g.uuid) for g in facts.gpus] == listed(read(X1 / "list.txt"))
    said = versions(X1 / "versions.txt")
    assert facts.driver_version == said["DRIVER version"] == said["NVIDIA-SMI version"] == "580.159.04"
    assert facts.cuda_version == said["CUDA Version"] == "13.0"
    assert facts.driver_branch == 580
    assert facts.compute_capabilities == [(9, 0)]
    assert facts.gpus[0].memory_total_mib == 143771  # "143771 MiB" in the XML
    assert facts.gpus[0].architecture == "Hopper"
    assert facts.kernel_module == "open"  # "NVIDIA UNIX Open Kernel Module" in versions.txt
    assert facts.processes == ()  # query-apps.csv is empty
    assert facts.links == {}
    assert facts.pcie_only  # a single GPU has no NVLink peer


def test_xml_has_no_compute_capability_or_module_so_collect_takes_them_from_elsewhere():
    assert parse_smi_xml(read(X1 / "nvidia-smi-q.xml")).gpus[0].compute_capability is None
    assert parse_smi_xml(read(X1 / "nvidia-smi-q.xml")).kernel_module == "unknown"
    assert x1_facts(with_version=False).kernel_module == "unknown"
    xml_only = collect(read(X1 / "nvidia-smi-q.xml"), read(X1 / "topo.txt"))
    assert xml_only.gpus[0].compute_capability is None
    assert xml_only.compute_capabilities == []


def test_kernel_module_flavours():
    assert parse_kernel_module(read(X1 / "versions.txt")) == "open"
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Tue Apr  8 12:47:53 UTC 2025\n"
    assert parse_kernel_module(proprietary) == "proprietary"
    assert parse_kernel_module("something else") == "unknown"


def test_h200_x2_busy_nvlink_and_the_stale_process():
    facts = x2_facts()
    assert facts.count == 2
    assert facts.links == {(0, 1): "NV18"}
    assert facts.link(1, 0) == "NV18"
    assert not facts.pcie_only
    from_apps = {(p.gpu_index, p.pid, p.name, p.used_mib) for p in facts.processes}
    assert from_apps == plain_processes(read(X2 / "plain-x2-busy.txt"))
    assert (0, 566, "python3", 10758) in from_apps
    from_xml = {
        (p.gpu_index, p.pid, p.name, p.used_mib) for p in parse_smi_xml(read(X2 / "nvidia-smi-q-x2-busy.xml")).processes
    }
    assert from_xml == from_apps


def test_topo_ignores_nic_rows_and_the_legend():
    topo = (
        "\t\x1b[4mGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tPIX\tSYS\tNODE\t0-15\t0\t\tN/A\n"
        "GPU1\tPIX\t X \tSYS\tNODE\t0-15\t0\t\tN/A\n"
        "GPU2\tSYS\tSYS\t X \tSYS\t16-31\t1\t\tN/A\n"
        "NIC0\tNODE\tNODE\tSYS\t X \t\t\t\t\n"
        "\nLegend:\n\n  X    = Self\n"
    )
    assert parse_topo(topo) == {(0, 1): "PIX", (0, 2): "SYS", (1, 2): "SYS"}


def test_query_gpu_csv_with_header_units_and_missing_values():
    header = ", ".join(f"{f} [MiB]" if f.startswith("memory.") else f for f in QUERY_GPU_FIELDS)
    cells = read(X1 / "query-gpu.csv").strip().split(", ")
    for field in ("memory.total", "memory.used", "memory.free"):
        cells[QUERY_GPU_FIELDS.index(field)] += " MiB"
    with_units = parse_query_gpu_csv(f"{header}\n{', '.join(cells)}\n")
    assert with_units == parse_query_gpu_csv(read(X1 / "query-gpu.csv"))
    cells[QUERY_GPU_FIELDS.index("compute_cap")] = "[N/A]"
    cells[QUERY_GPU_FIELDS.index("memory.used")] = "[N/A]"
    (gpu,) = parse_query_gpu_csv(", ".join(cells))
    assert gpu.compute_capability is None and gpu.memory_used_mib is None


def test_compute_apps_csv_handles_na_memory_and_commas_in_names():
    gpus = x2_facts().gpus
    text = f"566, python3 -c a,b, [N/A], {gpus[1].uuid}\n"
    assert parse_compute_apps_csv(text, gpus) == (GpuProcess(566, "python3 -c a,b", 1, None),)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: parse_smi_xml("this is not xml <"), "not XML"),
        (lambda: parse_smi_xml("<html><body/></html>"), "<html>"),
        (lambda: parse_smi_xml("<nvidia_smi_log><gpu/></nvidia_smi_log>"), "driver_version"),
        (lambda: parse_topo("NVIDIA-SMI has failed"), "GPU0"),
        (lambda: parse_query_gpu_csv("0, NVIDIA H200"), "fields"),
        (lambda: parse_query_gpu_csv(read(X1 / "query-gpu.csv").replace("143771", "140 GiB")), "140 GiB"),
        (lambda: parse_compute_apps_csv("566, python3, 10758, GPU-nope", x2_facts().gpus), "GPU-nope"),
        (lambda: collect(read(X2 / "nvidia-smi-q-x2-busy.xml"), read(X1 / "topo.txt")), "topo"),
        (
            lambda: collect(read(X1 / "nvidia-smi-q.xml"), read(X1 / "topo.txt"), read(X2 / "query-gpu-x2-busy.csv")),
            "--query-gpu lists",
        ),
    ],
)
def test_bad_input_raises_a_named_error(call, message):
    with pytest.raises(SpecdeployError, match=re.escape(message)):
        call()


def test_to_json_is_plain_json_and_round_trips():
    facts = x2_facts()
    data = json.loads(json.dumps(facts.to_json()))
    assert data["links"] == {"0-1": "NV18"}
    assert data["count"] == 2 and data["driver_branch"] == 580 and data["pcie_only"] is False
    assert data["compute_capabilities"] == ["9.0"]
    assert data["gpus"][0]["compute_capability"] == "9.0"
    assert facts_from_json(data) == facts


# --- the simulated 8 x RTX PRO 6000 Blackwell host ---------------------------------------------------------------


def simulated_facts(**kwargs):
    files = simulated.render_all(**kwargs)
    return collect(
        files["nvidia-smi-q.xml"], files["topo.txt"], files["query-gpu.csv"], files["query-apps.csv"], files["version"]
    )


def test_simulated_host_round_trips_through_the_parsers():
    facts = simulated_facts()
    assert facts.count == 8
    assert {g.name for g in facts.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert facts.compute_capabilities == [(12, 0)]
    assert {g.memory_total_mib for g in facts.gpus} == {97887}
    assert facts.pcie_only
    assert set(facts.links.values()) == {"NODE", "SYS"}
    assert facts.link(0, 3) == "NODE" and facts.link(3, 4) == "SYS" and facts.link(4, 7) == "NODE"
    assert (facts.driver_version, facts.cuda_version, facts.kernel_module) == ("580.95.05", "13.0", "open")
    assert facts.processes == ()
    assert len({g.uuid for g in facts.gpus}) == len({g.pci_bus_id for g in facts.gpus}) == 8
    xml_only = parse_smi_xml(simulated.render_all()["nvidia-smi-q.xml"])
    assert [(g.uuid, g.pci_bus_id) for g in xml_only.gpus] == [(g.uuid, g.pci_bus_id) for g in facts.gpus]


def test_simulated_options_and_processes_round_trip():
    busy = [GpuProcess(566, "python3", 1, 10758), GpuProcess(777, "vllm", 7, 90000)]
    old = simulated_facts(count=4, driver_version="550.163.01", cuda_version="12.4", kernel_module="proprietary")
    assert (old.count, old.driver_branch, old.cuda_version, old.kernel_module) == (4, 550, "12.4", "proprietary")
    facts = simulated_facts(processes=busy)
    assert facts.processes == tuple(busy)
    assert [g.memory_used_mib for g in facts.gpus] == [0, 10758, 0, 0, 0, 0, 0, 90000]
    with pytest.raises(SpecdeployError, match="outside"):
        simulated.render_all(count=4, processes=busy)


def test_simulated_xml_keeps_the_captures_structure():
    def paths(gpu: ET.Element) -> list[str]:
        out: list[str] = []

        def walk(element: ET.Element, prefix: str) -> None:
            for child in element:
                if child.tag != "process_info":
                    out.append(f"{prefix}/{child.tag}")
                    walk(child, f"{prefix}/{child.tag}")

        walk(gpu, "")
        return out

    captured = ET.fromstring(read(X1 / "nvidia-smi-q.xml"))
    rendered = simulated.render_all()["nvidia-smi-q.xml"]
    assert rendered.startswith(read(X1 / "nvidia-smi-q.xml").split("<nvidia_smi_log>")[0])  # the DOCTYPE too
    root = ET.fromstring(rendered)
    assert [child.tag for child in root if child.tag != "gpu"] == [
        child.tag for child in captured if child.tag != "gpu"
    ]
    assert all(paths(gpu) == paths(captured.find("gpu")) for gpu in root.findall("gpu"))
    assert len(root.findall("gpu")) == int(root.findtext("attached_gpus") or 0) == 8


def test_simulated_text_files_keep_the_captures_layout():
    files = simulated.render_all(processes=[GpuProcess(566, "python3", 2, 10758)])
    width = {len(line) for line in read(X1 / "plain.txt").splitlines()[1:] if line}
    assert {len(line) for line in files["plain.txt"].splitlines()[1:] if line} == width
    assert plain_processes(files["plain.txt"]) == {(2, 566, "python3", 10758)}
    assert [name for _, name, _ in listed(files["list.txt"])] == [simulated.SIM_NAME] * 8
    assert files["topo.txt"].split("\n\n", 1)[1] == read(X1 / "topo.txt").split("\n\n", 1)[1]  # the legend
    assert len(files["query-gpu.csv"].splitlines()[0].split(", ")) == len(QUERY_GPU_FIELDS)


def test_replayer_and_fact_cli_on_a_simulated_host(tmp_path, capsys):
    assert simulated.main(["--out", str(tmp_path), "--count", "8", "--module", "open"]) == 0
    smi = tmp_path / "nvidia-smi"
    assert "simulated" in smi.read_text()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(smi), *args], capture_output=True, text=True, check=False)

    assert run("-q", "-x").stdout == read(tmp_path / "nvidia-smi-q.xml")
    assert run("topo", "-m").stdout == read(tmp_path / "topo.txt")
    assert run("--query-gpu=index,name", "--format=csv,noheader").stdout == read(tmp_path / "query-gpu.csv")
    assert run("--query-compute-apps=pid", "--format=csv").stdout == read(tmp_path / "query-apps.csv")
    assert "Driver Version: 580.95.05" in run().stdout
    unknown = run("--bogus")
    assert unknown.returncode != 0 and "unsupported arguments: --bogus" in unknown.stderr

    capsys.readouterr()
    argv = ["facts", "--smi", str(smi), "--driver-version-file", str(tmp_path / "version"), "--tp", "8"]
    argv += ["--cmdline-file", str(tmp_path / "no-such-cmdline")]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 8 and data["kernel_module"] == "open" and data["pcie_only"] is True
    assert data["problems"] == []
    assert data["nccl"]["env"] == {"NCCL_P2P_DISABLE": "1"}


def test_fact_cli_reports_a_failing_nvidia_smi(tmp_path, capsys):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    smi.chmod(0o755)
    assert cli.main(["facts", "--smi", str(smi)]) == 2
    err = capsys.readouterr().err
    assert "No devices were found" in err and "open" in err
    assert cli.main(["facts", "--smi", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
