from __future__ import annotations

from specdeploy.fleet.router import RouterConfig
from specdeploy.serve.config import ServingConfig


def test_the_router_command_is_loopback_round_robin_with_metrics_on_loopback():
    cmd = RouterConfig.from_vars({"port": "8080", "policy": "round_robin"}).command("/opt/r/bin/vllm-router")
    assert cmd[:7] == ["/opt/r/bin/vllm-router", "--host", "127.0.0.1", "--port", "8080", "--policy", "round_robin"]
    assert cmd[cmd.index("--prometheus-host") + 1] == "127.0.0.1"
    assert "--api-key" not in cmd  # clients' keys pass through to the engines, which check them


def test_the_router_refuses_to_leave_loopback_and_bad_values():
    problems = RouterConfig.from_vars({"bind_address": "0.0.0.0", "policy": "fastest", "port": 70000}).problems()
    assert any("leaves loopback" in p and "add/remove_worker API is open" in p for p in problems), problems
    assert any("router_policy" in p for p in problems) and any("router_port" in p for p in problems)
    assert RouterConfig().problems() == []


def test_a_drain_timeout_renders_vllms_shutdown_timeout_and_lengthens_the_stop():
    cfg = ServingConfig.from_vars({"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m",
                                   "drain_timeout": "90"})  # fmt: skip
    cmd = cfg.command()
    assert cmd[cmd.index("--shutdown-timeout") + 1] == "90" and cfg.stop_timeout_s == 120
    plain = ServingConfig(engine="vllm", image="i", model_path="/m", served_model_name="m")
    assert "--shutdown-timeout" not in plain.command() and plain.stop_timeout_s == 60
