"""GPU host verification (testinfra): what the provision phase (nvidia_driver, cuda_toolkit,
container_runtime) leaves on a host. Skipped on hosts without /usr/bin/nvidia-smi.

The expected pins are the roles' defaults with the inventory's variables over them. On the
*simulated* SM120 host of tests/integration/test_provision.py every package is a simulated stand-in
and nvidia_driver_version_file points at the simulated driver's version text.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import Any

import pytest
import yaml
from testinfra.host import Host

from specdeploy.pins import HOST as HOST_PINS

# The roles' non-version defaults these checks read (the versions come from pins.yaml).
# tests/unit/verify/test_checks.py holds these equal to the roles' defaults/main.yml.
PACKAGE_DEFAULTS = {
    "nvidia_driver_package": "",
    "nvidia_driver_open": True,
    "nvidia_driver_version_file": "/proc/driver/nvidia/version",
    "container_runtime_docker_package": "docker-ce",
    "container_runtime_cdi_spec": "/etc/cdi/nvidia.yaml",
    "container_runtime_log_max_size": "100m",
    "container_runtime_log_max_file": "3",
}


@pytest.fixture(autouse=True)
def _gpu_host_only(host: Host) -> None:
    if not host.file("/usr/bin/nvidia-smi").exists:
        pytest.skip("no /usr/bin/nvidia-smi: not a provisioned GPU host (specdeploy_provision_gpu: true)")


@pytest.fixture
def pins(hostvars: dict[str, Any]) -> dict[str, Any]:
    """The pinned versions (specdeploy/pins.yaml) and the roles' package choices, overridden by the
    host's inventory variables."""
    return {**PACKAGE_DEFAULTS, **HOST_PINS, **hostvars}


def _driver_package(pins: dict[str, Any]) -> str:
    return str(pins["nvidia_driver_package"]) or (
        f"nvidia-driver-{pins['nvidia_driver_branch']}{'-open' if pins['nvidia_driver_open'] else ''}"
    )


def _pinned_packages(pins: dict[str, Any]) -> dict[str, str]:
    """Package -> apt version or fnmatch pattern, as the roles install them."""
    driver = f"{pins['nvidia_driver_version']}-*"
    cuda = f"cuda-toolkit-{str(pins['cuda_toolkit_version']).replace('.', '-')}"
    toolkit = str(pins["container_runtime_nvidia_toolkit_version"])
    packages = {
        _driver_package(pins): driver,
        "nvidia-persistenced": driver,
        cuda: str(pins["cuda_toolkit_package_version"]),
        "nvidia-container-toolkit": toolkit,
        "nvidia-container-toolkit-base": toolkit,
        "libnvidia-container-tools": toolkit,
        "libnvidia-container1": toolkit,
    }
    docker = str(pins["container_runtime_docker_package"])
    packages[docker] = str(pins["container_runtime_docker_version"])
    if docker == "docker-ce":
        packages["docker-ce-cli"] = packages[docker]
        packages["containerd.io"] = str(pins["container_runtime_containerd_version"])
    return packages


def test_packages_are_installed_at_the_pinned_versions(host: Host, pins: dict[str, Any]) -> None:
    wrong = {}
    for name, pattern in _pinned_packages(pins).items():
        package = host.package(name)
        if not package.is_installed:
            wrong[name] = f"not installed (pinned {pattern})"
        elif not fnmatchcase(package.version, pattern):
            wrong[name] = f"{package.version} installed, pinned {pattern}"
    assert not wrong, wrong


def test_pinned_packages_are_held(host: Host, pins: dict[str, Any]) -> None:
    names = sorted(_pinned_packages(pins))
    if not pins.get("container_runtime_hold", True):
        names = [n for n in names if n.startswith(("nvidia", "cuda", "libnvidia"))]
    out = host.check_output("dpkg --get-selections " + " ".join(names))
    selections = dict(line.split() for line in out.splitlines() if line.strip())
    not_held = {name: selections.get(name, "absent") for name in names if selections.get(name) != "hold"}
    assert not not_held, f"not held against upgrades: {not_held}"


def test_the_open_kernel_module_is_the_one_reported(host: Host, pins: dict[str, Any]) -> None:
    text = host.file(str(pins["nvidia_driver_version_file"])).content_string
    assert "Open Kernel Module" in text, f"{pins['nvidia_driver_version_file']}: {text.strip()}"
    assert str(pins["nvidia_driver_version"]) in text


def test_nvidia_smi_answers_with_the_pinned_driver(host: Host, pins: dict[str, Any]) -> None:
    out = host.check_output("nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version --format=csv,noheader")
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    assert rows, "nvidia-smi lists no GPU"
    assert {row[4] for row in rows} == {str(pins["nvidia_driver_version"])}
    expected = int(pins.get("nvidia_driver_expected_gpus", 0))
    if expected:
        assert len(rows) == expected


def test_daemon_json_has_the_nvidia_runtime_log_rotation_and_cdi(host: Host, pins: dict[str, Any]) -> None:
    config = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert config.get("runtimes", {}).get("nvidia", {}).get("path") == "nvidia-container-runtime", config
    assert config.get("log-driver") == "json-file", config
    rotation = {key: config.get("log-opts", {}).get(key) for key in ("max-size", "max-file")}
    assert rotation == {
        "max-size": str(pins["container_runtime_log_max_size"]),
        "max-file": str(pins["container_runtime_log_max_file"]),
    }, config
    assert config.get("features", {}).get("cdi") is True, config
    assert config.get("live-restore") is True, config  # engines outlive a dockerd restart


def test_docker_runs_with_the_nvidia_runtime(host: Host) -> None:
    assert host.service("docker").is_running
    info = host.run("docker info")
    assert info.rc == 0, info.stderr
    runtimes = next((line for line in info.stdout.splitlines() if "Runtimes:" in line), "")
    assert "nvidia" in runtimes.split(), runtimes


def test_cdi_spec_lists_all_gpus(host: Host, pins: dict[str, Any]) -> None:
    spec_file = host.file(str(pins["container_runtime_cdi_spec"]))
    assert spec_file.exists
    spec = yaml.safe_load(spec_file.content_string)
    names = {str(device["name"]) for device in spec.get("devices", [])}
    assert spec.get("kind") == "nvidia.com/gpu" and "all" in names, f"nvidia.com/gpu=all is not in {names}"


def test_persistence_daemon_runs(host: Host) -> None:
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running


def test_nouveau_is_blacklisted(host: Host) -> None:
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.exists
    assert "blacklist nouveau" in conf.content_string.splitlines()


def test_nvcc_of_the_pinned_cuda_builds_for_sm120(host: Host, pins: dict[str, Any]) -> None:
    nvcc = f"/usr/local/cuda-{pins['cuda_toolkit_version']}/bin/nvcc"
    assert host.file(nvcc).is_executable
    build = host.run(
        "d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT"
        " && printf '__global__ void k(int *o) { o[0] = 1; }\\nint main() { return 0; }\\n' > \"$d/k.cu\""
        f' && {nvcc} -arch=sm_120 -o "$d/k" "$d/k.cu" && "$d/k"'
    )
    assert build.rc == 0, build.stderr
