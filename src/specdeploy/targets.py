"""A deploy target named on the command line (`user@host[:port]`) and a real SSH probe of it.

The probe runs before Ansible so that an unreachable host, a refused user or an unknown host
key is reported as one clear sentence instead of an Ansible stack of UNREACHABLE output.
"""

from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from specdeploy.errors import SpecdeployError

_USER = r"[a-z_][a-z0-9_.-]{0,31}"
_HOSTNAME = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?"
_TARGET = re.compile(
    rf"^(?:(?P<user>{_USER})@)?(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>{_HOSTNAME}))(?::(?P<port>\d{{1,5}}))?$"
)
PROBE_TIMEOUT_S = 8


@dataclass(frozen=True)
class Target:
    host: str
    user: str | None = None
    port: int = 22

    @classmethod
    def parse(cls, spec: str) -> Target:
        match = _TARGET.match(spec.strip())
        if not match:
            raise SpecdeployError(
                f"HOST={spec!r} is not a valid target",
                hint="use HOST=host, HOST=user@host or HOST=user@host:port (IPv6: user@[::1]:22)",
            )
        port = int(match["port"] or 22)
        if not 1 <= port <= 65535:
            raise SpecdeployError(f"HOST={spec!r}: port {port} is outside 1-65535")
        return cls(host=match["ipv6"] or match["host"], user=match["user"], port=port)

    @property
    def name(self) -> str:
        """A filesystem- and inventory-safe name for this target."""
        return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{self.host}_{self.port}")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"


@dataclass(frozen=True)
class SshSettings:
    """How we talk SSH to a target: host keys are always verified against known_hosts files."""

    known_hosts: tuple[Path, ...] = ()
    identity_file: Path | None = None

    def options(self) -> list[str]:
        if any(any(c.isspace() for c in str(p)) for p in self.known_hosts):
            raise SpecdeployError("a known_hosts path contains whitespace, which ssh cannot take in a list")
        opts = ["-o", "StrictHostKeyChecking=yes"]
        if self.known_hosts:
            files = " ".join(str(p) for p in self.known_hosts)
            opts += ["-o", f"UserKnownHostsFile={files}"]
        if self.identity_file:
            opts += ["-o", f"IdentityFile={self.identity_file}", "-o", "IdentitiesOnly=yes"]
        return opts


# The host variables from_hostvars reads; action plugins template exactly these.
CONNECTION_VARS = (
    "inventory_hostname",
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_ssh_common_args",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
)


def from_hostvars(hostvars: Mapping[str, Any]) -> tuple[Target, SshSettings]:
    """The target and SSH settings of an inventory host (as our generated inventories write them)."""
    host = str(hostvars.get("ansible_host") or hostvars.get("inventory_hostname"))
    user = hostvars.get("ansible_user")
    target = Target(host=host, user=str(user) if user else None, port=int(hostvars.get("ansible_port") or 22))
    known: tuple[Path, ...] = ()
    args = shlex.split(str(hostvars.get("ansible_ssh_common_args") or ""))
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "-o" and i + 1 < len(args) else ""
        if value.startswith("UserKnownHostsFile="):
            known = tuple(Path(p) for p in value.split("=", 1)[1].split())
    key = hostvars.get("ansible_ssh_private_key_file") or hostvars.get("ansible_private_key_file")
    return target, SshSettings(known_hosts=known, identity_file=Path(str(key)) if key else None)


class Forward:
    """`ssh -L`: the target's 127.0.0.1:remote_port on a local port that stays the same when the
    SSH session drops and `ensure()` starts it again (a readiness probe keeps its URL)."""

    def __init__(self, target: Target, settings: SshSettings, remote_port: int, local_port: int = 0) -> None:
        self.target, self.settings, self.remote_port = target, settings, remote_port
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", local_port))
            except OSError as exc:
                hint = "choose another: LOCAL_PORT=8001 (make) or --local-port 8001"
                raise SpecdeployError(f"local port {local_port} is taken ({exc.strerror})", hint=hint) from exc
            self.local = int(sock.getsockname()[1])
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        cmd = ssh_command(self.target, self.settings)
        at = cmd.index("--")
        cmd[at:at] = ["-N", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=5",
                      "-L", f"127.0.0.1:{self.local}:127.0.0.1:{self.remote_port}"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + PROBE_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise diagnose_ssh_failure(self.target, self.proc.stderr.read() if self.proc.stderr else "")
            with socket.socket() as probe_sock:
                if probe_sock.connect_ex(("127.0.0.1", self.local)) == 0:
                    return
            time.sleep(0.1)
        raise SpecdeployError(f"the SSH port forward to {self.target} port {self.remote_port} did not come up")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure(self) -> bool:
        """Start it again if its SSH session died; False while that fails (the host is unreachable)."""
        if self.alive():
            return True
        self.stop()
        try:
            self.start()
        except SpecdeployError:
            self.stop()
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


@contextmanager
def forward_port(target: Target, settings: SshSettings, remote_port: int) -> Iterator[int]:
    """`ssh -L` for as long as needed. Engines bind their API to the host's loopback by default;
    readiness is proven through this."""
    forward = Forward(target, settings, remote_port)
    forward.start()
    try:
        yield forward.local
    finally:
        forward.stop()


def hold_forwards(forwards: Sequence[tuple[str, Forward]], say: Callable[[str], None], held: str,
                  poll_s: float = 1.0) -> None:  # fmt: skip
    """Keep each (name, forward) up until SIGINT/SIGTERM, restarting any whose SSH session died, then
    close them all (`specdeploy endpoint` and `specdeploy monitor`). HELD is said once Ctrl-C is caught
    here: said before, a Ctrl-C in between would end the command with a traceback's exit code."""
    stop = False

    def _stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    say(held)
    down: set[str] = set()
    try:
        while not stop:
            for name, forward in forwards:
                if forward.ensure():
                    if name in down:
                        say(f"{name}: forward restored")
                        down.discard(name)
                elif name not in down:
                    say(f"{name}: cannot reach the host; retrying (Ctrl-C to stop)")
                    down.add(name)
            time.sleep(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for _, forward in forwards:
            forward.stop()


# The first pattern found in ssh's stderr decides the diagnosis; ssh exits 255 for all of them.
_SSH_DIAGNOSES: tuple[tuple[str, str, str], ...] = (
    (
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "the host key of {t} has CHANGED since it was recorded (possible man-in-the-middle, or a reinstall)",
        "confirm the new key out of band, then remove the old entry: ssh-keygen -R '{kh}'",
    ),
    (
        "Host key verification failed",
        "the host key of {t} is not in known_hosts, and host keys are always verified",
        "verify its fingerprint out of band, then: ssh-keyscan -p {port} {host} >> ~/.ssh/known_hosts",
    ),
    (
        "Permission denied",
        "SSH login as '{user}' was refused by {t}",
        "check the user name (HOST=user@host) and that your key is in that user's authorized_keys",
    ),
    (
        "Could not resolve hostname",
        "cannot resolve host name '{host}'",
        "check the spelling, or use the IP address",
    ),
    ("Connection refused", "{t} is unreachable: connection refused", "is sshd running there, on that port?"),
    ("timed out", "{t} is unreachable: connection timed out", "check the address, routing and firewalls"),
    ("No route to host", "{t} is unreachable: no route to host", "check the address and the network"),
    ("Network is unreachable", "{t} is unreachable: network is unreachable", "check the address"),
)


def diagnose_ssh_failure(target: Target, stderr: str) -> SpecdeployError:
    """Turn ssh's stderr into one actionable error."""
    user = target.user or "(your local user name)"
    fields = {"t": str(target), "host": target.host, "port": target.port, "user": user}
    fields["kh"] = f"[{target.host}]:{target.port}" if target.port != 22 else target.host
    for needle, message, hint in _SSH_DIAGNOSES:
        if needle in stderr:
            return SpecdeployError(message.format(**fields), hint=hint.format(**fields))
    last = next((ln for ln in reversed(stderr.strip().splitlines()) if ln.strip()), "no output")
    return SpecdeployError(f"SSH to {target} failed: {last}")


def ssh_command(target: Target, settings: SshSettings, *remote: str) -> list[str]:
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={PROBE_TIMEOUT_S}", *settings.options()]
    cmd += ["-p", str(target.port)]
    if target.user:
        cmd += ["-l", target.user]
    return [*cmd, "--", target.host, *remote]


def probe(target: Target, settings: SshSettings) -> None:
    """Log in over real SSH and check Ansible can run there; raise a clear error if not."""
    try:
        result = subprocess.run(
            ssh_command(target, settings, "command -v python3 || echo specdeploy-no-python3"),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S * 3,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SpecdeployError("the 'ssh' client is not installed", hint="apt-get install openssh-client") from exc
    except subprocess.TimeoutExpired as exc:
        raise SpecdeployError(f"{target} did not answer SSH within {PROBE_TIMEOUT_S * 3} s") from exc
    if result.returncode == 255:
        raise diagnose_ssh_failure(target, result.stderr)
    if "specdeploy-no-python3" in result.stdout:
        raise SpecdeployError(
            f"{target} has no python3, which Ansible needs on the target",
            hint="install it there first: apt-get install -y python3",
        )
    if result.returncode != 0:
        raise SpecdeployError(f"probe command on {target} exited {result.returncode}: {result.stderr.strip()}")
