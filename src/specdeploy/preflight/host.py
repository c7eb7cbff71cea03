"""Preflight checks of the host's disk and serving port, refused before anything changes.

The preflight role reads `df` and `ss` on the host; the rules live here."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specdeploy.engine_image import profiles

GIB = 1024**3
# The free space an image build needs under the Docker data root is each profile's build_space_gib
# (specdeploy.engine_image.profiles); an unknown profile is given the largest.
REBUILD_MARGIN_GIB = 2  # an image of the profile is there already: a rebuild reuses most layers
_USERS = re.compile(r'\("(?P<name>[^"]+)",pid=(?P<pid>\d+)')


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    processes: tuple[tuple[str, int], ...]  # (name, pid), as ss -p names them (root only)


def parse_ss(text: str) -> list[Listener]:
    """`ss -ltnpH`: `LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:(("docker-proxy",pid=1234,fd=4))`."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or ":" not in fields[3]:
            continue
        address, _, port = fields[3].rpartition(":")
        if not port.isdigit():
            continue
        users = tuple((m["name"], int(m["pid"])) for m in _USERS.finditer(line))
        out.append(Listener(address.strip("[]"), int(port), users))
    return out


def port_problems(listeners: list[Listener], port: int, own_engine_publishes: bool, host: str,
                  own_pids: frozenset[int] = frozenset()) -> list[str]:  # fmt: skip
    """A listener on the serving port that is not our own engine's: Docker's proxy for it, or (an engine on
    the host's network, as a multi-node one runs) a process of its container, OWN_PIDS."""
    foreign = []
    for listener in listeners:
        if listener.port != port:
            continue
        names = {name for name, _ in listener.processes}
        if own_engine_publishes and (not names or names <= {"docker-proxy"}):
            continue
        if listener.processes and {pid for _, pid in listener.processes} <= own_pids:
            continue
        who = ", ".join(f"PID {pid} ({name})" for name, pid in listener.processes) or "a process ss cannot name"
        foreign.append(f"{listener.address}:{port} is held by {who}")
    if not foreign:
        return []
    return [f"{host}: the serving port {port} is taken: {'; '.join(foreign)}. Stop it, or set serving_port "
            "to a free port"]  # fmt: skip


def parse_free(text: str) -> dict[str, int]:
    """Lines of `PATH FREE_BYTES` (the preflight role's df over each path's nearest existing folder)."""
    out = {}
    for line in text.splitlines():
        path, _, free = line.strip().rpartition(" ")
        if path and free.isdigit():
            out[path] = int(free)
    return out


def build_space_needed(profile: str, image_present: bool) -> int:
    if image_present:
        return REBUILD_MARGIN_GIB * GIB
    known = profiles.PROFILES.get(profile)
    gib = known.build_space_gib if known else max(p.build_space_gib for p in profiles.PROFILES.values())
    return gib * GIB


def space_problem(host: str, what: str, path: str, free: int, *, needed: int, variable: str) -> str | None:
    if free >= needed:
        return None
    return (f"{host}: {free / GIB:.1f} GiB free under {path} ({what}), {needed / GIB:.0f} GiB needed. Free space "
            f"there, or lower {variable} if you know better")  # fmt: skip


ENGINE_IMAGE_TAG = "engine_image"  # the engine image phase's one name: package, role, tag, plugins


def build_runs(run_tags: object, skip_tags: object) -> bool:
    """Whether this run's tags reach the Build play, so the build's disk space matters.

    A run of preflight alone asks "can this host take the stack?" and is answered for the build too;
    `--tags preflight,provision` builds nothing, and refusing it for image space would be wrong."""
    run = {str(t) for t in run_tags} if isinstance(run_tags, list | tuple | set) else {"all"}
    skip = {str(t) for t in skip_tags} if isinstance(skip_tags, list | tuple | set) else set()
    if ENGINE_IMAGE_TAG in skip:
        return False
    return bool(run & {"all", ENGINE_IMAGE_TAG}) or run == {"preflight"}


# `timeout`'s exits when the command ran past its bound (124), or ignored the TERM and was killed: timeout
# then kills its own process group, itself included (-9 as Python's subprocess, and Ansible, read it; 137 in a shell).
TIMED_OUT_EXITS = (124, 137, -9)


def timed_out(exit_code: object) -> bool:
    """Whether a command run under `timeout` was stopped by it."""
    return exit_code in TIMED_OUT_EXITS


def docker_unanswered(host: str, seconds: object) -> str:
    """The refusal of a host whose Docker daemon does not answer `docker info` within SECONDS (a hung
    dockerd blocks every docker command without end): said in the Preflight play, so no host is
    changed (the play is fatal to the whole run)."""
    return (f"{host}: the Docker engine did not answer `docker info` within {seconds} s (its daemon hangs); "
            f"nothing was changed on any host. On {host}: `systemctl status docker` and `journalctl -u docker -n 50`, "
            "then `systemctl restart docker` (the containers keep running), then make deploy again")  # fmt: skip


def host_problems(host: str, reads: dict[str, object], options: dict[str, object]) -> list[str]:
    """Disk and port, from the preflight role's reads (see roles/preflight/tasks/host.yml)."""
    free = parse_free(str(reads.get("free", "")))
    out = []
    docker_root, model_path = str(reads.get("docker_root") or "/var/lib/docker"), str(options["model_path"])
    build_gib = options.get("build_free_gb")
    needed = int(float(str(build_gib)) * GIB) if build_gib not in (None, "") else build_space_needed(
        str(options.get("profile", "")), bool(reads.get("image_present")))  # fmt: skip
    checks = [("the model's filesystem", model_path, int(float(str(options.get("model_free_gb", 1))) * GIB),
               "preflight_model_free_gb")]  # fmt: skip
    if build_runs(options.get("run_tags", ["all"]), options.get("skip_tags", [])):
        checks.insert(0, ("the Docker data root, for the image build", docker_root, needed, "preflight_build_free_gb"))
    for what, path, need, variable in checks:
        if path in free and (problem := space_problem(host, what, path, free[path], needed=need, variable=variable)):
            out.append(problem)
    port = int(str(options["port"]))
    pids = reads.get("own_pids") or []
    own = frozenset(int(pid) for pid in pids) if isinstance(pids, list) else frozenset()
    out += port_problems(parse_ss(str(reads.get("listeners", ""))), port, bool(reads.get("own_engine_publishes")), host,
                         own)  # fmt: skip
    return out
