"""The provision phase (nvidia_driver, cuda_toolkit, container_runtime) on a *simulated* SM120 host.

The host is a fresh test-bed host (Debian 12, systemd, its own dockerd, real SSH) named
simulated-sm120. It has no GPU: the packages come from the local apt repository of simulated
stand-ins (specdeploy_testbed.simulated_repo), whose nvidia-smi replays simulated output for
8x RTX PRO 6000 Blackwell, whose nvcc "compiles" only known architectures, and whose nvidia-ctk
merges daemon.json like the real one. The roles, apt, dpkg holds, systemd, dockerd restarts and
daemon.json merging are all real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from docker.models.containers import Container

from specdeploy import inventory, verify
from specdeploy.connection import HostConnection
from specdeploy.docker_engine import ensure_engine
from specdeploy.paths import state_dir
from specdeploy.playbook import PlaybookRun, run_playbook
from specdeploy.serve.hosts import inventory_hostvars
from specdeploy_testbed import simulated_repo, testbed

from .helpers import record_timing

pytestmark = pytest.mark.integration

HOST = "simulated-sm120"
PLAYBOOK = "tests/integration/playbooks/provision_simulated.yml"
# A daemon.json already on the host, with keys the roles do not manage: they must survive.
FOREIGN_DAEMON_JSON = {"max-concurrent-downloads": 4, "log-opts": {"labels": "io.specdeploy.simulated"}}


@dataclass(frozen=True)
class SimulatedHost:
    host: testbed.TestHost
    container: Container

    def sh(self, script: str) -> str:
        """Run a shell script as root through the engine (not over SSH); its output."""
        code, out = self.container.exec_run(["sh", "-c", script])
        assert code == 0, f"{script}: {out.decode()}"
        return str(out.decode())


@pytest.fixture(scope="module")
def simulated_sm120() -> Iterator[SimulatedHost]:
    """A fresh simulated SM120 host on port_base + 20, removed (with its engine volume) afterwards.

    Only the Docker engine is needed, not the local test bed's own host.
    """
    client = ensure_engine(state_dir())
    testbed.remove_host(client, HOST, purge=True)  # fresh: the first run must install everything
    host = testbed.start_host(client, HOST, testbed.port_base() + 20)
    testbed.add_known_host(host)
    simulated = SimulatedHost(host, client.containers.get(testbed.container_name(HOST)))
    simulated.sh(f"printf '%s' '{json.dumps(FOREIGN_DAEMON_JSON)}' > /etc/docker/daemon.json")
    yield simulated
    testbed.remove_host(client, HOST, purge=True)
    known_hosts = testbed.paths().known_hosts
    prefix = f"[127.0.0.1]:{host.port} "
    kept = [line for line in known_hosts.read_text().splitlines(keepends=True) if not line.startswith(prefix)]
    inventory.write(known_hosts, "".join(kept))


@pytest.fixture(scope="module")
def simulated_inventory(simulated_sm120: SimulatedHost, tmp_path_factory: pytest.TempPathFactory) -> Path:
    start = time.monotonic()
    repo = str(simulated_repo.ensure_repo())
    record_timing("simulated apt repository (build or cache)", time.monotonic() - start)
    docker_version = simulated_sm120.sh("dpkg-query -W -f='${Version}' docker.io")
    text = inventory.render(
        [inventory.InventoryHost(HOST, simulated_sm120.host.target)],
        testbed.paths().ssh(),
        group="simulated_sm120",
        source=__name__,
    )
    doc = yaml.safe_load(text)
    doc["all"]["children"]["simulated_sm120"]["vars"] |= {
        "ansible_python_interpreter": "/usr/bin/python3",
        "specdeploy_provision_gpu": True,
        # Every package comes from the simulated stand-in repository built on the controller, which
        # the test-only role setup_simulated_apt makes the host's apt source (PLAYBOOK).
        "setup_simulated_apt_repo": repo,
        "nvidia_driver_apt_source": "preconfigured",
        "cuda_toolkit_apt_source": "preconfigured",
        "container_runtime_apt_source": "preconfigured",
        # A container has no headers for the controller's kernel, and cannot reboot itself.
        "nvidia_driver_install_headers": False,
        "nvidia_driver_reboot": False,
        # RTX PRO 6000 Blackwell before any driver answers; the simulated nvidia-smi says 12.0 after.
        "nvidia_driver_compute_capability": "12.0",
        "nvidia_driver_expected_gpus": simulated_repo.GPU_COUNT,
        # No kernel module, so no /proc/driver/nvidia/version: the simulated driver ships its text.
        "nvidia_driver_version_file": f"{simulated_repo.SIMULATED_DIR}/driver-version",
        # The test-bed host runs Debian's docker.io: keep it (pinned at what is installed), do not swap engines.
        "container_runtime_docker_package": "docker.io",
        "container_runtime_docker_version": docker_version,
    }
    path = tmp_path_factory.mktemp("simulated-sm120") / "hosts.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _timed(label: str, inv: Path, *args: str) -> PlaybookRun:
    start = time.monotonic()
    run = run_playbook(inv, *args, playbook=PLAYBOOK)
    record_timing(label, time.monotonic() - start)
    return run


@pytest.fixture(scope="module")
def first_run(simulated_inventory: Path) -> PlaybookRun:
    return _timed("provision, first run (simulated SM120)", simulated_inventory, "--tags", "preflight,provision")


def test_first_run_provisions_the_simulated_host(first_run, simulated_sm120):
    assert first_run.returncode == 0, first_run.output[-4000:]
    assert first_run.recap[HOST]["failed"] == 0
    assert first_run.changed > 0
    assert "simulated sm_120 kernel ran" in first_run.output  # nvcc -arch=sm_120 built it and it ran
    assert f"{simulated_repo.GPU_COUNT} GPU(s) answer" in first_run.output
    assert "RUNNING HANDLER [container_runtime : Restart docker]" in first_run.output
    # Merged, never clobbered: the keys that were there survive next to ours and nvidia-ctk's.
    config = json.loads(simulated_sm120.sh("cat /etc/docker/daemon.json"))
    assert config["max-concurrent-downloads"] == 4, config
    assert config["log-opts"] == {"labels": "io.specdeploy.simulated", "max-size": "100m", "max-file": "3"}, config
    assert "nvidia" in config["runtimes"] and config["features"] == {"cdi": True}, config
    assert config["live-restore"] is True, config  # engines outlive a dockerd restart


def test_second_run_changes_nothing(first_run, simulated_inventory):
    assert first_run.returncode == 0, "the first run failed"
    again = _timed("provision, second run (converged)", simulated_inventory, "--tags", "preflight,provision")
    assert again.returncode == 0, again.output[-4000:]
    assert again.changed == 0, [line for line in again.output.splitlines() if line.startswith("changed:")]
    assert "Restart docker" not in again.output  # no daemon.json flip-flop, so no restart


def test_testinfra_verifies_the_gpu_host(first_run, simulated_inventory):
    assert first_run.returncode == 0, "the first run failed"
    start = time.monotonic()
    hosts = [verify.HostUnderCheck(name, HostConnection.from_hostvars(hv), hv)
             for name, hv in inventory_hostvars(simulated_inventory).items()]  # fmt: skip
    proc = verify.run(hosts, capture=True, checks=("check_gpu_host.py",))
    record_timing("testinfra specdeploy/verify/check_gpu_host.py", time.monotonic() - start)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert " passed" in output and "skipped" not in output, output[-2000:]


FIX = ("nvidia_driver_branch: 580", "nvidia_driver_open: true")


@pytest.mark.parametrize(
    ("extra_vars", "needles"),
    [
        pytest.param(
            {"nvidia_driver_open": False},
            ["need the NVIDIA open kernel modules", "requires use of the NVIDIA open kernel modules", *FIX],
            id="proprietary-module",
        ),
        pytest.param(
            {"nvidia_driver_package": "nvidia-driver-580"},
            ["need an open-module package, but nvidia_driver_package is nvidia-driver-580", *FIX],
            id="proprietary-package",
        ),
        pytest.param(
            {"nvidia_driver_branch": 550, "nvidia_driver_version": simulated_repo.OLD_DRIVER_VERSION},
            ["need driver branch R570 or newer (R580 recommended), but nvidia_driver_branch is 550", *FIX],
            id="branch-too-old",
        ),
    ],
)
def test_a_driver_that_cannot_drive_sm120_is_refused_before_any_change(
    first_run, simulated_inventory, extra_vars, needles
):
    assert first_run.returncode == 0, "the first run failed"
    run = run_playbook(simulated_inventory, "--tags", "provision", "-e", json.dumps(extra_vars), playbook=PLAYBOOK)
    assert run.returncode != 0, run.output[-3000:]
    assert "Refuse a driver that cannot drive these GPUs" in run.output
    assert run.recap[HOST]["failed"] == 1 and run.changed == 0, run.recap
    for needle in needles:
        assert needle in run.output, f"{needle!r} not in:\n{run.output[-3000:]}"
    assert "Install the pinned driver" not in run.output  # stopped before anything was installed


def test_bad_variables_are_rejected_by_the_argument_spec_before_any_task(first_run, simulated_inventory):
    assert first_run.returncode == 0, "the first run failed"
    bad = {"nvidia_driver_branch": 999, "nvidia_driver_reboot": "sometimes"}
    run = run_playbook(simulated_inventory, "--tags", "provision", "-e", json.dumps(bad), playbook=PLAYBOOK)
    assert run.returncode != 0
    validation = "TASK [nvidia_driver : Validating arguments against arg spec 'main'"
    assert validation in run.output, run.output[-3000:]
    after = run.output[run.output.index(validation) :]
    assert "fatal:" in after.split("TASK [")[1], after[:3000]  # the validation task itself failed
    assert "nvidia_driver_branch" in after and "999" in after, after[:3000]
    assert "nvidia_driver_reboot" in after and "sometimes" in after, after[:3000]
    assert "Ask nvidia-smi for the GPUs" not in run.output  # no role task ran
    assert run.recap[HOST]["failed"] == 1 and run.changed == 0, run.recap


def test_simulated_repo_cli_builds_an_indexed_repository(tmp_path):
    out = tmp_path / "repo"
    proc = subprocess.run(
        [sys.executable, "-m", "specdeploy_testbed.simulated_repo", "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    index = (out / "Packages").read_text()
    for pkg in simulated_repo.packages():
        assert f"Package: {pkg.name}\nVersion: {pkg.version}\n" in index
        assert (out / pkg.filename).is_file()
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(out / "nvidia-driver-580-open_580.95.05-1_amd64.deb")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "./usr/bin/nvidia-smi" in listing and "specdeploy-simulated/driver-version" in listing
