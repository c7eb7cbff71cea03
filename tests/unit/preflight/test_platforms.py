from __future__ import annotations

import pytest

from specdeploy.preflight.platforms import platform_problems


def facts(distribution="Debian", version="12.7", major="12", arch="x86_64", python=(3, 11, 2)):
    return {
        "distribution": distribution,
        "distribution_version": version,
        "distribution_major_version": major,
        "os_family": "Debian" if distribution in {"Debian", "Ubuntu"} else "RedHat",
        "architecture": arch,
        "python": {"version_info": [*python, "final", 0], "executable": "/usr/bin/python3"},
    }


@pytest.mark.parametrize(
    "fact_set",
    [
        facts(),
        facts("Ubuntu", "22.04", "22", python=(3, 10, 12)),
        facts("Ubuntu", "24.04", "24", python=(3, 12, 3)),
    ],
)
def test_supported_platforms_have_no_problems(fact_set):
    assert platform_problems(fact_set) == []


def test_old_ubuntu_is_named_with_the_matrix():
    (problem,) = platform_problems(facts("Ubuntu", "20.04", "20", python=(3, 10, 0)))
    assert "unsupported OS Ubuntu 20.04" in problem
    assert "Debian 12" in problem and "Ubuntu 24.04" in problem


def test_every_problem_is_reported_at_once():
    problems = platform_problems(facts("Rocky", "9.4", "9", arch="aarch64", python=(3, 6, 8)))
    assert len(problems) == 3
    assert any("aarch64" in p for p in problems)
    assert any("Python 3.6" in p for p in problems)


def test_missing_python_facts_are_a_problem_not_a_crash():
    fact_set = facts()
    del fact_set["python"]
    assert any("Python unknown" in p for p in platform_problems(fact_set))
