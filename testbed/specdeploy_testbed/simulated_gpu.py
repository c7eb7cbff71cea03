"""Simulated nvidia-smi output for an N x RTX PRO 6000 Blackwell Server Edition host we do not have.

Everything here is simulated: it is made by transforming the real h200-x1 captures (the XML's <gpu>
element replicated and renamed, the CSV and topo rebuilt in the captures' format), so the parsers see
the same shapes as on a real host. Values the simulation does not model (clocks, ECC counters, PCI
device ids, ...) keep the H200's captured values.
"""

from __future__ import annotations

import argparse
import copy
import re
import shlex
import sys
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from specdeploy.errors import SpecdeployError
from specdeploy.gpu.facts import QUERY_GPU_FIELDS, Gpu, GpuProcess, KernelModule
from specdeploy.paths import project_root

SIM_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
SIM_ARCHITECTURE = "Blackwell"
SIM_COMPUTE_CAP = (12, 0)
SIM_MEMORY_MIB = 97887
SIM_POWER_LIMIT_W = 600  # the Server Edition's maximum board power
# A simulated two-socket host: the CPUs and NUMA node nearest each socket's GPUs.
SIM_SOCKETS = (("0-31,64-95", "0"), ("32-63,96-127", "1"))
_UUID_NAMESPACE = uuid.UUID("6f1d0c3e-2b7a-4f43-9a53-5e1e0d7f0a11")  # fixed, so simulated UUIDs are stable
FILES = ("nvidia-smi-q.xml", "query-gpu.csv", "query-apps.csv", "topo.txt", "version", "list.txt", "plain.txt")


def capture_dir() -> Path:
    """The real captures this simulation transforms: <project_root>/../shared/fixtures/nvidia-smi, or
    the verbatim copy in tests/data (a clone elsewhere, e.g. CI's, has no ../shared)."""
    shared = project_root().parent / "shared" / "fixtures" / "nvidia-smi"
    return shared if shared.is_dir() else project_root() / "tests" / "data" / "nvidia-smi" / "shared-captures"


def _read(source: Path, name: str) -> str:
    path = source / name
    if not path.is_file():
        raise SpecdeployError(f"real nvidia-smi capture {path} is missing", hint="the simulation is built from it")
    return path.read_text()


def _socket(index: int, count: int) -> int:
    return index * len(SIM_SOCKETS) // count if count > 1 else 0


def simulated_gpus(count: int) -> tuple[Gpu, ...]:
    """The simulated GPUs; socket 0's GPUs sit on low PCI buses and socket 1's on high ones, as on real boards."""
    per_socket = (count + 1) // 2 if count > 1 else 1
    step = max(1, 0x60 // per_socket)  # keeps each socket's buses inside its half of 0x00-0xFF
    gpus = []
    for index in range(count):
        socket = _socket(index, count)
        bus = 0x18 + step * (index - socket * per_socket) + 0x80 * socket
        gpus.append(
            Gpu(
                index=index,
                name=SIM_NAME,
                uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'simulated-rtx-pro-6000-{index}')}",
                pci_bus_id=f"00000000:{bus:02X}:00.0",
                compute_capability=SIM_COMPUTE_CAP,
                memory_total_mib=SIM_MEMORY_MIB,
                memory_used_mib=0,
                architecture=SIM_ARCHITECTURE,
            )
        )
    return tuple(gpus)


def _used(gpu: Gpu, processes: Sequence[GpuProcess]) -> int:
    return sum(p.used_mib or 0 for p in processes if p.gpu_index == gpu.index)


def _set(element: ET.Element, path: str, text: str) -> None:
    found = element.find(path)
    if found is None:
        raise SpecdeployError(f"the real capture's <gpu> has no <{path}> to set in the simulation")
    found.text = text


def _process_elements(processes: Sequence[GpuProcess]) -> list[ET.Element]:
    """<process_info> elements shaped (and indented) like the ones in the h200-x2-busy capture."""
    elements = []
    for process in processes:
        info = ET.Element("process_info")
        info.text = "\n\t\t\t\t"
        values = ("N/A", "N/A", str(process.pid), "C", process.name, f"{process.used_mib or 0} MiB")
        tags = ("gpu_instance_id", "compute_instance_id", "pid", "type", "process_name", "used_memory")
        for tag, value in zip(tags, values, strict=True):
            child = ET.SubElement(info, tag)
            child.text, child.tail = value, "\n\t\t\t\t"
        child.tail = "\n\t\t\t"
        info.tail = "\n\t\t\t"
        elements.append(info)
    if elements:
        elements[-1].tail = "\n\t\t"
    return elements


def render_xml(
    template: str, gpus: Sequence[Gpu], driver_version: str, cuda_version: str, processes: Sequence[GpuProcess]
) -> str:
    """The captured `-q -x` with its one <gpu> replicated per simulated GPU."""
    root = ET.fromstring(template)
    prolog = template[: template.index("<nvidia_smi_log")]  # ElementTree drops the DOCTYPE; keep it
    originals = root.findall("gpu")
    if not originals:
        raise SpecdeployError("the real -q -x capture has no <gpu> to replicate")
    position = list(root).index(originals[0])
    last_tail = originals[-1].tail
    for original in originals:
        root.remove(original)
    _set(root, "driver_version", driver_version)
    _set(root, "cuda_version", cuda_version)
    _set(root, "attached_gpus", str(len(gpus)))
    reserved = int((originals[0].findtext("fb_memory_usage/reserved") or "0 MiB").split()[0])
    for offset, gpu in enumerate(gpus):
        element = copy.deepcopy(originals[0])
        element.set("id", gpu.pci_bus_id)
        used = _used(gpu, processes)
        total = gpu.memory_total_mib or 0
        bus = gpu.pci_bus_id.split(":")[1]
        for path, value in (
            ("product_name", gpu.name),
            ("product_architecture", gpu.architecture or SIM_ARCHITECTURE),
            ("uuid", gpu.uuid),
            ("serial", f"{1650000000000 + gpu.index}"),
            ("minor_number", str(gpu.index)),
            ("gsp_firmware_version", driver_version),
            ("pci/pci_bus", bus),
            ("pci/pci_device", "00"),
            ("pci/pci_bus_id", gpu.pci_bus_id),
            ("fb_memory_usage/total", f"{total} MiB"),
            ("fb_memory_usage/used", f"{used} MiB"),
            ("fb_memory_usage/free", f"{total - reserved - used} MiB"),
        ):
            _set(element, path, value)
        for limit in ("current", "requested", "default", "max"):
            _set(element, f"gpu_power_readings/{limit}_power_limit", f"{SIM_POWER_LIMIT_W:.2f} W")
        process_list = element.find("processes")
        if process_list is None:
            raise SpecdeployError("the real capture's <gpu> has no <processes>")
        for child in list(process_list):
            process_list.remove(child)
        process_list.extend(_process_elements([p for p in processes if p.gpu_index == gpu.index]))
        process_list.text = "\n\t\t\t" if len(process_list) else "\n\t\t"
        element.tail = last_tail if offset == len(gpus) - 1 else "\n\n\t"
        root.insert(position + offset, element)
    return prolog + ET.tostring(root, encoding="unicode") + "\n"


def render_query_gpu(template: str, gpus: Sequence[Gpu], driver_version: str, processes: Sequence[GpuProcess]) -> str:
    """One line per GPU, transformed from the captured line so the untouched fields keep their format."""
    lines = [line for line in template.splitlines() if line.strip()]
    if not lines:
        raise SpecdeployError("the real --query-gpu capture is empty")
    row = dict(zip(QUERY_GPU_FIELDS, (cell.strip() for cell in lines[0].split(",")), strict=True))
    reserved = int(row["memory.total"]) - int(row["memory.used"]) - int(row["memory.free"])
    out = []
    for gpu in gpus:
        used = _used(gpu, processes)
        total = gpu.memory_total_mib or 0
        row |= {
            "index": str(gpu.index),
            "name": gpu.name,
            "uuid": gpu.uuid,
            "pci.bus_id": gpu.pci_bus_id,
            "driver_version": driver_version,
            "compute_cap": f"{SIM_COMPUTE_CAP[0]}.{SIM_COMPUTE_CAP[1]}",
            "memory.total": str(total),
            "memory.used": str(used),
            "memory.free": str(total - reserved - used),
            "power.limit": f"{SIM_POWER_LIMIT_W:.2f}",
        }
        out.append(", ".join(row[name] for name in QUERY_GPU_FIELDS))
    return "\n".join(out) + "\n"


def render_apps(gpus: Sequence[Gpu], processes: Sequence[GpuProcess]) -> str:
    """`--query-compute-apps=pid,process_name,used_memory,gpu_uuid` lines; empty (as captured) when idle."""
    uuids = {gpu.index: gpu.uuid for gpu in gpus}
    return "".join(f"{p.pid}, {p.name}, {p.used_mib or 0}, {uuids[p.gpu_index]}\n" for p in processes)


def render_topo(template: str, count: int) -> str:
    """A PCIe-only matrix: NODE within a socket, SYS across sockets; legend and column layout from the capture."""
    lines = template.splitlines()
    header_cells = re.sub(r"\x1b\[[0-9;]*m", "", lines[0]).split("\t")
    extra_header = [cell for cell in header_cells[1:] if not re.fullmatch(r"GPU\d+", cell)]
    row_cells = lines[1].split("\t")  # GPU0, " X ", then CPU affinity, NUMA affinity, ... as captured
    extra_row = row_cells[1 + sum(1 for cell in header_cells if re.fullmatch(r"GPU\d+", cell)) :]
    gpu_cols = [f"GPU{i}" for i in range(count)]
    out = ["\t\x1b[4m" + "\t".join(gpu_cols + extra_header) + "\x1b[0m"]
    for a in range(count):
        cells = [
            " X " if a == b else ("NODE" if _socket(a, count) == _socket(b, count) else "SYS") for b in range(count)
        ]
        cpus, numa = SIM_SOCKETS[_socket(a, count)]
        out.append("\t".join([f"GPU{a}", *cells, cpus, numa, *extra_row[2:]]))
    legend = lines[lines.index("") :] if "" in lines else []
    return "\n".join(out + legend) + "\n"


def render_version(template: str, driver_version: str, kernel_module: KernelModule) -> str:
    """/proc/driver/nvidia/version: the captured NVRM and GCC lines with the simulated version and module."""
    captured = re.search(r"DRIVER version\s*:\s*(\S+)", template)
    lines = [line for line in template.splitlines() if line.startswith(("NVRM version:", "GCC version:"))]
    if not captured or len(lines) != 2:
        raise SpecdeployError("the real versions capture lacks the DRIVER/NVRM/GCC lines")
    text = "\n".join(lines).replace(captured[1], driver_version) + "\n"
    if kernel_module == "proprietary":
        text = text.replace("Open Kernel Module for x86_64", "x86_64 Kernel Module")
    return text


def render_list(gpus: Sequence[Gpu]) -> str:
    """`nvidia-smi -L`, in the capture's format."""
    return "".join(f"GPU {gpu.index}: {gpu.name} (UUID: {gpu.uuid})\n" for gpu in gpus)


def render_plain(
    template: str, gpus: Sequence[Gpu], driver_version: str, cuda_version: str, processes: Sequence[GpuProcess]
) -> str:
    """The plain `nvidia-smi` table: borders and headings from the capture, one block per simulated GPU."""
    lines = template.splitlines()
    border = lines[3]
    version = f" NVIDIA-SMI {driver_version:<23}Driver Version: {driver_version:<15}CUDA Version: {cuda_version:<9}"
    out = [lines[0], lines[1], f"|{version}|", *lines[3:8]]
    # The captured idle fan/temperature/perf/draw, e.g. " N/A   37C    P0             88W / ", keeps its layout.
    captured = lines[9].split("|")[1]
    idle = captured[: captured.rindex("/") + 1] + " "
    for gpu in gpus:
        name = gpu.name if len(gpu.name) <= 26 else gpu.name[:23] + "..."
        used, total = _used(gpu, processes), gpu.memory_total_mib or 0
        out += [
            f"|{gpu.index:>4}  {name:<26}{'On':>7}  |{gpu.pci_bus_id:>19} Off |{'0':>21} |",
            f"|{idle}{SIM_POWER_LIMIT_W:>4}W |{used:>8}MiB / {total:>6}MiB |{'0':>7}%{'Default':>13} |",
            f"|{'':41}|{'':24}|{'Disabled':>21} |",
            border,
        ]
    processes_at = next(n for n, line in enumerate(lines) if "Processes:" in line)
    out += ["", *lines[processes_at - 1 : processes_at + 4]]
    for p in processes:
        out.append(f"|{p.gpu_index:>5}   N/A  N/A{p.pid:>16}{'C':>7}   {p.name:<33.33}{p.used_mib or 0:>10}MiB |")
    if not processes:
        out.append(f"|{'  No running processes found':<89}|")
    out.append(lines[1])
    return "\n".join(out) + "\n"


def render_all(
    count: int = 8,
    *,
    driver_version: str = "580.95.05",
    cuda_version: str = "13.0",
    kernel_module: KernelModule = "open",
    processes: Sequence[GpuProcess] = (),
    source: Path | None = None,
) -> dict[str, str]:
    """Every simulated file by name (see FILES), transformed from the real h200-x1 captures in `source`."""
    if not 1 <= count <= 64:
        raise SpecdeployError(f"a simulated host has 1 to 64 GPUs, got {count}")
    bad = [p for p in processes if not 0 <= p.gpu_index < count]
    if bad:
        raise SpecdeployError(f"simulated process(es) on GPUs outside 0..{count - 1}: {bad}")
    capture = (source or capture_dir()) / "h200-x1"
    gpus = simulated_gpus(count)
    return {
        "nvidia-smi-q.xml": render_xml(
            _read(capture, "nvidia-smi-q.xml"), gpus, driver_version, cuda_version, processes
        ),
        "query-gpu.csv": render_query_gpu(_read(capture, "query-gpu.csv"), gpus, driver_version, processes),
        "query-apps.csv": render_apps(gpus, processes),
        "topo.txt": render_topo(_read(capture, "topo.txt"), count),
        "version": render_version(_read(capture, "versions.txt"), driver_version, kernel_module),
        "list.txt": render_list(gpus),
        "plain.txt": render_plain(_read(capture, "plain.txt"), gpus, driver_version, cuda_version, processes),
    }


def replayer_script(data_dir: str | Path) -> str:
    """A POSIX sh stand-in for nvidia-smi that prints the simulated files in `data_dir`.

    Any --query-gpu field list gets the stored CSV, which holds facts.QUERY_GPU_FIELDS in that order.
    """
    directory = shlex.quote(str(data_dir))
    return f"""#!/bin/sh
# Simulated nvidia-smi: replays the simulated files in {directory}; no GPU or driver is involved.
d={directory}
case "$*" in
  "") cat "$d/plain.txt" ;;
  "-L") cat "$d/list.txt" ;;
  "-q -x" | "-x -q") cat "$d/nvidia-smi-q.xml" ;;
  "topo -m") cat "$d/topo.txt" ;;
  --query-gpu=*) cat "$d/query-gpu.csv" ;;
  --query-compute-apps=*) cat "$d/query-apps.csv" ;;
  *) echo "simulated nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
"""


def write(out: Path, files: dict[str, str]) -> Path:
    """Write the simulated files and an executable `nvidia-smi` replayer into `out`; returns the replayer."""
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    script = out / "nvidia-smi"
    script.write_text(replayer_script(out.resolve()))
    script.chmod(0o755)
    return script


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdeploy_testbed.simulated_gpu",
        description=f"Write simulated nvidia-smi output for N x {SIM_NAME}, plus a replayer script.",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to write the simulated files into")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--module", choices=("open", "proprietary"), default="open", help="kernel module flavour")
    parser.add_argument("--driver", default="580.95.05", help="driver version")
    parser.add_argument("--cuda", default="13.0", help="CUDA version the driver reports")
    args = parser.parse_args(argv)
    try:
        files = render_all(args.count, driver_version=args.driver, cuda_version=args.cuda, kernel_module=args.module)
        script = write(args.out, files)
    except SpecdeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"simulated {args.count} x {SIM_NAME} in {args.out}; replayer: {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
