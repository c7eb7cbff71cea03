"""Thin Jinja filters: the decisions live in the specdeploy package."""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any

from specdeploy import names, pins
from specdeploy.engine_image import profiles
from specdeploy.fleet import router as fleet_router
from specdeploy.fleet import router_api
from specdeploy.fleet import schedule as fleet_schedule
from specdeploy.fleet import sentinel as fleet_sentinel
from specdeploy.gpu import checks as gpu_checks
from specdeploy.gpu.facts import (
    CSV_FORMAT,
    QUERY_APPS_FIELDS,
    collect,
    facts_from_json,
    query_gpu_command,
    query_gpu_rows,
)
from specdeploy.monitoring import scrape as monitoring_scrape
from specdeploy.preflight import fit
from specdeploy.preflight import host as hostchecks
from specdeploy.preflight.platforms import platform_problems
from specdeploy.serve import ranks as serve_ranks
from specdeploy.serve import schema as serving_schema
from specdeploy.serve import variables as serving_variables
from specdeploy.serve.config import ServingConfig


def serving_problems(config: dict[str, Any], api_key: str | None = None) -> list[str]:
    try:
        return ServingConfig.from_vars({**config, "api_key": api_key}).problems()
    except (TypeError, ValueError) as exc:
        return [f"serving variables: {exc}"]


def serving_variable_problems(values: dict[str, Any]) -> list[str]:
    """Each bad serving_* value, named as the inventory spells it (the API key is checked apart)."""
    return serving_variables.problems(values)


def serving_checked_names(names: list[str]) -> list[str]:
    """The variables among NAMES that serving_variable_problems checks (never the API key)."""
    return [n for n in names if n in serving_schema.RULES]


def serving_config_names(names: list[str]) -> list[str]:
    """The variables among NAMES that make the engine's variable set, by specdeploy.serve.schema."""
    return serving_schema.config_variables(names)


def serving_config(values: dict[str, Any]) -> dict[str, Any]:
    """The engine's variable set (ServingConfig's field names) from the role's serving_* values."""
    return serving_schema.collect(values)


def serving_command(config: dict[str, Any]) -> str:
    """The engine's command line, for the report (the API key is never part of it)."""
    return " ".join(ServingConfig.from_vars(config).command())


def gpu_commands(smi: str) -> list[list[str]]:
    """The nvidia-smi reads preflight runs on the host, in the order gpu_facts takes them."""
    return [
        [smi, "-q", "-x"],
        [smi, "topo", "-m"],
        query_gpu_command(smi),
        [smi, f"--query-compute-apps={','.join(QUERY_APPS_FIELDS)}", f"--format={CSV_FORMAT}"],
    ]


def gpu_rows(result: dict[str, Any]) -> list[dict[str, str]]:
    """A registered --query-gpu result as one dict per GPU, by field name ([] when it failed)."""
    if result.get("rc", 1) != 0 or not result.get("stdout"):
        return []
    return query_gpu_rows(str(result["stdout"]))


def installed_driver_problems(result: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """options: version, expected_gpus, open, nvrm_text, version_file, may_be_silent."""
    return gpu_checks.installed_driver_problems(
        int(result.get("rc", 1)), str(result.get("stdout", "")), str(result.get("stderr", result.get("msg", ""))),
        version=str(options["version"]), expected_gpus=int(options.get("expected_gpus") or 0),
        open_modules=bool(options.get("open")), nvrm_text=str(options.get("nvrm_text") or ""),
        version_file=str(options.get("version_file", "")), may_be_silent=bool(options.get("may_be_silent")),
    )  # fmt: skip


def gpu_facts(outputs: list[str], driver_version_text: str | None = None) -> dict[str, Any]:
    xml, topo, query_gpu, apps = outputs
    return collect(xml, topo, query_gpu, apps, driver_version_text or None).to_json()


def gpu_problems(facts: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """Everything preflight asserts about the GPUs, and the PCIe advice the serving role applies.

    options: tp, pp, allowed_pids (our own engine's), cmdline (/proc/cmdline), iommu_fixed.
    """
    parsed = facts_from_json(facts)
    allowed = [int(p) for p in options.get("allowed_pids") or []]
    sizes = int(options.get("tp", 1)), int(options.get("pp", 1))
    return {
        "problems": gpu_checks.gpu_count_problems(parsed, *sizes) + gpu_checks.driver_problems(parsed),
        "foreign": gpu_checks.foreign_process_problems(parsed, allowed),
        "foreign_pids": sorted({p.pid for p in parsed.processes} - set(allowed)),
        "nccl": gpu_checks.nccl_recommendations(parsed, bool(options.get("iommu_fixed")), options.get("cmdline", "")),
        "count": parsed.count,
        "pcie_only": parsed.pcie_only,
    }


def planned_driver_problems(compute_capabilities: list[str], plan: dict[str, Any]) -> list[str]:
    """plan: branch, open, package, version (the nvidia_driver role's variables)."""
    return gpu_checks.planned_driver_problems(
        compute_capabilities, int(plan["branch"]), bool(plan["open"]), str(plan["package"]), str(plan["version"])
    )


def pin(variable: str) -> Any:
    """A provision role variable's pinned default, from specdeploy/pins.yaml."""
    return pins.host_pin(variable)


def name(key: str) -> str | int:
    """A name the roles share with the Python code (specdeploy.names), for roles/specdeploy_defaults."""
    return names.role_default(key)


def profile_fact(profile: str, fact: str) -> str | int | bool:
    """`engine_image_profile | specdeploy_profile('engine')`: a fact of the engine image profile."""
    return profiles.fact(str(profile), str(fact))


def engine_profile(engine: str, device: str) -> str:
    """`specdeploy_engine | specdeploy_engine_profile('cuda')`: the profile that runs ENGINE on DEVICE."""
    return profiles.for_engine(str(engine), str(device)).name


def router_problems(settings: dict[str, Any]) -> list[str]:
    try:
        return fleet_router.RouterConfig.from_vars(settings).problems()
    except (TypeError, ValueError) as exc:
        return [f"router variables: {exc}"]


def router_command(settings: dict[str, Any], binary: str) -> str:
    """The router unit's ExecStart (shell-quoted as systemd splits it)."""
    return shlex.join(fleet_router.RouterConfig.from_vars(settings).command(binary))


def sentinel_command(settings: dict[str, Any], python: str) -> str:
    """The sentinel unit's ExecStart (shell-quoted as systemd splits it)."""
    return shlex.join(fleet_sentinel.command(python, settings))


def worker_url(address: str, port: int | str) -> str:
    return router_api.worker_url(str(address), int(port))


def serving_group(hosts: list[str], hostvars: Any, config: dict[str, Any]) -> list[str]:
    """The hosts of CONFIG's multi-node engine in rank order (empty on one host): what the sentinel
    names a rank by (specdeploy.serve.ranks.ranks_of, as the rollout finds them)."""
    ranks = serve_ranks.ranks_of({h: hostvars[h].get("serving_config") for h in hosts}, config)
    return sorted(ranks, key=ranks.__getitem__)


def fleet_serial(hosts: list[str], max_unavailable: int | str) -> list[int]:
    """The Deploy play's `serial`: the batch sizes of rollout_max_unavailable (specdeploy.fleet.schedule)."""
    if not hosts:  # no inventory (ansible-lint, --list-tasks): the play has no host to batch
        return [1]
    return [len(batch) for batch in fleet_schedule.batches(list(hosts), max_unavailable)]


def monitoring_targets(hosts: list[str], hostvars: Any, monitoring_host: str) -> list[dict[str, Any]]:
    """The engines' APIs Prometheus on MONITORING_HOST scrapes (specdeploy.monitoring.scrape.engine_targets)."""
    return [asdict(t) for t in monitoring_scrape.engine_targets(list(hosts), hostvars, str(monitoring_host))]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "specdeploy_pin": pin,
            "specdeploy_name": name,
            "specdeploy_profile": profile_fact,
            "specdeploy_engine_profile": engine_profile,
            "specdeploy_router_problems": router_problems,
            "specdeploy_router_command": router_command,
            "specdeploy_fleet_serial": fleet_serial,
            "specdeploy_serving_group": serving_group,
            "specdeploy_sentinel_command": sentinel_command,
            "specdeploy_sentinel_path": fleet_sentinel.PATHS.__getitem__,
            "specdeploy_worker_url": worker_url,
            "specdeploy_monitoring_targets": monitoring_targets,
            "specdeploy_remote_code_warnings": serving_variables.remote_code_warnings,
            "specdeploy_model_problems": serving_variables.model_problems,
            "specdeploy_platform_problems": platform_problems,
            "specdeploy_serving_problems": serving_problems,
            "specdeploy_serving_variable_problems": serving_variable_problems,
            "specdeploy_serving_checked_names": serving_checked_names,
            "specdeploy_serving_command": serving_command,
            "specdeploy_serving_config_names": serving_config_names,
            "specdeploy_serving_config": serving_config,
            "specdeploy_host_problems": hostchecks.host_problems,
            "specdeploy_fit_problems": fit.config_problems,
            "specdeploy_docker_unanswered": hostchecks.docker_unanswered,
            "specdeploy_timed_out": hostchecks.timed_out,
            "specdeploy_gpu_commands": gpu_commands,
            "specdeploy_gpu_facts": gpu_facts,
            "specdeploy_gpu_problems": gpu_problems,
            "specdeploy_planned_driver_problems": planned_driver_problems,
            "specdeploy_gpu_query": query_gpu_command,
            "specdeploy_gpu_rows": gpu_rows,
            "specdeploy_installed_driver_problems": installed_driver_problems,
            "specdeploy_cuda_toolkit_problems": gpu_checks.cuda_toolkit_problems,
        }
