"""Which compilers run in the engine's processes (watch.sources): read from /proc for a host process,
from the container's own /proc through an exec for a container."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from specdeploy.watch.sources import ContainerSource, ProcessSource, kernel_builders


def test_only_compilers_count_each_once():
    assert kernel_builders(["python3\n", "ninja\n", "nvcc", "nvcc", "sglang::schedul", "cc1plus"]) == [
        "cc1plus", "ninja", "nvcc"]  # fmt: skip
    assert kernel_builders(["python3", "VLLM::EngineCor", "nccl"]) == []


def test_a_host_process_tree_building_kernels(tmp_path: Path):
    """A real child named like SGLang's build driver (a copy of sleep called ninja) under a real parent."""
    ninja = tmp_path / "ninja"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", ninja)
    parent = subprocess.Popen(["sh", "-c", f"{ninja} 30; true"])
    try:
        source = ProcessSource(parent.pid, tmp_path / "engine.log", popen=parent)
        for _ in range(100):  # the child's exec lands a moment after the fork
            if source.kernel_builds():
                break
            time.sleep(0.05)
        assert source.kernel_builds() == ["ninja"]
    finally:
        parent.kill()
        subprocess.run(["pkill", "-f", str(ninja)], check=False)
        parent.wait()
    idle = subprocess.Popen(["sh", "-c", "sleep 30; true"])
    try:
        assert ProcessSource(idle.pid, tmp_path / "engine.log", popen=idle).kernel_builds() == []
    finally:
        idle.kill()
        idle.wait()


class Container:
    name = "engine"

    def __init__(self, comm: bytes) -> None:
        self.comm, self.commands, self.attrs = comm, [], {}

    def exec_run(self, cmd: list[str]) -> tuple[int, bytes]:
        self.commands.append(cmd)
        return 1, self.comm  # a process gone between the glob and the read: cat exits 1, the rest is read


def test_a_container_building_kernels_is_read_from_its_own_proc():
    container = Container(b"python3\nsglang::schedul\nninja\nnvcc\ncicc\n")
    assert ContainerSource(container).kernel_builds() == ["cicc", "ninja", "nvcc"]
    assert "/proc/[0-9]*/comm" in container.commands[0][-1]
    assert ContainerSource(Container(b"python3\nVLLM::EngineCor\n")).kernel_builds() == []
