from __future__ import annotations

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.targets import SshSettings, Target, diagnose_ssh_failure


@pytest.mark.parametrize(
    ("spec", "host", "user", "port"),
    [
        ("gpu-node-1", "gpu-node-1", None, 22),
        ("deploy@10.0.0.5", "10.0.0.5", "deploy", 22),
        ("deploy@127.0.0.1:2221", "127.0.0.1", "deploy", 2221),
        ("ops@[::1]:2200", "::1", "ops", 2200),
        ("  admin@host.example.com  ", "host.example.com", "admin", 22),
    ],
)
def test_parse_accepts_targets(spec, host, user, port):
    assert Target.parse(spec) == Target(host=host, user=user, port=port)


@pytest.mark.parametrize("spec", ["", "user@", "@host", "a b", "host:99999", "host:0", "Root!@h", "h;rm -rf /"])
def test_parse_rejects_bad_input_with_a_hint(spec):
    with pytest.raises(SpecdeployError) as info:
        Target.parse(spec)
    assert repr(spec) in info.value.message or "port" in info.value.message


def test_str_round_trips_through_parse():
    for spec in ("deploy@127.0.0.1:2221", "ops@[::1]:22"):
        target = Target.parse(spec)
        assert Target.parse(str(target)) == target


def test_ssh_options_always_verify_host_keys(tmp_path):
    kh = tmp_path / "known_hosts"
    opts = " ".join(SshSettings(known_hosts=(kh,), identity_file=tmp_path / "id").options())
    assert "StrictHostKeyChecking=yes" in opts
    assert f"UserKnownHostsFile={kh}" in opts
    assert "IdentitiesOnly=yes" in opts
    assert "StrictHostKeyChecking=yes" in " ".join(SshSettings().options())


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("ssh: connect to host 10.1.1.1 port 22: Connection refused", "connection refused"),
        ("ssh: connect to host 10.1.1.1 port 22: Connection timed out", "timed out"),
        ("deploy@10.1.1.1: Permission denied (publickey).", "refused"),
        (
            "No ED25519 host key is known for [h]:22 and you have requested strict checking.\n"
            "Host key verification failed.",
            "not in known_hosts",
        ),
        ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "CHANGED"),
        ("ssh: Could not resolve hostname nope: Name or service not known", "cannot resolve"),
        ("kex_exchange_identification: read: Connection reset by peer", "kex_exchange_identification"),
    ],
)
def test_diagnosis_names_the_cause(stderr, expected):
    error = diagnose_ssh_failure(Target.parse("deploy@10.1.1.1"), stderr)
    assert expected in error.message
