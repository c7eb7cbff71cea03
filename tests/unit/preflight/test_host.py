"""specdeploy.preflight.host: disk and serving-port refusals from what `df` and `ss` print."""

from __future__ import annotations

import subprocess

from specdeploy.preflight import host
from specdeploy.preflight.host import GIB, host_problems, parse_free, parse_ss

# The shape `ss -ltnpH` prints (as root, with processes).
SS = """LISTEN 0      4096       127.0.0.1:8000       0.0.0.0:* users:(("docker-proxy",pid=4242,fd=4))
LISTEN 0      5          127.0.0.1:8123       0.0.0.0:* users:(("python3",pid=777,fd=3))
LISTEN 0      128           [::]:22            [::]:*    users:(("sshd",pid=90,fd=4))
"""
OPTIONS = {"profile": "vllm-cuda", "model_path": "/srv/models/target", "port": 8000, "build_free_gb": "",
           "model_free_gb": 1}  # fmt: skip


def reads(**overrides):
    base = {"docker_root": "/var/lib/docker", "free": f"/var/lib/docker {100 * GIB}\n/srv/models/target {50 * GIB}",
            "image_present": False, "own_engine_publishes": True, "listeners": SS}  # fmt: skip
    return {**base, **overrides}


def test_parsers():
    listeners = parse_ss(SS)
    assert [(x.address, x.port, x.processes) for x in listeners][1] == ("127.0.0.1", 8123, (("python3", 777),))
    assert listeners[2].address == "::"
    assert parse_free("/var/lib/docker 123\n/srv x\n") == {"/var/lib/docker": 123}


def test_a_healthy_host_passes_and_our_own_engine_is_not_foreign():
    assert host_problems("gpu-1", reads(), OPTIONS) == []


def test_a_foreign_listener_is_named_with_its_pid_and_process():
    (problem,) = host_problems("gpu-1", reads(), {**OPTIONS, "port": 8123})
    assert "serving port 8123" in problem and "PID 777 (python3)" in problem and "serving_port" in problem


def test_docker_proxy_is_foreign_when_our_engine_does_not_publish_the_port():
    (problem,) = host_problems("gpu-1", reads(own_engine_publishes=False), OPTIONS)
    assert "PID 4242 (docker-proxy)" in problem


def test_a_host_network_engine_listening_itself_is_ours_only_when_its_processes_are_our_containers():
    """A multi-node engine runs on the host's network: vllm itself holds the port, as a process of
    our engine container (`docker top`); the same process outside it is foreign."""
    ss = 'LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=3757,fd=21))\n'
    assert host_problems("gpu-1", reads(listeners=ss, own_engine_publishes=False, own_pids=[1, 3757]), OPTIONS) == []
    (problem,) = host_problems("gpu-1", reads(listeners=ss, own_engine_publishes=False, own_pids=[1, 99]), OPTIONS)
    assert "PID 3757 (vllm)" in problem


def test_too_little_space_for_the_build_names_the_path_and_the_variable():
    (problem,) = host_problems("gpu-1", reads(free=f"/var/lib/docker {20 * GIB}\n/srv/models/target {50 * GIB}"),
                               OPTIONS)  # fmt: skip
    assert "20.0 GiB free under /var/lib/docker" in problem and "30 GiB needed" in problem
    assert "preflight_build_free_gb" in problem
    # An image of the profile is there: a rebuild needs only a margin.
    assert host_problems("gpu-1", reads(free=f"/var/lib/docker {20 * GIB}", image_present=True), OPTIONS) == []


def test_the_model_filesystem_and_an_explicit_threshold():
    problems = host_problems("gpu-1", reads(), {**OPTIONS, "build_free_gb": "1000", "model_free_gb": 60})
    assert len(problems) == 2 and "/srv/models/target" in problems[1] and "60 GiB needed" in problems[1]


def test_build_space_is_checked_only_when_the_build_play_runs():
    short = reads(free=f"/var/lib/docker {5 * GIB}\n/srv/models/target {50 * GIB}")
    for run_tags, skip_tags in (
        (["all"], []),
        (["engine_image"], []),
        (["preflight"], []),
        (["preflight", "engine_image"], []),
    ):
        options = {**OPTIONS, "run_tags": run_tags, "skip_tags": skip_tags}
        assert len(host_problems("gpu-1", short, options)) == 1, (run_tags, skip_tags)
    for run_tags, skip_tags in ((["preflight", "provision"], []), (["all"], ["engine_image"]), (["deploy"], [])):
        options = {**OPTIONS, "run_tags": run_tags, "skip_tags": skip_tags}
        assert host_problems("gpu-1", short, options) == [], (run_tags, skip_tags)


def test_a_docker_that_does_not_answer_is_named_with_its_bound_and_the_next_command():
    said = host.docker_unanswered("gpu-7", 20)
    assert said.startswith("gpu-7: the Docker engine did not answer `docker info` within 20 s")
    assert "nothing was changed on any host" in said and "systemctl restart docker" in said


def test_timed_out_reads_the_exits_of_the_real_timeout_command():
    # The role's argv: timeout --kill-after=5 N docker info; here with commands that end, hang, or ignore TERM.
    def exit_of(*argv: str) -> int:
        return subprocess.run(["timeout", "--kill-after=1", "1", *argv], check=False).returncode

    assert host.timed_out(exit_of("sleep", "5"))  # 124: TERM at the bound
    assert host.timed_out(exit_of("sh", "-c", "trap '' TERM; sleep 5"))  # KILL a second later (timeout's own group: -9)
    assert not host.timed_out(exit_of("true"))
    assert not host.timed_out(exit_of("no-such-command-here"))  # no Docker yet: not a hang
