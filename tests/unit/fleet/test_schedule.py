from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from specdeploy.cli import main
from specdeploy.errors import SpecdeployError
from specdeploy.fleet import schedule

HOSTS = [f"h{i}" for i in range(1, 9)]


@pytest.mark.parametrize(("value", "hosts", "size"), [
    (1, 8, 1), ("2", 8, 2), ("25%", 8, 2), ("10%", 8, 1), ("100%", 8, 8), (20, 3, 3), ("50 %", 3, 1),
])  # fmt: skip
def test_batch_size_counts_and_percentages(value, hosts, size):
    assert schedule.batch_size(value, hosts) == size


@pytest.mark.parametrize("value", [0, "0%", "-1", "abc", "150%", ""])
def test_bad_max_unavailable_is_refused_with_the_fix(value):
    with pytest.raises(SpecdeployError) as err:
        schedule.batch_size(value, 3)
    assert "rollout_max_unavailable" in err.value.message and "25%" in (err.value.hint or "")


def test_batches_keep_the_inventory_order_and_the_remainder_last():
    assert schedule.batches(HOSTS[:5], 2) == [["h1", "h2"], ["h3", "h4"], ["h5"]]


def test_plan_duration_and_lowest_capacity():
    result = schedule.plan(HOSTS, "25%", load_s=1500, drain_s=60)
    assert len(result.batches) == 4 and result.duration_s == 4 * 1560
    assert result.serving_hosts_min == 6 and result.capacity_min == 0.75
    assert result.queue_wait_max_s is None


def test_queue_wait_is_zero_while_the_reduced_fleet_keeps_up():
    result = schedule.plan(HOSTS[:3], 1, load_s=30, drain_s=0, load=schedule.Load(offered_rps=1.0, per_host_rps=0.5))
    assert result.utilisation_max == 1.0 and result.queue_wait_max_s == 0.0


def test_queue_wait_over_the_reduced_capacity_follows_the_fluid_model():
    # 3 hosts of 1 rps, 2.5 rps offered, one host out for 100 s: the longest wait is 100 * (1 - 2/2.5).
    result = schedule.plan(HOSTS[:3], 1, load_s=90, drain_s=10, load=schedule.Load(offered_rps=2.5, per_host_rps=1.0))
    assert result.queue_wait_max_s == pytest.approx(20.0)
    assert any("20.0 s" in line for line in result.lines())


def test_an_overloaded_fleet_never_drains_and_a_single_host_has_no_capacity():
    over = schedule.plan(HOSTS[:2], 1, 10, 0, schedule.Load(offered_rps=5, per_host_rps=1))
    assert over.queue_wait_max_s == math.inf
    single = schedule.plan(["only"], 1, 10, 0, schedule.Load(offered_rps=0.1, per_host_rps=1))
    assert single.serving_hosts_min == 0 and any("no host serves" in line for line in single.lines())


def test_plan_refuses_a_non_positive_load_time():
    with pytest.raises(SpecdeployError, match="load time"):
        schedule.plan(HOSTS, 1, load_s=0, drain_s=0)


def test_a_multi_node_engine_is_one_unit_of_capacity():
    assert schedule.units(4, 2) == ["host-1..host-2", "host-3..host-4"]
    assert schedule.units(2) == ["host-1", "host-2"]
    result = schedule.plan(schedule.units(4, 2), 1, 100, 10)
    assert result.batches == [["host-1..host-2"], ["host-3..host-4"]] and result.serving_hosts_min == 1
    with pytest.raises(SpecdeployError, match="do not split into engines of 2 hosts"):
        schedule.units(3, 2)


def test_a_first_rollout_says_the_measuring_starts_each_host_makes_out_of_the_router():
    starts = ("the speculation-off baseline", "draft length 1", "draft length 2")
    result = schedule.plan(HOSTS, "25%", load_s=1500, drain_s=60, measuring=starts)
    assert result.duration_s == 4 * 1560  # the steady rollout's figure is unchanged
    assert result.measuring_s == 3 * 1500 * 4  # three more loads a host, batch after batch
    said = "\n".join(result.lines())
    assert "3 more time(s)" in said and "draft length 2" in said and "+18000 s (300.0 min)" in said
    assert "first rollout" not in "\n".join(schedule.plan(HOSTS, "25%", 1500, 60).lines())


def test_plan_reads_the_inventorys_gate_and_schedule(tmp_path, capsys):
    """`specdeploy plan` on the example inventory (its gate measures a baseline once), and on a copy that
    asks serving_speculative_schedule: auto: the draft lengths are said too."""
    example = Path(__file__).parents[3] / "inventories" / "example-8gpu"
    assert main(["plan", "--hosts", "4", "--load-seconds", "1500", "--inventory", str(example)]) == 0
    out = capsys.readouterr().out
    assert "1 more time(s)" in out and "(the speculation-off baseline)" in out and "draft length" not in out
    auto = tmp_path / "auto"
    shutil.copytree(example, auto)
    group_vars = auto / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text().replace('serving_speculative_schedule: ""',
                                                         "serving_speculative_schedule: auto"))  # fmt: skip
    assert main(["plan", "--hosts", "4", "--load-seconds", "1500", "--inventory", str(auto), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["measuring"][0] == "the speculation-off baseline" and len(said["measuring"]) == 5  # + lengths 1-4
    assert said["measuring_s"] == 5 * 1500 * 4


def test_the_plans_load_time_is_the_newest_ready_start_up_watched_here(tmp_path):
    for run, status, elapsed in (("20261201T000000-1", "READY", 90.5), ("20261202T000000-2", "READY", 41.0),
                                 ("20261203T000000-3", "STALLED", 300.0)):  # fmt: skip
        folder = tmp_path / "host-1" / run
        folder.mkdir(parents=True)
        (folder / "verdict.json").write_text(json.dumps({"status": status, "elapsed_s": elapsed}))
    assert schedule.last_measured_load_s(tmp_path) == (41.0, str(tmp_path / "host-1" / "20261202T000000-2"))
    assert schedule.last_measured_load_s(tmp_path / "none") is None


def test_plan_from_outside_the_checkout_reads_the_checkouts_inventory(tmp_path, capsys, monkeypatch):
    """A relative --inventory not found here is the checkout's (ansible-inventory reads a missing path as an
    empty inventory, so the plan would silently leave out the gate's starts)."""
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--hosts", "2", "--load-seconds", "60", "--inventory", "inventories/example-8gpu"]) == 0
    assert "1 more time(s)" in capsys.readouterr().out
    assert main(["plan", "--hosts", "2", "--load-seconds", "60", "--inventory", "inventories/nowhere"]) == 2
    assert "no inventory at inventories/nowhere" in capsys.readouterr().err
