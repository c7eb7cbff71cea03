"""Where the engine runs: a host process, or a Docker container (local or over SSH).

Liveness comes from process or container state and exit codes, never from log text.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

try:
    from docker.errors import APIError
except ImportError:  # a bare GPU host watching a process has no Docker client (gpu_truth/on_device.py)

    class APIError(Exception):  # type: ignore[no-redef]
        """Never raised: without the Docker client there are no containers to watch."""


SIGKILL_EXIT = 137

# The compilers an engine runs while it builds kernels at start-up (SGLang's JIT through ninja and nvcc,
# Triton's ptxas, torch's cpp_extension). A quiet log while one runs is work, not a hang: SGLang 0.5.23
# built its WNA16 Marlin MoE kernel for 229 s and for over 240 s without a log line (H100, 2026-12-06).
KERNEL_BUILDERS = frozenset({"ninja", "nvcc", "cicc", "ptxas", "fatbinary", "nvlink", "cudafe++", "cc1plus", "cc1",
                             "c++", "g++", "gcc", "ld"})  # fmt: skip


def kernel_builders(process_names: Iterable[str]) -> list[str]:
    """The kernel compilers among PROCESS_NAMES (/proc/PID/comm), each once, sorted."""
    return sorted({name.strip() for name in process_names} & KERNEL_BUILDERS)


@dataclass(frozen=True)
class Liveness:
    alive: bool
    exit_code: int | None = None
    state: str = ""  # "running", "stopped (SIGSTOP)", "exited", ...
    oom_killed: bool = False
    restarts: int = 0
    note: str = ""  # why exit_code is None, when it is; or why the engine cannot be reached
    unreachable: bool = False  # our transport is down: no verdict on the engine, and no stall either
    lost: bool = False  # down for longer than the grace


class Source(Protocol):
    description: str

    def read_new(self) -> list[str]: ...
    def liveness(self) -> Liveness: ...
    def dump_stacks(self) -> str: ...
    def gpu_memory_mib(self) -> int | None: ...
    def kernel_builds(self) -> list[str]: ...  # compilers running in the engine's processes now


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _children(pid: int) -> list[int]:
    """All descendants of pid (engine core and workers are child processes)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def py_spy_binary(pid: int | None = None) -> str | None:
    """py-spy next to the engine's own interpreter or launcher (its venv/image), else ours, else PATH."""
    dirs = [Path(sys.executable).parent]
    if pid is not None:
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            dirs.insert(0, Path(argv0).parent)
        except (OSError, UnicodeDecodeError, IndexError):
            pass
    for directory in dirs:
        if (directory / "py-spy").is_file():
            return str(directory / "py-spy")
    return shutil.which("py-spy")


class ProcessSource:
    """An engine started on this machine: its pid, and the file its output goes to."""

    def __init__(self, pid: int, log_file: Path, popen: subprocess.Popen[Any] | None = None, py_spy: str | None = None):
        self.pid, self.log_file, self.popen = pid, log_file, popen
        self.py_spy = py_spy  # resolved at dump time: right after exec, /proc/PID/cmdline can be empty
        self.description = f"pid {pid} (log {log_file})"
        self._offset = 0
        self._partial = ""
        # Someone looked too late (the seeds' case): the log still holds the cause.
        self.dead_at_start = popen is None and _proc_state(pid) in {None, "Z", "X"}

    def read_new(self) -> list[str]:
        try:
            with self.log_file.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        text = self._partial + data.decode(errors="replace")
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished line waits for its end
        return [ln.rstrip("\r") for ln in lines]

    def liveness(self) -> Liveness:
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                return Liveness(False, 128 - code if code < 0 else code, "exited")
        if self.dead_at_start:
            return Liveness(False, None, "exited", note=f"exit status unknown: pid {self.pid} had exited before "
                                                         "the watch started")  # fmt: skip
        state = _proc_state(self.pid)
        if state is None or state in {"Z", "X"}:
            code = None
            if self.popen is not None:  # our child: /proc can show the zombie before poll() reaps it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.popen.wait(timeout=2)
                    code = 128 - code if code < 0 else code
                return Liveness(False, code, "exited")
            if self.popen is None:
                try:  # our child after all (e.g. started by a wrapper we exec'd)
                    _, status = os.waitpid(self.pid, os.WNOHANG)
                    code = os.waitstatus_to_exitcode(status) if status else None
                except ChildProcessError:
                    pass
            note = "" if code is not None else f"exit status unknown: pid {self.pid} is not this watchdog's child"
            return Liveness(False, 128 - code if code is not None and code < 0 else code, "exited", note=note)
        return Liveness(True, None, "stopped (SIGSTOP)" if state in {"T", "t"} else "running")

    def dump_stacks(self) -> str:
        self.py_spy = self.py_spy or py_spy_binary(self.pid)
        if not self.py_spy:
            return "py-spy is not installed here; no stack dump"
        dumps = []
        for pid in [self.pid, *_children(self.pid)]:
            proc = subprocess.run([self.py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60,
                                  check=False)  # fmt: skip
            dumps.append(f"=== py-spy dump --pid {pid} (exit {proc.returncode})\n{proc.stdout}{proc.stderr}")
        return "\n".join(dumps)

    def gpu_memory_mib(self) -> int | None:
        return _nvidia_smi_used(["nvidia-smi"])

    def kernel_builds(self) -> list[str]:
        names = []
        for pid in _children(self.pid):
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/comm").read_text())
        return kernel_builders(names)


def _nvidia_smi_used(prefix: list[str]) -> int | None:
    if shutil.which(prefix[0]) is None and prefix == ["nvidia-smi"]:
        return None
    try:
        proc = subprocess.run([*prefix, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    values = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", proc.stdout, re.M)]
    return sum(values) if proc.returncode == 0 and values else None


class ContainerSource:
    """An engine container, through the Docker SDK (a local engine or `ssh://user@host`)."""

    def __init__(self, container: Any) -> None:
        self.container = container
        self.description = f"container {container.name}"
        # This run's lines only: a restarted container (a rolled-back version) keeps its earlier
        # runs' log, whose stages and errors are not this start-up's.
        self._since: Any = _run_start(container)
        self._last_stamp: str | None = None
        self._no_nvidia_smi = False
        self._seen_at_since: set[str] = set()

    def read_new(self) -> list[str]:
        raw = self.container.logs(stdout=True, stderr=True, timestamps=True, since=self._since)
        entries = []
        # "\n" only: progress bars redraw with "\r", and docker stamps only what "\n" ends.
        for entry in raw.decode(errors="replace").split("\n"):
            if not entry.strip():
                continue
            stamp, _, text = entry.partition(" ")
            if not _STAMP.match(stamp):  # no stamp of its own: part of the line before
                stamp, text = self._last_stamp or "", entry
            # `since` is inclusive: skip the lines of the last second already read.
            if stamp == self._last_stamp and entry in self._seen_at_since:
                continue
            entries.append((stamp, entry, text))
        if entries:
            last = next((s for s, _, _ in reversed(entries) if s), None)
            if last:
                self._seen_at_since = {e for s, e, _ in entries if s == last}
                self._since = _parse_stamp(last)
                self._last_stamp = last
        # A redrawn progress bar: every state of it, each as a line.
        return [part for _, _, text in entries for part in text.split("\r") if part.strip()]

    def adopt_position(self, other: ContainerSource) -> None:
        """Carry on reading where OTHER (the same container, an older connection) stopped."""
        self._since, self._last_stamp, self._seen_at_since = other._since, other._last_stamp, other._seen_at_since
        self._no_nvidia_smi = other._no_nvidia_smi

    def liveness(self) -> Liveness:
        self.container.reload()
        state = self.container.attrs["State"]
        restarts = int(self.container.attrs.get("RestartCount", 0))
        if state.get("Running") and not state.get("Restarting"):
            return Liveness(True, None, "paused" if state.get("Paused") else "running", False, restarts)
        return Liveness(False, int(state.get("ExitCode", 0)), state.get("Status", "exited"),
                        bool(state.get("OOMKilled")), restarts)  # fmt: skip

    def dump_stacks(self) -> str:
        script = (
            "for p in /proc/[0-9]*; do n=${p#/proc/}; "
            "if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q python; then "
            'echo "=== py-spy dump --pid $n"; py-spy dump --pid $n 2>&1; fi; done'
        )
        try:
            code, out = self.container.exec_run(["sh", "-c", script])
        except APIError as exc:
            return f"stack dump failed: {exc}"
        text = out.decode(errors="replace")
        # One process py-spy cannot read (a short-lived child) must not hide the others' stacks.
        return text if code == 0 else f"(a stack dump exited {code}; what it read follows)\n{text}"

    def kernel_builds(self) -> list[str]:
        try:
            _, out = self.container.exec_run(["sh", "-c", "cat /proc/[0-9]*/comm 2>/dev/null"])
        except APIError:  # it died between two polls; liveness says so on the next one
            return []
        return kernel_builders(out.decode(errors="replace").splitlines()) if out else []

    def gpu_memory_mib(self) -> int | None:
        if self._no_nvidia_smi:
            return None
        try:
            code, out = self.container.exec_run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
            )
        except APIError:  # it died between two polls; liveness says so on the next one
            return None
        if code in (126, 127) or b"executable file not found" in out:
            self._no_nvidia_smi = True  # a CPU image: stop asking
        values = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", out.decode(errors="replace"), re.M)]
        return sum(values) if code == 0 and values else None


_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})$")


def _run_start(container: Any) -> datetime | None:
    """When the container's current run began (State.StartedAt), or None before its first start."""
    started = str(((getattr(container, "attrs", None) or {}).get("State") or {}).get("StartedAt") or "")
    return _parse_stamp(started) if _STAMP.match(started) and not started.startswith("0001-") else None


def _parse_stamp(stamp: str) -> datetime:
    # Docker gives RFC 3339 with nanoseconds; datetime keeps microseconds.
    trimmed = re.sub(r"(\.\d{6})\d*", r"\1", stamp.replace("Z", "+00:00"))
    return datetime.fromisoformat(trimmed)
