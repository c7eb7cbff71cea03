"""The table at the end of `make deploy`, from what each phase left: the playbook's seconds per role,
the image build's steps, the watchdog's verdict and the gate's bench.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specdeploy import timing
from specdeploy.engine_image.docker_build import write_steps


def test_the_table_says_where_a_first_deploy_went(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    build = runs / "testbed-1" / "20261202T100000"
    build.mkdir(parents=True)
    steps = [("[1/4] FROM base", 0.0), ("[2/4] RUN pip install", 1.0), ("[3/4] COPY --from=engine", 226.0),
             ("[4/4] RUN verify", 367.0)]  # fmt: skip
    write_steps(build / timing.STEPS_FILE, "specdeploy/vllm-cpu:abc", 384.0, steps)
    start = runs / "testbed-1" / "20261202T100700-7"
    start.mkdir()
    (start / "verdict.json").write_text(
        json.dumps(
            {
                "status": "READY",
                "elapsed_s": 96.8,
                "startup": [
                    {"stage": "resolving config", "seconds": 52.1},
                    {"stage": "loading weights", "seconds": 2.1},
                ],
            }
        )
    )
    (start / "bench.json").write_text(json.dumps({"gate": {"seconds": 21.0}}))
    old = runs / "testbed-1" / "20261201T000000-1"  # an earlier deploy's: not this one's
    old.mkdir()
    (old / "verdict.json").write_text(json.dumps({"status": "READY", "elapsed_s": 5.0}))
    os.utime(old, (1, 1))
    playbook = tmp_path / "playbook.json"
    playbook.write_text(json.dumps({"total_s": 600.0, "roles": {"engine_image": 400.0, "serving": 150.0,
                                                                "preflight": 0.2}}))  # fmt: skip

    lines = timing.deploy_table(began=1000.0, make_start=900.0, testbed_s=40.0, timing_file=playbook,
                                runs_root=runs, ended=1640.0)  # fmt: skip
    text = "\n".join(lines)
    assert lines[0] == "where the time went (740.0 s in all):"
    assert "set-up (make setup: the venv, pinned packages)" in text and "  100.0 s   14%" in text
    assert "role engine_image" in text and "role preflight" not in text  # under half a second: left out
    # The build's slowest steps, slowest first; each lasts until the next began.
    built = [line.strip().split("  ")[0] for line in lines if "step [" in line]
    assert built == ["step [2/4] RUN pip install", "step [3/4] COPY --from=engine", "step [4/4] RUN verify"]
    assert "225.0 s" in next(line for line in lines if "RUN pip install" in line)
    assert "READY (testbed-1)" in text and "resolving config" in text and "benchmark gate" in text
    assert text.count("engine start-up") == 1  # the earlier deploy's folder is not this one's


def test_a_converged_deploy_has_no_build_or_start_up_rows_and_no_setup_when_make_was_instant(tmp_path: Path) -> None:
    playbook = tmp_path / "playbook.json"
    playbook.write_text(json.dumps({"total_s": 12.0, "roles": {"serving": 6.0}}))
    lines = timing.deploy_table(began=100.0, make_start=99.8, testbed_s=None, timing_file=playbook,
                                runs_root=tmp_path / "none", ended=113.0)  # fmt: skip
    assert [line.strip().split("  ")[0] for line in lines[1:]] == ["playbook (ansible-playbook)", "role serving"]
    assert lines[0] == "where the time went (13.2 s in all):"


def test_a_playbook_that_wrote_nothing_leaves_its_rows_out(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    assert timing.playbook_rows(tmp_path / "bad.json") == [] and timing.playbook_rows(tmp_path / "none") == []


def test_the_callback_adds_each_tasks_seconds_to_its_play_when_it_has_no_role(tmp_path: Path) -> None:
    """The real ansible-playbook with the repository's ansible.cfg (callbacks_enabled), one local play."""
    root = Path(__file__).resolve().parents[2]
    play = tmp_path / "play.yml"
    play.write_text("- name: Timing probe | one task\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - name: Wait\n      ansible.builtin.command: sleep 1\n"
                    "      changed_when: false\n")  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), timing.TIMING_ENV: str(tmp_path / "t.json")}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(play)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    doc = json.loads((tmp_path / "t.json").read_text())
    assert list(doc["roles"]) == ["play: Timing probe"] and 1.0 <= doc["roles"]["play: Timing probe"] < 10
    assert doc["total_s"] >= doc["roles"]["play: Timing probe"]


def test_a_role_and_its_handler_are_the_roles_seconds_with_no_callback_warning(tmp_path: Path) -> None:
    """ansible-core 2.19 calls v2_playbook_on_handler_task_start(task) with one argument: a hook that wants
    two fails there (a callback warning) and its handler's seconds went to the role before it."""
    root = Path(__file__).resolve().parents[2]
    role = tmp_path / "roles" / "probe"
    (role / "tasks").mkdir(parents=True)
    (role / "handlers").mkdir()
    (role / "tasks" / "main.yml").write_text("- name: Touch\n  ansible.builtin.command: 'true'\n"
                                             "  changed_when: true\n  notify: Wait\n")  # fmt: skip
    (role / "handlers" / "main.yml").write_text("- name: Wait\n  ansible.builtin.command: sleep 1\n"
                                                "  changed_when: false\n")  # fmt: skip
    play = tmp_path / "play.yml"
    play.write_text("- name: Timing probe | a role\n  hosts: localhost\n  gather_facts: false\n  roles:\n"
                    "    - probe\n")  # fmt: skip
    env = {**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), timing.TIMING_ENV: str(tmp_path / "t.json"),
           "ANSIBLE_ROLES_PATH": str(tmp_path / "roles")}  # fmt: skip
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(play)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert "v2_playbook_on_handler_task_start" not in done.stdout + done.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert list(doc["roles"]) == ["probe"] and 1.0 <= doc["roles"]["probe"] < 10
