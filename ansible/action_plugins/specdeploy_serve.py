"""Action `specdeploy_serve`: roll the engine container out (or back) on the target, watched to READY.

`action: deploy` warms the page cache with the model while the old engine still serves, stops it, starts
`image` with `config` and watches the start-up to READY (stage, elapsed time, ETA); when `serving_bench`
asks, the benchmark gate measures the READY engine before it is promoted. A FAILED or STALLED start-up,
or a refused gate, rolls back to the last version proven READY. A rerun with this image and
configuration, proven READY, restarts nothing; an interrupted rollout resumes. `action: rollback` swaps
the running engine with the previous one, watched the same way. In a fleet (`router_host`), the engine
leaves the router before it stops and joins it again once READY. The outcome is recorded on the host
(`current.json` and `rollout.json` in `serving_state_dir`) and in the controller's run folder. Thin: the
deploy is composed in specdeploy.serve.deploy.

Notes:
- Secrets: the engine's API key is never an argument. The action reads the `serving_api_key` variable
  (keep it in ansible-vault) itself, so the key appears in no task argument, result or log line; `config`
  never holds it (roles/serving leaves every secret out).
- The role's own knobs are not arguments either: the action reads them from the task's variables, as
  specdeploy.serve.schema declares them (roles/serving's defaults): `serving_stall_timeout`,
  `serving_timeout`, `serving_reconnect_grace`, `serving_state_dir`, `serving_warm_page_cache`, the
  prewarm's `serving_prewarm_*`, `serving_fleet_worker` and the benchmark gate's `serving_bench*`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from specdeploy import names
from specdeploy.actions import SpecdeployAction
from specdeploy.connection import HostConnection
from specdeploy.fleet.router_api import SENTINEL_PORT
from specdeploy.serve import deploy
from specdeploy.targets import CONNECTION_VARS


class ActionModule(SpecdeployAction):
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "action": {
            "type": "str",
            "choices": ["deploy", "rollback"],
            "default": "deploy",
            "description": "`deploy` rolls `image` out; `rollback` swaps the running engine with the previous one.",
        },
        "image": {
            "type": "str",
            "description": "The engine image to deploy, by tag: needed by `action: deploy`; it must be on the "
            "target already (the engine image phase builds it).",
        },
        "config": {
            "type": "dict",
            "default": {},
            "description": "The engine's serving configuration, ServingConfig's fields (roles/serving's "
            "`serving_config`, from its `serving_*` variables); checked before anything changes.",
        },
        "engine_image_profile": {
            "type": "str",
            "default": names.DEFAULT_PROFILE,
            "description": "The profile the image was built from, kept in `current.json` so that "
            "`specdeploy verify --host` needs no inventory (roles/engine_image).",
        },
        "engine_image_drafter_path": {
            "type": "str",
            "default": "",
            "description": "The drafter the image was built from, kept in `current.json` likewise.",
        },
        "predicted_kv_capacity": {
            "type": "int",
            "default": 0,
            "description": "The KV cache in tokens that preflight predicted before any load (roles/preflight, "
            "specdeploy.preflight.memory): the engine's own figure is set beside it after READY, with the error.",
        },
        "router_host": {
            "type": "str",
            "default": "",
            "description": "A fleet: the router's inventory host, which this engine leaves before it stops "
            "and joins once READY; empty: no router.",
        },
        "router_port": {"type": "int", "default": names.ROUTER_PORT, "description": "The router's port."},
        "sentinel_port": {
            "type": "int",
            "default": SENTINEL_PORT,
            "description": "The fleet sentinel's hold API port, on the router host's loopback.",
        },
    }

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        # Only the role's knobs the deploy reads are templated (schema.py declares them; no secret among them).
        values = {v: self._templar.template(self.task_vars[v]) for v in deploy.VARIABLES if v in self.task_vars}
        return deploy.run(self, args, values)

    # What the deploy needs from Ansible (specdeploy.serve.deploy.Inventory); host_name, connection and
    # say are SpecdeployAction's.

    @property
    def play_hosts(self) -> list[str]:
        return [str(host) for host in self.task_vars.get("ansible_play_hosts_all") or [self.host_name]]

    @property
    def address(self) -> str:
        return str(self.hostvars.get("ansible_host", self.host_name))

    def connection_of(self, host: str) -> HostConnection:
        """Another inventory host, over SSH as Ansible has it."""
        host_vars = self.task_vars["hostvars"][host]
        return HostConnection.from_hostvars({k: self._templar.template(host_vars[k]) for k in CONNECTION_VARS
                                             if k in host_vars})  # fmt: skip

    def serving_config(self, host: str) -> dict[str, Any] | None:
        config: dict[str, Any] | None = self._templar.template(self.task_vars["hostvars"][host].get("serving_config"))
        return config

    def api_key(self, host: str) -> str | None:
        """This host's from the task's variables (`secret`), another's from its hostvars."""
        if host == self.host_name:
            return self.secret("serving_api_key")
        key = self._templar.template(self.task_vars["hostvars"][host].get("serving_api_key") or "")
        return str(key) if key else None
