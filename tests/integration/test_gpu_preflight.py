"""Preflight's GPU checks over real SSH on a test host whose `nvidia-smi` is *simulated*: a replayer
of the real h200-x2-busy capture (a stale process, PID 566, holds memory on both GPUs), and of
simulated 8x RTX PRO 6000 Blackwell output derived from the real captures."""

from __future__ import annotations

import io
import tarfile

import pytest

from specdeploy_testbed import simulated_gpu as simulated

from .helpers import specdeploy, tb_args

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not simulated.capture_dir().is_dir(), reason="real nvidia-smi captures not found"),
]
DATA = "/opt/simulated-nvidia-smi"
# The real capture's files, under the names the replayer reads.
BUSY = {"nvidia-smi-q.xml": "nvidia-smi-q-x2-busy.xml", "topo.txt": "topo-x2.txt",
        "query-gpu.csv": "query-gpu-x2-busy.csv", "query-apps.csv": "query-apps-x2-busy.csv",
        "plain.txt": "plain-x2-busy.txt"}  # fmt: skip


def install_simulated_smi(container, files: dict[str, str]) -> None:
    payload = {**files, "nvidia-smi": simulated.replayer_script(DATA)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in payload.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    container.exec_run(["mkdir", "-p", DATA])
    assert container.put_archive(DATA, buf.getvalue())
    container.exec_run(["ln", "-sf", f"{DATA}/nvidia-smi", "/usr/local/bin/nvidia-smi"])


def preflight(host, *extra: str):
    return specdeploy("deploy", "--host", str(host.target), *tb_args(), "--tags", "preflight", *extra)


@pytest.fixture
def host_container(throwaway_host, docker_client):
    from specdeploy import testbed  # noqa: PLC0415

    return throwaway_host, docker_client.containers.get(testbed.container_name(throwaway_host.name))


def test_stale_process_on_the_real_busy_capture_fails_preflight(host_container):
    host, container = host_container
    captures = simulated.capture_dir() / "h200-x2-busy"
    install_simulated_smi(container, {ours: (captures / theirs).read_text() for ours, theirs in BUSY.items()})
    result = preflight(host)
    assert result.returncode != 0, result.output[-3000:]
    message = " ".join(result.output.split())
    assert "PID 566 (python3) holds 10758 MiB on GPU 0, 10758 MiB on GPU 1" in message, result.output[-3000:]
    assert "Refuse foreign processes holding GPU memory" in result.output


def test_simulated_blackwell_host_passes_and_gets_the_pcie_advice_then_an_old_branch_fails(host_container):
    host, container = host_container
    install_simulated_smi(container, simulated.render_all(8))
    ok = preflight(host, "-e", "serving_tensor_parallel_size=8")
    assert ok.returncode == 0, ok.output[-3000:]
    assert "NVIDIA RTX PRO 6000 Blackwell" in ok.output and "NCCL_P2P_DISABLE" in ok.output, ok.output[-3000:]

    too_many = preflight(host, "-e", "serving_tensor_parallel_size=16")
    assert too_many.returncode != 0 and "16" in too_many.output

    install_simulated_smi(container, simulated.render_all(8, driver_version="550.54.15"))
    old = preflight(host, "-e", "serving_tensor_parallel_size=8")
    assert old.returncode != 0, old.output[-3000:]
    assert "nvidia-driver-580-open" in " ".join(old.output.split()), old.output[-3000:]
