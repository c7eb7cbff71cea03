"""The rollout's record on the host: the phase it reached, the containers involved, and the last
version proven READY. Written atomically at every step, so that a rerun after any interruption
(the controller killed, SSH or dockerd gone) resumes from it instead of guessing from container
names."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from specdeploy.connection import CommandHost
from specdeploy.errors import SpecdeployError

PHASES = ("warming", "stopping-old", "starting-new", "watching", "benchmarking", "promoting", "rolling-back", "done")
RECORD_FILE = "rollout.json"
DEFAULT_STATE_DIR = "/var/lib/specdeploy/serving"  # serving_state_dir


@dataclass(frozen=True)
class EngineRef:
    """One engine container as the record knows it."""

    container_id: str
    image_id: str
    config: str  # the configuration digest (specdeploy.serve.config.ServingConfig.digest)
    proven_at: str | None = None  # when it was proven READY (a real completion), UTC
    bench: dict[str, Any] | None = None  # its benchmark gate's figures and hardware (specdeploy.gate)
    startup: list[dict[str, Any]] | None = None  # where its start-up's time went (watch.stages)


@dataclass
class RolloutRecord:
    phase: str = "done"
    new: EngineRef | None = None  # the version being rolled out, once created
    old: EngineRef | None = None  # what served when the rollout began
    last_ready: EngineRef | None = None  # the last version proven READY: what a failure restores
    updated_at: str = ""
    history: list[str] = field(default_factory=list)  # "time phase", the last few steps

    def proves(self, container_id: str) -> bool:
        return self.last_ready is not None and self.last_ready.container_id == container_id

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RolloutRecord:
        data: dict[str, Any] = json.loads(text) if text.strip() else {}
        refs = {k: EngineRef(**data[k]) if data.get(k) else None for k in ("new", "old", "last_ready")}
        if data.get("phase", "done") not in PHASES:
            raise SpecdeployError(f"the rollout record names an unknown phase {data.get('phase')!r}")
        return cls(
            phase=data.get("phase", "done"),
            updated_at=data.get("updated_at", ""),
            history=list(data.get("history", [])),
            **refs,
        )

    def describe(self) -> str:
        """What the record says is on the host, for a sentence to the operator."""
        ready = f"last READY: image {self.last_ready.image_id[7:19]}" if self.last_ready else "nothing proven READY"
        new = f", new: image {self.new.image_id[7:19]}" if self.new else ""
        return f"rollout phase '{self.phase}'{new}, {ready}"


class RecordStore(Protocol):
    def load(self) -> RolloutRecord: ...
    def save(self, record: RolloutRecord) -> None: ...


def stamp(record: RolloutRecord, phase: str) -> RolloutRecord:
    record.phase = phase
    record.updated_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record.history = [*record.history[-19:], f"{record.updated_at} {phase}"]
    return record


class HostRecordStore:
    """The record as a file under the serving state dir on the target, through SSH (root or sudo -n)."""

    def __init__(self, host: CommandHost, state_dir: str) -> None:
        self.host, self.path = host, f"{state_dir.rstrip('/')}/{RECORD_FILE}"

    def _run(self, script: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        # As root when we are, else through sudo: the state dir is root's, like current.json.
        wrapped = (
            f'if [ "$(id -u)" = 0 ]; then sh -c {shlex.quote(script)}; else sudo -n sh -c {shlex.quote(script)}; fi'
        )
        try:
            return subprocess.run(
                self.host.command("sh", "-c", wrapped),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise SpecdeployError(
                f"{self.host} did not answer within 60 s while reading/writing {self.path}",
                hint="check the host and the network, then rerun: make deploy",
            ) from exc

    def load(self) -> RolloutRecord:
        proc = self._run(f"cat {shlex.quote(self.path)} 2>/dev/null || true")
        if proc.returncode != 0:
            raise SpecdeployError(
                f"cannot read the rollout record {self.path} on {self.host}: {proc.stderr.strip()[-300:]}",
                hint="check SSH to the host, then rerun",
            )
        return RolloutRecord.from_json(proc.stdout)

    def save(self, record: RolloutRecord) -> None:
        path = shlex.quote(self.path)
        folder = shlex.quote(self.path.rsplit("/", 1)[0])
        script = f"umask 022 && mkdir -p {folder} && cat > {path}.tmp && sync {path}.tmp && mv -f {path}.tmp {path}"
        proc = self._run(script, record.to_json())
        if proc.returncode != 0:
            raise SpecdeployError(
                f"cannot write the rollout record {self.path} on {self.host}: {proc.stderr.strip()[-300:]}",
                hint="check SSH and sudo on the host, then rerun",
            )
