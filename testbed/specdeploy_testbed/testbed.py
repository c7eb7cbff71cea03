"""The local test bed: Debian 12 hosts with systemd and their own Docker engine, run as
containers on this machine's engine and reached over real SSH with verified host keys.

Everything is cached and reconciled, so `testbed up` on a warm test bed changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from docker.client import DockerClient
from docker.errors import BuildError, DockerException, NotFound
from docker.models.containers import Container
from rich.console import Console

from specdeploy import docker_engine, inventory
from specdeploy.controller_packages import ensure_command
from specdeploy.engine_image.base_image import ensure_base_image, step
from specdeploy.engine_image.profiles import BASE_IMAGE
from specdeploy.errors import SpecdeployError
from specdeploy.paths import state_dir
from specdeploy.targets import Target, probe
from specdeploy_testbed import fleet as testbed_fleet
from specdeploy_testbed import model_maker
from specdeploy_testbed.layout import SSH_USER, TestbedPaths, container_name, host_name, paths, port_base

TESTBED_DIR = Path(__file__).resolve().parent.parent  # testbed/ in the checkout
HOST_IMAGE_REPO = "specdeploy/testbed-host"
LABEL = "io.specdeploy.testbed"
BOOT_TIMEOUT_S = 90

console = Console(stderr=True, highlight=False)


# ---------------------------------------------------------------------------- images


def host_image_tag(base_id: str) -> str:
    """Content-addressed: the build context and the base image decide the tag."""
    digest = hashlib.sha256(base_id.encode())
    context = TESTBED_DIR / "docker-host"
    for file in sorted(context.rglob("*")):
        if file.is_file():
            digest.update(file.relative_to(context).as_posix().encode())
            digest.update(file.read_bytes())
    return f"{HOST_IMAGE_REPO}:{digest.hexdigest()[:12]}"


def ensure_host_image(client: DockerClient) -> str:
    tag = host_image_tag(ensure_base_image(client))
    try:
        client.images.get(tag)
        return tag
    except NotFound:
        pass
    with step(f"Building test-bed host image {tag}"):
        try:
            client.images.build(
                path=str(TESTBED_DIR / "docker-host"),
                tag=tag,
                buildargs={"BASE_IMAGE": BASE_IMAGE},
                rm=True,
            )
        except BuildError as exc:
            tail = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)[-1500:]
            raise SpecdeployError(f"building {tag} failed: {exc.msg}\n{tail}") from exc
    return tag


# ---------------------------------------------------------------------------- hosts


def ensure_ssh_key(tb: TestbedPaths) -> None:
    ensure_command("ssh", "openssh-client")  # ssh-keygen and the ssh client the probe uses
    if tb.key.is_file():
        return
    tb.root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specdeploy-testbed", "-f", str(tb.key)],
        check=True,
    )


def _key_fingerprint(tb: TestbedPaths) -> str:
    return hashlib.sha256(tb.key.with_suffix(".pub").read_bytes()).hexdigest()[:16]


def _run_host(client: DockerClient, name: str, image: str, port: int, tb: TestbedPaths) -> Container:
    # Docker-in-Docker with systemd as PID 1. --privileged is refused on this kernel (no
    # CAP_SYS_RESOURCE in the bounding set), so: every capability but that one, unconfined
    # seccomp/AppArmor, the host cgroup tree, and a volume for the inner engine's storage.
    return client.containers.run(
        image,
        name=container_name(name),
        hostname=name,
        detach=True,
        cap_add=["ALL"],
        cap_drop=["SYS_RESOURCE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        cgroupns="host",
        tmpfs={"/run": "", "/run/lock": ""},
        volumes={
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            f"{container_name(name)}-docker": {"bind": "/var/lib/docker", "mode": "rw"},
            str(tb.key.with_suffix(".pub")): {"bind": "/etc/specdeploy/authorized_keys", "mode": "ro"},
        },
        ports={"22/tcp": ("127.0.0.1", port)},
        labels={LABEL: name, f"{LABEL}.port": str(port), f"{LABEL}.key": _key_fingerprint(tb)},
    )


def _require_free_port(port: int) -> None:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise SpecdeployError(
                f"127.0.0.1:{port} is already in use, so test host SSH cannot bind there",
                hint="stop what holds it, or pick other ports: SPECDEPLOY_TESTBED_PORT_BASE=NNNN",
            ) from exc


def _wait_for_host_key(container: Container) -> list[str]:
    """Host public keys read through the engine: a trusted channel, so no trust-on-first-use."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        container.reload()
        if container.status != "running":
            raise SpecdeployError(f"test host {container.name} stopped while booting: {container.logs()[-500:]!r}")
        code, out = container.exec_run(
            ["sh", "-c", "systemctl is-active --quiet ssh && cat /etc/ssh/ssh_host_*_key.pub"]
        )
        if code == 0 and out.strip():
            return [line.split()[0] + " " + line.split()[1] for line in out.decode().splitlines() if line.strip()]
        time.sleep(0.5)
    raise SpecdeployError(f"test host {container.name} did not start sshd within {BOOT_TIMEOUT_S} s")


def _wait_for_published_ssh(name: str, port: int) -> None:
    """sshd active inside is not enough: on a fresh engine the published port's proxy reset the
    first connection (seen on a cold `make deploy`), so wait until sshd's banner comes through it."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                banner = sock.recv(64)
            if banner.startswith(b"SSH-"):
                return
            last = f"{banner[:40]!r} instead of an SSH banner"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise SpecdeployError(f"test host {name}'s SSH on 127.0.0.1:{port} gave no banner in {BOOT_TIMEOUT_S} s: {last}")


@dataclass(frozen=True)
class TestHost:
    name: str
    port: int
    host_keys: tuple[str, ...]

    @property
    def target(self) -> Target:
        return Target(host="127.0.0.1", user=SSH_USER, port=self.port)


def start_host(client: DockerClient, name: str, port: int, image: str | None = None) -> TestHost:
    """Reconcile one test host: keep it when it runs the current image, else (re)create it."""
    tb = paths()
    ensure_ssh_key(tb)
    image = image or ensure_host_image(client)
    try:
        container = client.containers.get(container_name(name))
        stale = None
        if container.image and image not in container.image.tags:
            stale = "its image is outdated"
        elif container.labels.get(f"{LABEL}.key") != _key_fingerprint(tb):
            stale = "it trusts another checkout's SSH key"
        if stale:
            with step(f"Replacing {name} ({stale})"):
                container.remove(force=True)
            raise NotFound("replaced")
        if container.labels.get(f"{LABEL}.port") != str(port):
            raise SpecdeployError(
                f"{name} already exists on port {container.labels.get(f'{LABEL}.port')}, not {port}",
                hint="make testbed-down first",
            )
        if container.status != "running":
            container.start()
    except NotFound:
        _require_free_port(port)
        with step(f"Starting {name} on 127.0.0.1:{port}"):
            try:
                container = _run_host(client, name, image, port, tb)
            except DockerException:
                remove_host(client, name)  # never leave a half-made host behind
                raise
    keys = _wait_for_host_key(container)
    _wait_for_published_ssh(name, port)
    return TestHost(name=name, port=port, host_keys=tuple(keys))


def _bridge_address(client: DockerClient, name: str) -> str:
    """Where the other test hosts reach this one (the Docker bridge), for the fleet's router."""
    attrs = client.containers.get(container_name(name)).attrs
    return str(attrs["NetworkSettings"]["IPAddress"])


def is_fleet() -> bool:
    tb = paths()
    return tb.inventory.is_file() and "\n    router:\n" in tb.inventory.read_text()


def remove_host(client: DockerClient, name: str, purge: bool = False) -> bool:
    try:
        container = client.containers.get(container_name(name))
    except NotFound:
        return False
    container.remove(force=True)
    if purge:
        with contextlib.suppress(NotFound):
            client.volumes.get(f"{container_name(name)}-docker").remove(force=True)
    return True


def known_hosts_lines(hosts: list[TestHost]) -> str:
    return "".join(f"[127.0.0.1]:{h.port} {key}\n" for h in hosts for key in h.host_keys)


def up(count: int = 1, fleet: bool = False, nnodes: int = 1) -> list[TestHost]:
    """Start COUNT hosts; with FLEET, their inventory puts them behind a router on the first; with
    NNODES > 1, each NNODES of them serve one engine (a multi-node engine, specdeploy.serve.group)."""
    if not 1 <= count <= 16:
        raise SpecdeployError(f"--hosts {count}: the test bed runs 1 to 16 hosts")
    if nnodes > 1 and (not fleet or count % nnodes):
        raise SpecdeployError(f"--nnodes {nnodes}: a multi-node test bed is a fleet (--fleet) of whole engines",
                              hint=f"testbed up --fleet --hosts {nnodes} --nnodes {nnodes}")  # fmt: skip
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    client = docker_engine.ensure_engine(state)
    base = port_base()
    try:
        hosts = [start_host(client, host_name(i), base + i - 1) for i in range(1, count + 1)]
    except DockerException as exc:
        raise SpecdeployError(f"the Docker engine refused a test-bed operation: {exc}") from exc
    tb = paths()
    # Throwaway hosts started by the tests add their own keys; keep them.
    extra = _foreign_known_hosts(tb, {h.port for h in hosts})
    inventory.write(tb.known_hosts, known_hosts_lines(hosts) + extra)
    text = inventory.render(
        [inventory.InventoryHost(h.name, h.target) for h in hosts],
        tb.ssh(),
        group="testbed",
        source="testbed up" + (" --fleet" if fleet else "") + (f" --nnodes {nnodes}" if nnodes > 1 else ""),
    )
    if fleet:
        addresses = [(h.name, _bridge_address(client, h.name)) for h in hosts]
        text += testbed_fleet.fleet_lines(addresses, tb.root, nnodes)
    inventory.write(tb.inventory, text)
    for h in hosts:
        probe(h.target, tb.ssh())  # real SSH, host key verified
    console.print(f"[green]✓[/] test bed up: {', '.join(f'{h.name} ({h.target})' for h in hosts)}")
    console.print(
        f"  inventory: {tb.inventory}\n  ssh: ssh -i {tb.key} -o UserKnownHostsFile={tb.known_hosts} "
        f"-p {hosts[0].port} {SSH_USER}@127.0.0.1"
    )
    return hosts


def prefetch_wheelhouse() -> threading.Thread:
    """Fetch the engine's wheelhouse (the model maker's and the image's, 0.9 GB) while the hosts come
    up: the two are independent, and each took about a minute of a cold deploy. The playbook's own
    call waits on the wheelhouse's lock, then finds it made; a failure here is left to that call,
    which reports it."""

    def fetch() -> None:
        with contextlib.suppress(Exception):
            model_maker.wheelhouse()

    thread = threading.Thread(target=fetch, name="wheelhouse-prefetch", daemon=True)
    thread.start()
    return thread


def _foreign_known_hosts(tb: TestbedPaths, ours: set[int]) -> str:
    if not tb.known_hosts.is_file():
        return ""
    lines = tb.known_hosts.read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not any(ln.startswith(f"[127.0.0.1]:{p} ") for p in ours))


def add_known_host(host: TestHost) -> None:
    """Record a (throwaway) test host's keys next to the test bed's own."""
    tb = paths()
    kept = _foreign_known_hosts(tb, {host.port})
    inventory.write(tb.known_hosts, kept + known_hosts_lines([host]))


def down(purge: bool = False) -> list[str]:
    client = docker_engine.connect()
    if client is None:
        console.print("no Docker engine is running: nothing to take down")
        return []
    removed = []
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        name = container.labels[LABEL]
        remove_host(client, name, purge=purge)
        removed.append(name)
    tb = paths()
    for stale in (tb.inventory, tb.known_hosts):
        stale.unlink(missing_ok=True)
    console.print(
        f"[green]✓[/] test bed down: removed {', '.join(removed) or 'nothing'}"
        + (" (and their engine volumes)" if purge else "")
    )
    return removed


def status() -> list[tuple[str, str, str]]:
    client = docker_engine.connect()
    if client is None:
        return []
    return [
        (c.labels[LABEL], c.status, f"127.0.0.1:{c.labels.get(f'{LABEL}.port')}")
        for c in client.containers.list(all=True, filters={"label": LABEL})
    ]
