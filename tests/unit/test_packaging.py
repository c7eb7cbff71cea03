"""The specdeploy wheel (what every engine image installs) ships the product and nothing of the
test bed: no test-bed host code, simulation, stand-in repository or tiny-model maker."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from specdeploy.engine_image import source

FORBIDDEN = ("testbed", "simulated", "tiny_model", "model_maker", "tests/")
SHIPPED = (
    "specdeploy/pins.yaml",
    "specdeploy/engine_image/engine.Dockerfile.j2",
    "specdeploy/watch/log_grammar.yaml",
    "specdeploy/verify/check_serving.py",
    "specdeploy/verify/conftest.py",
)


@pytest.fixture(scope="module")
def wheel_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEPLOY_STATE", str(state))
        return Path(source.specdeploy_wheel())


@pytest.fixture(scope="module")
def wheel_files(wheel_path: Path) -> list[str]:
    with zipfile.ZipFile(wheel_path) as archive:
        return archive.namelist()


def test_the_wheel_ships_the_top_level_dockerfile_template_itself(wheel_path: Path) -> None:
    """docker/ holds the engine image's template (the layout the user asked for); the package's
    link to it must ship the file, not the link."""
    with zipfile.ZipFile(wheel_path) as archive:
        shipped = archive.read("specdeploy/engine_image/engine.Dockerfile.j2")
    assert shipped == (Path(__file__).parents[2] / "docker" / "engine.Dockerfile.j2").read_bytes()


def test_the_wheel_holds_no_test_bed_or_simulation_file(wheel_files):
    offending = [name for name in wheel_files if any(word in name.lower() for word in FORBIDDEN)]
    assert offending == [], offending
    assert not any(name.startswith("specdeploy_testbed/") for name in wheel_files)


def test_the_wheel_ships_the_data_and_the_verify_checks(wheel_files):
    missing = [name for name in SHIPPED if name not in wheel_files]
    assert missing == [], missing


def test_the_package_digest_follows_the_source(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "__pycache__").mkdir()
    (package / "sub" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    monkeypatch.setattr(source, "PACKAGE_DIR", package)
    first = source.package_digest()
    (package / "sub" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"other junk")
    assert source.package_digest() == first  # bytecode is not the source
    (package / "a.py").write_text("x = 2\n")
    assert source.package_digest() != first
    assert Path(source.PACKAGE_DIR) == package
