"""Docker log lines with redrawn progress bars ("\r", stamped once) and the `since` overlap."""

from __future__ import annotations

from typing import ClassVar

from specdeploy.watch.sources import ContainerSource


class RecordedLogs:
    """Replays `docker logs --timestamps` output captured in the shape a real engine produces."""

    name = "engine"

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.since: list[object] = []

    def logs(self, **kwargs: object) -> bytes:
        self.since.append(kwargs["since"])
        return self.chunks.pop(0) if self.chunks else b""


def test_progress_bar_redraws_are_lines_and_unstamped_parts_do_not_break_parsing():
    first = (
        b"2026-11-30T01:04:56.318269011Z INFO starting\n"
        b"2026-11-30T01:04:57.000000001Z Loading shards:   0% 0/1\rLoading shards: 100% 1/1\n"
        b"Loading safetensors checkpoint shards: 100% Completed\n"
    )
    again = b"2026-11-30T01:04:57.000000001Z Loading shards:   0% 0/1\rLoading shards: 100% 1/1\n"
    logs = RecordedLogs([first, again + b"2026-11-30T01:04:58.5Z INFO ready\n"])
    source = ContainerSource(logs)
    assert source.read_new() == [
        "INFO starting",
        "Loading shards:   0% 0/1",
        "Loading shards: 100% 1/1",
        "Loading safetensors checkpoint shards: 100% Completed",
    ]
    # The overlapping second (since is inclusive) is not read twice.
    assert source.read_new() == ["INFO ready"]
    assert logs.since[0] is None and logs.since[1].isoformat().startswith("2026-11-30T01:04:57")


class RestartedLogs(RecordedLogs):
    """A container restarted by a rollback: Docker keeps its earlier runs' lines in its log."""

    attrs: ClassVar[dict[str, dict[str, str]]] = {"State": {"StartedAt": "2026-12-02T02:24:24.912345678Z"}}


def test_a_restarted_container_is_read_from_its_current_run_only():
    logs = RestartedLogs([b"2026-12-02T02:24:31.1Z INFO this run\n"])
    assert ContainerSource(logs).read_new() == ["INFO this run"]
    assert logs.since[0].isoformat() == "2026-12-02T02:24:24.912345+00:00"
    never_started = RecordedLogs([b""])
    never_started.attrs = {"State": {"StartedAt": "0001-01-01T00:00:00Z"}}  # type: ignore[attr-defined]
    ContainerSource(never_started).read_new()
    assert never_started.since == [None]
