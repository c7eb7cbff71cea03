"""Host verification (`make verify`): testinfra over real SSH, host keys checked.

Run through `specdeploy verify`, which passes --hosts/--ansible-inventory for the target.
"""

from __future__ import annotations

from testinfra.host import Host

from specdeploy.preflight.platforms import MIN_TARGET_PYTHON, SUPPORTED_RELEASES


def test_os_release_is_supported(host: Host) -> None:
    info = host.system_info
    by_id = {name.lower(): versions for name, versions in SUPPORTED_RELEASES.items()}
    assert info.distribution in by_id, f"{info.distribution} is not one of {sorted(by_id)}"
    assert info.release.split(".")[0] in by_id[info.distribution] or info.release in by_id[info.distribution]


def test_python3_is_new_enough(host: Host) -> None:
    out = host.check_output("python3 -c 'import sys; print(*sys.version_info[:2])'")
    assert tuple(int(p) for p in out.split()) >= MIN_TARGET_PYTHON


def test_sshd_runs_and_listens(host: Host) -> None:
    assert host.service("ssh").is_running
    assert host.socket("tcp://0.0.0.0:22").is_listening or host.socket("tcp://:::22").is_listening


def test_container_engine_answers(host: Host) -> None:
    assert host.service("docker").is_running
    version = host.run("docker version --format '{{.Server.Version}}'")
    assert version.rc == 0, f"the SSH user cannot use the container engine: {version.stderr.strip()}"
    assert version.stdout.strip()


def test_ssh_user_can_escalate(host: Host) -> None:
    # Provisioning needs root; a password prompt would hang Ansible.
    assert host.run("sudo -n true").rc == 0
