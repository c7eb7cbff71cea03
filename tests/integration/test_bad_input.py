"""Bad input gets one clear sentence and a hint, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig

import pytest

from specdeploy_testbed import testbed

from .helpers import ROOT, assert_clear_error, free_port, specdeploy, tb_args

pytestmark = pytest.mark.integration


def test_unreachable_host(testbed_up):
    result = specdeploy("deploy", "--host", f"deploy@127.0.0.1:{free_port()}", *tb_args())
    assert_clear_error(result, "unreachable: connection refused")
    assert "PLAY" not in result.output  # stopped before Ansible touched anything


def test_wrong_ssh_user(testbed_up):
    port = testbed.port_base()
    result = specdeploy("deploy", "--host", f"nosuchuser@127.0.0.1:{port}", *tb_args())
    assert_clear_error(result, "SSH login as 'nosuchuser' was refused", "hint:")


def test_unknown_host_key_is_refused_not_trusted(testbed_up, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    port = testbed.port_base()
    key = str(testbed.paths().key)
    result = specdeploy("deploy", "--host", f"deploy@127.0.0.1:{port}", "--ssh-key", key, "--known-hosts", str(empty))
    assert_clear_error(result, "is not in known_hosts", "ssh-keyscan")
    assert empty.read_text() == ""  # nothing was learned on first use


def test_unsupported_os_on_the_target(throwaway_host, docker_client):
    # A real host whose release says Ubuntu 20.04: Ansible's own fact gathering must see it.
    container = docker_client.containers.get(testbed.container_name(throwaway_host.name))
    release = 'NAME="Ubuntu"\nVERSION_ID="20.04"\nID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=focal\n'
    code, out = container.exec_run(["sh", "-c", f"rm -f /etc/os-release && printf '{release}' > /etc/os-release"])
    assert code == 0, out
    result = specdeploy("deploy", "--host", str(throwaway_host.target), *tb_args())
    assert_clear_error(result, "unsupported OS Ubuntu 20.04", "Use a supported release")
    assert "deploy failed" in result.output


def test_missing_docker_permission_on_the_controller(testbed_up):
    # A user outside the docker group: the engine socket refuses it. Debian's python3 runs
    # this venv's packages, since the venv's interpreter may sit under root's home.
    env = {
        "PATH": "/usr/bin:/bin",
        # The test bed's package too: PYTHONPATH folders get no .pth (editable install) processing.
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "testbed"), sysconfig.get_paths()["purelib"]]),
        "HOME": "/tmp",
    }
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-m",
            "specdeploy.cli",
            "testbed",
            "up",
        ],
        cwd="/tmp",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "no permission to use the Docker engine" in output and "docker' group" in output, output
    assert "Traceback" not in output
    assert sys.version_info >= (3, 11)


def test_api_off_loopback_without_a_key_is_refused_before_any_build(testbed_up):
    result = specdeploy("deploy", "-e", "serving_bind_address=0.0.0.0")
    assert_clear_error(result, "binds 0.0.0.0, off loopback, without an API key", "ansible-vault encrypt_string")
    assert "PLAY [Build" not in result.output and "TASK [engine_image" not in result.output


def test_bad_serving_variables_are_rejected_by_the_argument_spec(testbed_up):
    wrong_type = specdeploy("deploy", "-e", "serving_tensor_parallel_size=eight")
    assert_clear_error(wrong_type, "Validation of arguments failed", "\"'eight'\" cannot be converted to an int")
    unknown = specdeploy("deploy", "-e", "serving_gpus=all")
    assert_clear_error(unknown, "Validating arguments against arg spec 'check'", "serving_gpus", "cdi")
    for result in (wrong_type, unknown):
        assert "PLAY [Build" not in result.output and "changed=0" in result.output


def test_a_loader_the_cpu_build_cannot_run_is_refused_before_any_build(testbed_up):
    """vLLM takes any --load-format string and fails only when the weights load; on the test bed's
    CPU build fastsafetensors would die on `cuda:cpu`. Refused in the preflight play instead."""
    gpu_only = specdeploy("deploy", "-e", "serving_load_format=fastsafetensors")
    assert_clear_error(gpu_only, "serving_load_format='fastsafetensors' needs GPUs", "serving_gpus is none")
    unknown = specdeploy("deploy", "-e", "serving_load_format=runai")
    assert_clear_error(unknown, "serving_load_format='runai': must be empty (the engine's default) or one of auto")
    for result in (gpu_only, unknown):
        assert "PLAY [Build" not in result.output and "TASK [engine_image" not in result.output


def test_a_length_beyond_the_models_config_is_refused_before_any_build(testbed_up):
    """issue 36: serving_max_model_len=99999 on the test bed's model failed at start-up, 24.5 s in; the
    preflight play reads the model's config.json on the host and refuses it, naming the variable."""
    result = specdeploy("deploy", "-e", "serving_max_model_len=99999")
    assert_clear_error(result, "serving_max_model_len=99999: beyond the model's max_position_embeddings (2048")
    assert "PLAY [Build" not in result.output and "TASK [engine_image" not in result.output


def test_a_bad_draft_schedule_or_prompt_file_is_refused_in_the_preflight_play(testbed_up, tmp_path):
    """issue 37: a schedule vLLM would refuse only once the model is loaded (its first range must start at 1),
    and a prompts file with a broken line, each refused before any build, naming the variable."""
    late = specdeploy("deploy", "-e", '{"serving_speculative_schedule": [[2, 8, 1]]}')
    assert_clear_error(late, "serving_speculative_schedule=[[2, 8, 1]]: must be ranges whose first starts at 1")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "one"}\n{"messages": [{"role": "user"}]}\n')
    broken = specdeploy("deploy", "-e", f"serving_bench_prompts={prompts}")
    assert_clear_error(broken, f"serving_bench_prompts='{prompts}': must be empty", "line 2: each message is")
    for result in (late, broken):
        assert "PLAY [Build" not in result.output and "TASK [engine_image" not in result.output
