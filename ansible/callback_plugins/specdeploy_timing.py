"""Each task's wall time added to its role, written as JSON for the table at the end of `make deploy`
(specdeploy.timing). Records only, and only when SPECDEPLOY_TIMING_FILE names a file."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: specdeploy_timing
type: aggregate
short_description: Seconds per role, for the table at the end of make deploy
description:
  - Adds each task's wall time (from its start to the next task's start) to its role, or to its play
    when it has no role, and writes them as JSON to the file named by E(SPECDEPLOY_TIMING_FILE).
  - Does nothing when that variable is not set.
requirements:
  - E(SPECDEPLOY_TIMING_FILE) set (specdeploy deploy sets it).
"""


class CallbackModule(CallbackBase):  # type: ignore[misc]
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "specdeploy_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.path = os.environ.get("SPECDEPLOY_TIMING_FILE", "")
        self.started = time.monotonic()
        self.play = ""
        self.current: tuple[str, float] | None = None  # (its role or play, when it started)
        self.roles: dict[str, float] = {}

    def _close(self) -> None:
        if self.current:
            owner, began = self.current
            self.roles[owner] = self.roles.get(owner, 0.0) + time.monotonic() - began
            self.current = None

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close()
        self.play = play.get_name().strip()

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._close()
        # Task.get_name(), Ansible's public name of a task: "ROLE : TASK" inside a role.
        role, _, _ = str(task.get_name()).rpartition(" : ")
        self.current = (role or f"play: {self.play.split('|')[0].strip()}", time.monotonic())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        """A handler's seconds are its role's (ansible-core calls this hook with the task alone)."""
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close()
        if not self.path:
            return
        doc = {"total_s": round(time.monotonic() - self.started, 1),
               "roles": {k: round(v, 1) for k, v in self.roles.items()}}  # fmt: skip
        with open(self.path, "w", encoding="utf-8") as out:
            json.dump(doc, out)
