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
    # These hosts never build, and the GPU checks are the subject: the build's disk rule (its own unit
    # and fault tests) would judge the machine running the tests instead (CI had 10.2 GiB free).
    return specdeploy("deploy", "--host", str(host.target), *tb_args(), "--tags", "preflight",
                      "-e", "preflight_build_free_gb=0", *extra)  # fmt: skip


@pytest.fixture
def host_container(throwaway_host, docker_client):
    from specdeploy_testbed import testbed  # noqa: PLC0415

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


def _engine_report(output: str) -> str:
    """The serving check's report (the engine's command line and its NCCL environment)."""
    _, _, tail = output.partition("TASK [serving : Report the engine's command line and the GPU peer-to-peer verdict]")
    assert tail, output[-3000:]
    return tail.split("TASK [", 1)[0].split("PLAY [", 1)[0]


def test_the_p2p_verdict_follows_iommu_pt_from_preflight_to_the_engine_arguments(host_container):
    """One rule (specdeploy.gpu.checks), end to end: preflight reads /proc/cmdline, publishes its
    verdict, and the engine arguments the serving role renders follow it."""
    host, container = host_container
    install_simulated_smi(container, simulated.render_all(8))
    translated = preflight(host, "-e", "serving_tensor_parallel_size=8")
    assert translated.returncode == 0, translated.output[-3000:]
    report = _engine_report(translated.output)
    assert "--disable-custom-all-reduce" in report and "NCCL_P2P_DISABLE" in report, report
    assert "IOMMU/ACS is not set up for peer-to-peer" in " ".join(report.split()), report

    # The same host booted with iommu=pt: a bind mount puts that kernel command line in /proc.
    cmdline = "BOOT_IMAGE=/boot/vmlinuz-6.1.0 root=/dev/sda1 ro intel_iommu=on iommu=pt\n"
    code, out = container.exec_run(
        ["sh", "-c", f"printf '{cmdline}' > /run/cmdline && mount --bind /run/cmdline /proc/cmdline"]
    )
    assert code == 0, out.decode()
    try:
        passthrough = preflight(host, "-e", "serving_tensor_parallel_size=8")
    finally:
        container.exec_run(["umount", "/proc/cmdline"])
    assert passthrough.returncode == 0, passthrough.output[-3000:]
    report = _engine_report(passthrough.output)
    assert "--disable-custom-all-reduce" not in report and "NCCL_P2P_DISABLE" not in report, report
    assert "IOMMU is in pass-through or off; PCIe peer-to-peer can stay on" in " ".join(report.split()), report


def put_folder(container, folder, at: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=".")
    container.exec_run(["mkdir", "-p", at])
    assert container.put_archive(at, buf.getvalue())


def test_kimi_k25_int4_on_8_rtx_pro_6000_at_its_full_length_is_refused_before_any_load(host_container, tmp_path):
    """issue 36: the user's model on the user's box. Kimi-K2.5's own config.json and its safetensors headers
    (all 384 experts a layer, as the checkpoint ships them, header-only files: the read takes the headers
    and never the weights) on a host whose nvidia-smi is the simulated 8x RTX PRO 6000 Blackwell. At its
    config's full 262,144 tokens, TP 8 and a bf16 KV cache, one sequence does not fit beside 72 GiB of
    weights a GPU: preflight refuses it with the figures and the variable, before anything is built or
    loaded; at 32,768 it passes."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from specdeploy_testbed import kimi_headers  # noqa: PLC0415

    host, container = host_container
    install_simulated_smi(container, simulated.render_all(8))
    config = json.loads((Path(__file__).parents[1] / "data" / "kimi_k25" / "config.json").read_text())
    put_folder(container, kimi_headers.write_form(tmp_path / "kimi", kimi_headers.target(61, 384), config),
               "/models/kimi-k25")  # fmt: skip
    user = ("-e", "serving_tensor_parallel_size=8", "-e", "engine_image_profile=vllm-cuda",
            "-e", "serving_model_path=/models/kimi-k25", "-e", "serving_speculative_method=none")  # fmt: skip
    refused = preflight(host, *user, "-e", "serving_max_model_len=262144")
    message = " ".join(refused.output.split())
    assert refused.returncode != 0, refused.output[-3000:]
    assert "the model does not fit: serving_max_model_len=262144: the KV cache holds" in message, message[-3000:]
    assert "lower serving_max_model_len" in message and "PLAY [Build" not in refused.output
    fits = preflight(host, *user, "-e", "serving_max_model_len=32768")
    assert fits.returncode == 0, fits.output[-3000:]
    assert "Refuse a KV cache that cannot hold one serving_max_model_len sequence" in fits.output
