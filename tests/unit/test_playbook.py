from __future__ import annotations

from specdeploy.playbook import parse_recap, unreachable_sentence

OUTPUT = """
PLAY RECAP *********************************************************************
testbed-1                  : ok=6    changed=2    unreachable=0    failed=0    skipped=1    rescued=0    ignored=0
testbed-2                  : ok=5    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0

deploy ok
"""


def test_parse_recap_reads_every_host():
    recap = parse_recap("PLAY RECAP ****\nold : ok=1 changed=9\n" + OUTPUT)
    assert set(recap) == {"testbed-1", "testbed-2"}
    assert recap["testbed-1"]["changed"] == 2
    assert recap["testbed-2"]["unreachable"] == 1


def test_parse_recap_without_a_recap_is_empty():
    assert parse_recap("ERROR! the playbook could not be found") == {}


def test_a_host_lost_over_ssh_is_named_first_with_the_next_command():
    said = unreachable_sentence(parse_recap(OUTPUT))
    assert said is not None and said.startswith("testbed-2: unreachable over SSH, so the run stopped at it")
    assert "no later batch was started" in said and "make deploy again" in said
    assert "testbed-1" not in said


def test_a_run_that_reached_every_host_has_no_unreachable_sentence():
    assert unreachable_sentence(parse_recap(OUTPUT.replace("unreachable=1", "unreachable=0"))) is None
