"""Roll the engine container out on a host, and back when the new one does not come up.

1. record the running container; 2. warm the page cache with the model while it still serves;
3. stop it (kept as `specdeploy-engine-previous`); 4. start the new one; 5. watch it;
6. READY: the new one gets its restart policy; 7. FAILED/STALLED: diagnostics saved, the failed
container kept stopped as `specdeploy-engine-failed`, the previous one restarted and watched.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from docker.client import DockerClient
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from specdeploy.errors import SpecdeployError
from specdeploy.images import CommandHost
from specdeploy.serving.config import CONFIG_LABEL, CONTAINER, ServingConfig
from specdeploy.watch.watchdog import Verdict

PREVIOUS = f"{CONTAINER}-previous"
FAILED = f"{CONTAINER}-failed"
RUNNING_POLICY = {"Name": "unless-stopped"}
WARM_MAX_FRACTION = 0.5  # of MemAvailable: never push the serving engine's own memory out

Watcher = Callable[[str], Verdict]  # container name -> verdict


@dataclass
class Outcome:
    changed: bool
    status: str  # unchanged | deployed | rolled-back | failed
    message: str
    image_id: str = ""
    previous_image_id: str | None = None
    warm: str = ""
    verdict: dict[str, Any] | None = None
    rollback_verdict: dict[str, Any] | None = None
    started_at: str = ""
    notes: list[str] = field(default_factory=list)


def _get(client: DockerClient, name: str) -> Container | None:
    try:
        return client.containers.get(name)
    except NotFound:
        return None


def _remove(client: DockerClient, name: str) -> None:
    container = _get(client, name)
    if container is not None:
        container.remove(force=True)


def is_converged(container: Container | None, cfg: ServingConfig, image_id: str) -> bool:
    return (
        container is not None
        and container.status == "running"
        and container.labels.get(CONFIG_LABEL) == cfg.digest()
        and container.attrs["Image"] == image_id
    )


def warm_page_cache(host: CommandHost, model_path: str) -> str:
    """Read the model files once so the new engine loads from memory, when memory allows."""
    size = subprocess.run(host.command("du", "-sb", model_path), capture_output=True, text=True, check=False)
    mem = subprocess.run(host.command("grep", "MemAvailable", "/proc/meminfo"), capture_output=True, text=True,
                         check=False)  # fmt: skip
    try:
        model_bytes = int(size.stdout.split()[0])
        available = int(mem.stdout.split()[1]) * 1024
    except (IndexError, ValueError):
        return f"page cache not warmed: cannot size {model_path} or read MemAvailable"
    gib = 1024**3
    if model_bytes > available * WARM_MAX_FRACTION:
        return (f"page cache not warmed: the model ({model_bytes / gib:.1f} GiB) is more than "
                f"{WARM_MAX_FRACTION:.0%} of MemAvailable ({available / gib:.1f} GiB)")  # fmt: skip
    read = host.command("find", model_path, "-type", "f", "-exec", "cat", "{}", "+")
    proc = subprocess.run(read, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        return f"page cache warming failed: {proc.stderr.strip()[-200:]}"
    mib = model_bytes / 1024**2
    return f"page cache warmed: read {mib:.1f} MiB of model files (MemAvailable {available / gib:.1f} GiB)"


def _save_diagnostics(verdict: Verdict, container: Container) -> None:
    folder = Path(verdict.diagnostics)
    folder.mkdir(parents=True, exist_ok=True)
    container.reload()
    attrs = {k: container.attrs.get(k) for k in ("Id", "Name", "Image", "State", "Config", "HostConfig")}
    env = attrs["Config"].get("Env") if attrs.get("Config") else None
    if env:  # the API key never lands on disk
        attrs["Config"] = {**attrs["Config"], "Env": [e for e in env if "API_KEY" not in e]}
    (folder / "container.json").write_text(json.dumps(attrs, indent=2, default=str) + "\n")


def _bring_up(container: Container, watch: Watcher, diagnostics: Path) -> Verdict:
    try:
        container.start()
    except APIError as exc:  # e.g. a ulimit or device the host's engine refuses: no process at all
        folder = diagnostics / time.strftime("%Y%m%dT%H%M%S")
        return Verdict(status="FAILED", elapsed_s=0.0, stage="container start", diagnostics=str(folder),
                       headline=f"docker could not start {container.name}: {exc.explanation or exc}")  # fmt: skip
    container.reload()  # a renamed container keeps its old name until reloaded
    verdict = watch(container.name)
    if verdict.status == "READY":
        container.update(restart_policy=RUNNING_POLICY)
    return verdict


def deploy(
    client: DockerClient,
    cfg: ServingConfig,
    image_id: str,
    watch: Watcher,
    warm: Callable[[], str],
    *,
    diagnostics: Path,
) -> Outcome:
    current = _get(client, CONTAINER)
    if is_converged(current, cfg, image_id):
        assert current is not None
        return Outcome(False, "unchanged", "the engine runs this image and configuration: not restarted",
                       image_id=image_id, started_at=current.attrs["State"]["StartedAt"])  # fmt: skip
    previous_image = current.attrs["Image"] if current is not None else None
    warm_report = warm()  # while the old container still serves
    if current is not None:
        _remove(client, PREVIOUS)
        current.stop(timeout=60)
        current.rename(PREVIOUS)
    _remove(client, CONTAINER)  # (a leftover of an interrupted run)
    new = client.containers.create(**cfg.container_kwargs(image_id))
    verdict = _bring_up(new, watch, diagnostics)
    if verdict.status == "READY":
        new.reload()
        started = new.attrs["State"]["StartedAt"]
        return Outcome(True, "deployed", verdict.first_line(), image_id=image_id, previous_image_id=previous_image,
                       warm=warm_report, verdict=asdict(verdict), started_at=started)  # fmt: skip
    _save_diagnostics(verdict, new)
    new.stop(timeout=10)
    _remove(client, FAILED)
    new.rename(FAILED)  # kept, stopped, for `docker logs specdeploy-engine-failed`
    outcome = Outcome(True, "failed", verdict.first_line(), image_id=image_id, previous_image_id=previous_image,
                      warm=warm_report, verdict=asdict(verdict))  # fmt: skip
    previous = _get(client, PREVIOUS)
    if previous is None:
        outcome.notes.append("no previous engine to roll back to")
        return outcome
    previous.rename(CONTAINER)
    back = _bring_up(previous, watch, diagnostics)
    outcome.rollback_verdict = asdict(back)
    if back.status == "READY":
        outcome.status = "rolled-back"
        outcome.notes.append(f"rolled back to the previous engine ({previous_image}): {back.first_line()}")
    else:
        outcome.notes.append(f"the previous engine did not come back either: {back.first_line()}")
    return outcome


def rollback(client: DockerClient, watch: Watcher, diagnostics: Path) -> Outcome:
    """`make rollback`: swap the running engine with the previous one (twice swaps back)."""
    previous = _get(client, PREVIOUS)
    if previous is None:
        raise SpecdeployError(f"there is no {PREVIOUS} container to roll back to", hint="deploy twice first")
    current = _get(client, CONTAINER)
    swapped = f"{CONTAINER}-swapping"
    if current is not None:
        current.stop(timeout=60)
        current.rename(swapped)
    previous.rename(CONTAINER)
    verdict = _bring_up(previous, watch, diagnostics)
    if current is not None:
        current.rename(PREVIOUS)
    status = "deployed" if verdict.status == "READY" else "failed"
    previous.reload()
    return Outcome(True, status, verdict.first_line(), image_id=previous.attrs["Image"],
                   previous_image_id=current.attrs["Image"] if current is not None else None,
                   verdict=asdict(verdict), started_at=previous.attrs["State"]["StartedAt"])  # fmt: skip


def status(client: DockerClient) -> dict[str, Any]:
    """The engine containers on a host: name, state, image, config digest, start time."""
    rows = {}
    for name in (CONTAINER, PREVIOUS, FAILED):
        container = _get(client, name)
        if container is None:
            continue
        state = container.attrs["State"]
        rows[name] = {
            "state": state["Status"],
            "exit_code": state.get("ExitCode"),
            "restarts": container.attrs.get("RestartCount", 0),
            "image": container.attrs["Image"],
            "tags": container.image.tags if container.image else [],
            "config": container.labels.get(CONFIG_LABEL),
            "started_at": state.get("StartedAt"),
        }
    return rows


def logs(client: DockerClient, name: str = CONTAINER, tail: int = 200) -> str:
    container = _get(client, name)
    if container is None:
        raise SpecdeployError(f"no container {name} on this host", hint="deploy first: make deploy")
    return bytes(container.logs(tail=tail)).decode(errors="replace")
