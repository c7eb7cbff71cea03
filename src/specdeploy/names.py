"""Names the roles and the Python code share, defined once: the default engine image profile, the
engine's container, the ports, the host's serving state folder, the engine image's labels.

The Python code imports them from here. The roles get them from the specdeploy_defaults role
(roles/specdeploy_defaults/defaults/main.yml, first in every play, as kubespray hands its names to
its plays with kubespray_defaults): each of its variables is `specdeploy_defaults_<key>`, valued
`'<key>' | specdeploy_name` (ROLE_DEFAULTS below), so a role says `{{ specdeploy_defaults_router_port }}`
where it used to write 8080. The serving role's generated defaults take them from
specdeploy.serve.schema, which reads them here. Standard library only: Ansible's workers import this
module through the filters.
"""

from __future__ import annotations

# engine_image_profile's default: the test bed's CPU build (specdeploy.engine_image.profiles).
DEFAULT_PROFILE = "vllm-cpu"
# The serving engine's container; a rollout keeps `<it>-previous` and `<it>-failed` beside it.
ENGINE_CONTAINER = "specdeploy-engine"
SERVING_PORT = 8000  # serving_port: the engine's API on the host
MODEL_PATH = "/srv/specdeploy/models/target"  # serving_model_path: the model folder on the host
SERVING_STATE_DIR = "/var/lib/specdeploy/serving"  # serving_state_dir: rollout.json, current.json
ROUTER_PORT = 8080  # router_port: the fleet's one OpenAI endpoint (vllm-router), on loopback
ROUTER_METRICS_PORT = 29000  # router_metrics_port: the router's Prometheus port, on loopback
SENTINEL_PORT = 8081  # sentinel_control_port: the sentinel's hold API on the router host's loopback
PROMETHEUS_PORT = 9090  # monitoring_prometheus_port: on the monitoring host's loopback
ALERTMANAGER_PORT = 9093  # monitoring_alertmanager_port: on the monitoring host's loopback

# What roles/specdeploy_defaults hands every play, as specdeploy_defaults_<key>.
ROLE_DEFAULTS: dict[str, str | int] = {
    "profile": DEFAULT_PROFILE,
    "engine_container": ENGINE_CONTAINER,
    "serving_port": SERVING_PORT,
    "model_path": MODEL_PATH,
    "serving_state_dir": SERVING_STATE_DIR,
    "router_port": ROUTER_PORT,
    "router_metrics_port": ROUTER_METRICS_PORT,
    "sentinel_port": SENTINEL_PORT,
    "prometheus_port": PROMETHEUS_PORT,
    "alertmanager_port": ALERTMANAGER_PORT,
}
ROLE_PREFIX = "specdeploy_defaults_"


def role_default(key: str) -> str | int:
    """The value of specdeploy_defaults_KEY (the specdeploy_name filter)."""
    if key not in ROLE_DEFAULTS:
        raise KeyError(f"specdeploy.names has no shared name {key!r}; it has: {', '.join(ROLE_DEFAULTS)}")
    return ROLE_DEFAULTS[key]


# vLLM's API sends a request to the data-parallel rank this header names (its serving layer reads it):
# how the readiness proof and the sentinel reach each replica of a multi-node engine.
DP_RANK_HEADER = "X-data-parallel-rank"

# The engine image's labels: docker/engine.Dockerfile.j2 writes them (specdeploy.engine_image.dockerfile
# hands it each name); the rollout reads the engine's version, make verify the two digests.
PROFILE_LABEL = "io.specdeploy.profile"
ENGINE_LABEL = "io.specdeploy.engine"
ENGINE_VERSION_LABEL = "io.specdeploy.engine-version"
PATCH_DIGEST_LABEL = "io.specdeploy.patch-digest"
DRAFTER_DIGEST_LABEL = "io.specdeploy.drafter-digest"
VERSION_LABEL = "io.specdeploy.version"  # specdeploy's own version, which built the image
