from __future__ import annotations

import pytest

from specdeploy.cli import main


@pytest.mark.parametrize("host", ["bad host", "user@host:70000", "x@"])
def test_bad_host_is_a_clear_error_before_any_connection(host, capsys, monkeypatch):
    def no_ssh(*_args, **_kwargs):
        raise AssertionError("ssh must not run for invalid input")

    monkeypatch.setattr("specdeploy.targets.subprocess.run", no_ssh)
    assert main(["deploy", "--host", host]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_missing_key_file_is_rejected_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(["deploy", "--host", "deploy@127.0.0.1", "--ssh-key", "/nonexistent/id"])
    assert info.value.code == 2
    assert "no such file" in capsys.readouterr().err


def test_monitor_refuses_an_inventory_beside_a_host_before_any_connection(tmp_path, capsys, monkeypatch):
    def no_ssh(*_args, **_kwargs):
        raise AssertionError("ssh must not run for conflicting input")

    monkeypatch.setattr("specdeploy.targets.subprocess.run", no_ssh)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu-1: {}\n")
    assert main(["monitor", "--host", "deploy@127.0.0.1", "--inventory", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert "give --inventory or --host, not both" in err and "Traceback" not in err
