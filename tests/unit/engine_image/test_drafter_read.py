"""The drafter read in one round trip: the real script run by sh here, parsed, and checked."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from specdeploy.engine_image import drafter

MLA = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": 64, "vocab_size": 512,
       "target_hidden_size": 64, "num_hidden_layers": 1}  # fmt: skip


def _run(path, target="", user=None):
    cmd = ["sh", "-c", drafter.READ_SCRIPT, "sh", str(path), str(target)]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return drafter.parse_read(proc.stdout)


def _drafter(folder, manifest=True):
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(MLA))
    (folder / "sub" / "model.safetensors").write_bytes(b"weights")
    if manifest:
        lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(folder)}"
                 for p in sorted(folder.rglob("*")) if p.is_file()]  # fmt: skip
        (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def test_the_script_reads_hashes_and_documents(tmp_path):
    _drafter(tmp_path / "d")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 64, "vocab_size": 512}}))
    read = _run(tmp_path / "d", tmp_path / "t")
    assert read.exists and read.unreadable == []
    assert read.files_sha256["sub/model.safetensors"] == hashlib.sha256(b"weights").hexdigest()
    assert json.loads(read.documents["config.json"]) == MLA
    assert "target" in read.documents and "SHA256SUMS" in read.documents
    assert drafter.check_on_host(read, "/d", "deploy", ("vllm", "0.32.0")) == []
    assert drafter.check_on_host(read, "/d", "deploy", ("vllm", "0.17.1"))  # MLA needs >= 0.18


def test_a_missing_folder_and_a_missing_manifest_are_named(tmp_path):
    missing = _run(tmp_path / "nowhere")
    assert drafter.check_on_host(missing, "/nowhere", "deploy", None) == [
        "/nowhere is not a folder on the host: set engine_image_drafter_path"
    ]
    _drafter(tmp_path / "d", manifest=False)
    found = drafter.check_on_host(_run(tmp_path / "d"), "/d", "deploy", None)
    assert any("no SHA256SUMS manifest" in f for f in found), found


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to read as nobody")
def test_a_file_the_ssh_user_cannot_read_is_refused_with_the_fix():
    # pytest's tmp_path lies under a 0700 folder that nobody cannot enter.
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        _unreadable_case(Path(tmp))


def _unreadable_case(tmp_path):
    _drafter(tmp_path / "d")
    tmp_path.chmod(0o755)
    (tmp_path / "d").chmod(0o755)
    (tmp_path / "d" / "sub").chmod(0o755)
    (tmp_path / "d" / "sub" / "model.safetensors").chmod(0o600)
    read = _run(tmp_path / "d", user="nobody")
    assert read.unreadable == ["sub/model.safetensors"], read
    found = drafter.check_on_host(read, str(tmp_path / "d"), "nobody", None)
    assert found == [f"cannot read sub/model.safetensors as nobody: make the drafter's files readable "
                     f"(chmod -R a+rX {tmp_path / 'd'})"]  # fmt: skip
