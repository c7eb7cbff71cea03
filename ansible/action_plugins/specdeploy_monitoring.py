"""Action `specdeploy_monitoring`: compose the monitoring host's Prometheus files from the inventory.

It composes prometheus.yml (every engine's API, the router and the sentinel, each labelled with its
inventory host), the alert rules (each engine in its own metric form; speculative acceptance below the
figure the benchmark gate recorded for what serves, read from this controller's run records) and a
Grafana dashboard per engine, which it writes under the controller's state folder (`dashboards/`) for the
operator to import. The role copies the files, validated by promtool. Runs on the controller and changes
no host. Thin: the logic is in specdeploy.monitoring (plan, alerts, scrape, dashboards).
"""

from __future__ import annotations

from typing import Any, ClassVar

from specdeploy.actions import SpecdeployAction
from specdeploy.errors import SpecdeployError
from specdeploy.monitoring import plan
from specdeploy.monitoring.alerts import AlertSettings
from specdeploy.monitoring.scrape import Ports
from specdeploy.monitoring.targets import EngineTarget


class ActionModule(SpecdeployAction):
    CHANGES_HOSTS = False  # composes only (the role's copies change the host)
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {
        "targets": {"type": "list", "elements": "dict", "required": True,
                    "description": "The engines' APIs (the specdeploy_monitoring_targets filter over the inventory)."},
        "ports": {"type": "dict", "required": True,
                  "description": "prometheus, alertmanager, router_metrics and sentinel ports on this host (0: none)."},
        "alerts": {"type": "dict", "default": {},
                   "description": "The alerts' thresholds (specdeploy.monitoring.alerts.AlertSettings fields)."},
    }  # fmt: skip

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        targets = [EngineTarget(**t) for t in args["targets"]]
        ports = Ports(**{k: int(v) for k, v in args["ports"].items()})
        try:
            files = plan.compose(targets, self.host_name, ports, AlertSettings.from_vars(args["alerts"]))
        except ValueError as exc:
            raise SpecdeployError(str(exc), hint="fix the monitoring_alert_* variables") from exc
        written = plan.write_dashboards(files)
        return {"changed": False, "prometheus_yml": files.prometheus_yml, "rules_yml": files.rules_yml,
                "dashboards": files.dashboards, "notes": files.notes, "dashboard_files": [str(p) for p in written],
                "msg": "; ".join(files.notes) or f"{len(targets)} engine(s) scraped"}  # fmt: skip
