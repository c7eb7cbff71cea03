from __future__ import annotations

from specdeploy.serve.config import ServingConfig


def test_one_model_across_two_hosts_renders_each_engines_multi_node_launch():
    base = {"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m", "pipeline_parallel_size": 2,
            "nnodes": "2", "master_addr": "10.0.0.1", "master_port": "29501", "bind_address": "10.0.0.1",
            "api_key": "k"}  # fmt: skip
    head, other = ServingConfig.from_vars(base), ServingConfig.from_vars({**base, "node_rank": 1})
    assert head.problems() == [] and other.problems() == []
    cmd = head.command()
    assert cmd[cmd.index("--nnodes") + 1] == "2" and cmd[cmd.index("--master-addr") + 1] == "10.0.0.1"
    assert "--headless" not in cmd and "--headless" in other.command() and not other.serves_api
    assert cmd[cmd.index("--host") + 1] == "10.0.0.1"  # on the host's network: the bind address itself
    kwargs = head.container_kwargs("sha256:x")
    assert kwargs["network_mode"] == "host" and "ports" not in kwargs
    sgl = ServingConfig.from_vars({**base, "engine": "sglang", "node_rank": 1}).command()
    assert sgl[sgl.index("--dist-init-addr") + 1] == "10.0.0.1:29501" and "--headless" not in sgl
    one = ServingConfig.from_vars({k: v for k, v in base.items() if k not in ("nnodes", "bind_address")})
    assert "--nnodes" not in one.command() and "network_mode" not in one.container_kwargs("sha256:x")
    bad = ServingConfig.from_vars({**base, "nnodes": 3, "node_rank": 3, "master_addr": ""}).problems()
    assert any("serving_node_rank=3" in p for p in bad) and any("serving_master_addr" in p for p in bad)
    assert any("must divide tensor x pipeline" in p for p in bad)


def test_data_parallel_over_hosts_renders_vllms_headless_replicas_and_the_head_without_a_start_rank():
    base = {"engine": "vllm", "image": "i", "model_path": "/m", "served_model_name": "m", "nnodes": 2,
            "master_addr": "10.0.0.1", "master_port": 29550, "multi_node": "data_parallel"}  # fmt: skip
    head, other = ServingConfig.from_vars(base), ServingConfig.from_vars({**base, "node_rank": 1})
    assert head.problems() == [] and head.data_parallel_ranks == 2
    cmd, headless = head.command(), other.command()
    assert cmd[cmd.index("--data-parallel-size") + 1] == "2" and cmd[cmd.index("--data-parallel-size-local") + 1] == "1"
    assert cmd[cmd.index("--data-parallel-address") + 1] == "10.0.0.1"
    assert cmd[cmd.index("--data-parallel-rpc-port") + 1] == "29550"
    assert cmd[cmd.index("--api-server-count") + 1] == "1" and "--api-server-count" not in headless
    # A start rank on the head would make vLLM choose its hybrid load balancer (arg_utils): never there.
    assert "--data-parallel-start-rank" not in cmd and "--headless" not in cmd and "--nnodes" not in cmd
    assert headless[headless.index("--data-parallel-start-rank") + 1] == "1" and "--headless" in headless
    assert ServingConfig.from_vars({**base, "nnodes": 1}).data_parallel_ranks == 1
    (sgl,) = ServingConfig.from_vars({**base, "engine": "sglang"}).problems()
    assert "serving_multi_node=data_parallel is vLLM's launch" in sgl
    # Replicas need no tensor x pipeline split over the hosts; the model-parallel launch does.
    assert ServingConfig.from_vars({**base, "nnodes": 3, "node_rank": 2}).problems() == []
    assert ServingConfig.from_vars({**base, "multi_node": "model_parallel", "nnodes": 3}).problems()
