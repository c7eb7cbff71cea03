"""Typed facts about a host's NVIDIA GPUs, parsed from real `nvidia-smi` output.

Stdlib only (plus `specdeploy.errors`), because the fact script runs on the target host.

What the driver 580 captures expose, and so where each fact comes from:
- `nvidia-smi -q -x`: GPUs (name, UUID, PCI bus id, architecture, memory), driver and CUDA versions,
  processes. It carries no GPU index (we use document order, which is nvidia-smi's index order), no
  compute capability and nothing about the kernel module flavour.
- `--query-gpu=...,compute_cap,...`: the compute capability.
- `/proc/driver/nvidia/version`: open vs proprietary kernel module ("NVIDIA UNIX Open Kernel Module").
- `topo -m`: the link type between each GPU pair.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from specdeploy.errors import SpecdeployError

KernelModule = Literal["open", "proprietary", "unknown"]

# The field list the fact script asks for; the h200 captures were taken with exactly this list.
QUERY_GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "compute_cap",
    "memory.total",
    "memory.used",
    "memory.free",
    "persistence_mode",
    "power.limit",
    "temperature.gpu",
    "utilization.gpu",
)
QUERY_APPS_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")
CSV_FORMAT = "csv,noheader,nounits"

# nvidia-smi's spellings of "no value" across its text, CSV and XML outputs.
_MISSING = {"", "n/a", "[n/a]", "not supported", "[not supported]", "[unknown error]", "none"}
_MIB = re.compile(r"^(\d+)(?:\s*MiB)?$")
_CC = re.compile(r"^(\d+)\.(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GPU_LABEL = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV\d+$")
# Tag names a future nvidia-smi might use for the compute capability; the 580 XML has none.
_XML_CC_TAGS = ("compute_cap", "cuda_compute_capability", "compute_capability")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    compute_capability: tuple[int, int] | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    architecture: str | None = None  # "Hopper", "Blackwell": the XML's hint when compute_cap is unknown


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    gpu_index: int
    used_mib: int | None


@dataclass(frozen=True)
class GpuFacts:
    gpus: tuple[Gpu, ...]
    driver_version: str
    cuda_version: str | None
    kernel_module: KernelModule = "unknown"
    processes: tuple[GpuProcess, ...] = ()
    # Only pairs (i, j) with i < j: topo -m is symmetric.
    links: dict[tuple[int, int], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+(\.\d+)*", self.driver_version):
            raise SpecdeployError(f"cannot read the NVIDIA driver version {self.driver_version!r}")

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def driver_branch(self) -> int:
        """The driver's major version, e.g. 580 for 580.95.05."""
        return int(self.driver_version.split(".")[0])

    @property
    def cuda_version_tuple(self) -> tuple[int, int] | None:
        return _version_pair(self.cuda_version)

    @property
    def pcie_only(self) -> bool:
        """True when no GPU pair is joined by NVLink (`NV#` in topo -m)."""
        return not any(_NVLINK.match(kind) for kind in self.links.values())

    @property
    def compute_capabilities(self) -> list[tuple[int, int]]:
        """The distinct known compute capabilities, sorted."""
        return sorted({gpu.compute_capability for gpu in self.gpus if gpu.compute_capability is not None})

    def link(self, a: int, b: int) -> str | None:
        return self.links.get((min(a, b), max(a, b)))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only, so Ansible can use it as facts; link keys are "i-j"."""
        return {
            "count": self.count,
            "gpus": [
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "uuid": gpu.uuid,
                    "pci_bus_id": gpu.pci_bus_id,
                    "compute_capability": _cc_text(gpu.compute_capability),
                    "architecture": gpu.architecture,
                    "memory_total_mib": gpu.memory_total_mib,
                    "memory_used_mib": gpu.memory_used_mib,
                }
                for gpu in self.gpus
            ],
            "driver_version": self.driver_version,
            "driver_branch": self.driver_branch,
            "cuda_version": self.cuda_version,
            "kernel_module": self.kernel_module,
            "processes": [
                {"pid": p.pid, "name": p.name, "gpu_index": p.gpu_index, "used_mib": p.used_mib} for p in self.processes
            ],
            "links": {f"{a}-{b}": kind for (a, b), kind in sorted(self.links.items())},
            "pcie_only": self.pcie_only,
            "compute_capabilities": [_cc_text(cc) for cc in self.compute_capabilities],
        }


def _cc_text(cc: tuple[int, int] | None) -> str | None:
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def _version_pair(text: str | None) -> tuple[int, int] | None:
    match = re.match(r"^(\d+)\.(\d+)", text or "")
    return (int(match[1]), int(match[2])) if match else None


def _value(text: str | None) -> str | None:
    """The stripped text, or None for nvidia-smi's "[N/A]" and friends."""
    if text is None:
        return None
    stripped = text.strip()
    return None if stripped.lower() in _MISSING else stripped


def _mib(text: str | None, what: str) -> int | None:
    value = _value(text)
    if value is None:
        return None
    match = _MIB.match(value)
    if not match:
        raise SpecdeployError(f"cannot read {what} {value!r} as MiB")
    return int(match[1])


def _compute_cap(text: str | None, what: str) -> tuple[int, int] | None:
    value = _value(text)
    if value is None:
        return None
    match = _CC.match(value)
    if not match:
        raise SpecdeployError(f"cannot read {what} {value!r} as a compute capability like 9.0")
    return int(match[1]), int(match[2])


def _int(text: str | None, what: str) -> int:
    value = _value(text)
    if value is None or not value.isdigit():
        raise SpecdeployError(f"cannot read {what} {text!r} as a number")
    return int(value)


def _csv_rows(text: str, fields: Sequence[str], first_field: str) -> tuple[list[str], list[list[str]]]:
    """Split nvidia-smi CSV (", "-separated, never quoted); a header line, when present, names the columns."""
    lines = [line for line in text.splitlines() if line.strip()]
    rows = [[cell.strip() for cell in line.split(",")] for line in lines]
    if rows and rows[0][0] == first_field:
        # `--format=csv` puts units in the header ("memory.total [MiB]").
        names = [re.sub(r"\s*\[.*\]$", "", cell) for cell in rows[0]]
        return names, rows[1:]
    return list(fields), rows


def query_gpu_command(smi: str = "nvidia-smi") -> list[str]:
    """The one --query-gpu command every phase runs (preflight, nvidia_driver, cuda_toolkit, container_runtime)."""
    return [smi, f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", f"--format={CSV_FORMAT}"]


def query_gpu_rows(text: str) -> list[dict[str, str]]:
    """Each GPU's --query-gpu answer by field name (never by position)."""
    names, rows = _csv_rows(text, QUERY_GPU_FIELDS, "index")
    return [dict(zip(names, cells, strict=False)) for cells in rows]


def parse_query_gpu_csv(text: str, fields: Sequence[str] = QUERY_GPU_FIELDS) -> tuple[Gpu, ...]:
    """GPUs from `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`."""
    names, rows = _csv_rows(text, fields, "index")
    required = ("index", "name", "uuid", "pci.bus_id", "memory.total", "memory.used")
    missing = [name for name in required if name not in names]
    if missing:
        raise SpecdeployError(f"--query-gpu output lacks the field(s) {', '.join(missing)}")
    gpus: list[Gpu] = []
    for number, cells in enumerate(rows, start=1):
        if len(cells) != len(names):
            raise SpecdeployError(
                f"--query-gpu line {number} has {len(cells)} fields, expected {len(names)} ({','.join(names)})"
            )
        row = dict(zip(names, cells, strict=True))
        gpus.append(
            Gpu(
                index=_int(row["index"], "GPU index"),
                name=row["name"],
                uuid=row["uuid"],
                pci_bus_id=row["pci.bus_id"],
                compute_capability=_compute_cap(row.get("compute_cap"), "compute_cap"),
                memory_total_mib=_mib(row["memory.total"], "memory.total"),
                memory_used_mib=_mib(row["memory.used"], "memory.used"),
            )
        )
    return tuple(gpus)


def parse_compute_apps_csv(text: str, gpus: Iterable[Gpu]) -> tuple[GpuProcess, ...]:
    """Processes from `--query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,...`.

    Without a header the field order is QUERY_APPS_FIELDS, and a process name may contain commas.
    """
    index_of = {gpu.uuid: gpu.index for gpu in gpus}
    names, rows = _csv_rows(text, QUERY_APPS_FIELDS, "pid")
    processes: list[GpuProcess] = []
    for number, raw in enumerate(rows, start=1):
        cells = raw
        if names == list(QUERY_APPS_FIELDS) and len(raw) > len(names):
            cells = [raw[0], ",".join(raw[1:-2]), raw[-2], raw[-1]]
        if len(cells) != len(names):
            raise SpecdeployError(f"--query-compute-apps line {number} has {len(cells)} fields, expected {len(names)}")
        row = dict(zip(names, cells, strict=True))
        try:
            pid, name, used, uuid = (
                row["pid"],
                row["process_name"],
                row.get("used_memory", row.get("used_gpu_memory")),
                row["gpu_uuid"],
            )
        except KeyError as missing:
            raise SpecdeployError(f"--query-compute-apps output lacks the field {missing}") from None
        if uuid not in index_of:
            raise SpecdeployError(f"process {pid} runs on GPU {uuid}, which nvidia-smi did not list")
        processes.append(
            GpuProcess(_int(pid, "process pid"), name, index_of[uuid], _mib(used, f"memory of process {pid}"))
        )
    return tuple(processes)


def _text(element: ET.Element, path: str) -> str | None:
    return _value(element.findtext(path))


def parse_smi_xml(text: str) -> GpuFacts:
    """GPUs, versions and processes from `nvidia-smi -q -x`; links and compute capability are left empty."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as error:
        raise SpecdeployError(
            f"nvidia-smi -q -x output is not XML: {error}", hint="run `nvidia-smi -q -x` on the host and look"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise SpecdeployError(f"nvidia-smi -q -x output has root <{root.tag}>, expected <nvidia_smi_log>")
    driver = _text(root, "driver_version")
    if driver is None:
        raise SpecdeployError("nvidia-smi -q -x output has no <driver_version>")
    gpus: list[Gpu] = []
    processes: list[GpuProcess] = []
    for index, element in enumerate(root.findall("gpu")):
        uuid = _text(element, "uuid")
        if uuid is None:
            raise SpecdeployError(f"GPU {index} in nvidia-smi -q -x output has no <uuid>")
        cc = next((value for tag in _XML_CC_TAGS if (value := _text(element, tag))), None)
        gpus.append(
            Gpu(
                index=index,
                name=_text(element, "product_name") or "unknown",
                uuid=uuid,
                pci_bus_id=_text(element, "pci/pci_bus_id") or element.get("id") or "unknown",
                compute_capability=_compute_cap(cc, f"GPU {index} compute capability"),
                memory_total_mib=_mib(element.findtext("fb_memory_usage/total"), f"GPU {index} memory total"),
                memory_used_mib=_mib(element.findtext("fb_memory_usage/used"), f"GPU {index} memory used"),
                architecture=_text(element, "product_architecture"),
            )
        )
        for info in element.findall("processes/process_info"):
            pid = _int(info.findtext("pid"), f"GPU {index} process pid")
            processes.append(
                GpuProcess(
                    pid=pid,
                    name=_text(info, "process_name") or "unknown",
                    gpu_index=index,
                    used_mib=_mib(info.findtext("used_memory"), f"memory of process {pid}"),
                )
            )
    return GpuFacts(
        gpus=tuple(gpus),
        driver_version=driver,
        cuda_version=_text(root, "cuda_version"),
        processes=tuple(processes),
    )


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """Link type per GPU pair (i < j) from `nvidia-smi topo -m`, e.g. {(0, 1): "NV18"}; NIC rows are ignored."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((n for n, line in enumerate(lines) if "GPU0" in line.split("\t")), None)
    if header_at is None:
        raise SpecdeployError("nvidia-smi topo -m output has no header row naming GPU0")
    header = [cell.strip() for cell in lines[header_at].split("\t")]
    columns = {col: int(m[1]) for col, cell in enumerate(header) if (m := _GPU_LABEL.match(cell))}
    links: dict[tuple[int, int], str] = {}
    seen: set[int] = set()
    for line in lines[header_at + 1 :]:
        cells = [cell.strip() for cell in line.split("\t")]
        row = _GPU_LABEL.match(cells[0])
        if not row:
            continue
        a = int(row[1])
        seen.add(a)
        for col, b in columns.items():
            if col >= len(cells) or not cells[col]:
                raise SpecdeployError(f"nvidia-smi topo -m row GPU{a} has no entry for GPU{b}")
            if a < b:
                links[(a, b)] = cells[col]
    if seen != set(columns.values()):
        raise SpecdeployError(
            f"nvidia-smi topo -m lists GPU columns {sorted(columns.values())} but rows {sorted(seen)}"
        )
    return links


def parse_kernel_module(version_text: str) -> KernelModule:
    """Open vs proprietary from /proc/driver/nvidia/version (its "NVRM version:" line)."""
    nvrm = next((line for line in version_text.splitlines() if line.startswith("NVRM version:")), "")
    if "Open Kernel Module" in nvrm:
        return "open"
    if "Kernel Module" in nvrm:
        return "proprietary"
    return "unknown"


def _merge_compute_caps(gpus: tuple[Gpu, ...], csv_gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    by_uuid = {gpu.uuid: gpu for gpu in csv_gpus}
    if set(by_uuid) != {gpu.uuid for gpu in gpus}:
        raise SpecdeployError(
            f"nvidia-smi -q -x lists GPUs {[g.uuid for g in gpus]} but --query-gpu lists {list(by_uuid)}",
            hint="were the two commands run on the same host at the same time?",
        )
    return tuple(
        gpu if gpu.compute_capability else replace(gpu, compute_capability=by_uuid[gpu.uuid].compute_capability)
        for gpu in gpus
    )


def collect(
    xml: str,
    topo: str,
    query_gpu: str | None = None,
    apps: str | None = None,
    driver_version_file: str | None = None,
) -> GpuFacts:
    """All facts from the raw command outputs (texts, not paths).

    `apps` (--query-compute-apps CSV), when given, replaces the XML's process list.
    `driver_version_file` is the text of /proc/driver/nvidia/version, the only source of the module flavour.
    """
    facts = parse_smi_xml(xml)
    gpus = facts.gpus
    if query_gpu is not None:
        gpus = _merge_compute_caps(gpus, parse_query_gpu_csv(query_gpu))
    processes = facts.processes if apps is None else parse_compute_apps_csv(apps, gpus)
    links = parse_topo(topo) if gpus else {}
    in_topo = {i for pair in links for i in pair}
    if not in_topo <= {gpu.index for gpu in gpus} or (len(gpus) > 1 and len(in_topo) != len(gpus)):
        raise SpecdeployError(f"nvidia-smi topo -m covers GPUs {sorted(in_topo)} but -q -x lists {len(gpus)}")
    module: KernelModule = parse_kernel_module(driver_version_file) if driver_version_file else "unknown"
    return replace(facts, gpus=gpus, processes=processes, links=links, kernel_module=module)


def facts_from_json(data: Mapping[str, Any]) -> GpuFacts:
    """The inverse of GpuFacts.to_json, for checks run on the controller against gathered facts."""

    def cc(text: str | None) -> tuple[int, int] | None:
        return _compute_cap(text, "compute_capability")

    module = data.get("kernel_module")
    return GpuFacts(
        gpus=tuple(
            Gpu(
                index=int(g["index"]),
                name=str(g["name"]),
                uuid=str(g["uuid"]),
                pci_bus_id=str(g["pci_bus_id"]),
                compute_capability=cc(g.get("compute_capability")),
                memory_total_mib=g.get("memory_total_mib"),
                memory_used_mib=g.get("memory_used_mib"),
                architecture=g.get("architecture"),
            )
            for g in data.get("gpus", [])
        ),
        driver_version=str(data["driver_version"]),
        cuda_version=data.get("cuda_version"),
        kernel_module=module if module in ("open", "proprietary") else "unknown",
        processes=tuple(
            GpuProcess(int(p["pid"]), str(p["name"]), int(p["gpu_index"]), p.get("used_mib"))
            for p in data.get("processes", [])
        ),
        links={(int(a), int(b)): str(kind) for key, kind in data.get("links", {}).items() for a, b in [key.split("-")]},
    )
