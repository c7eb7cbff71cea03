"""The base of every specdeploy action plugin. Plugins stay thin: they declare typed arguments
and call `act`; the rules live in the domain packages.

- Arguments are validated against ARGUMENTS (Ansible's own argument-spec validator, so types,
  choices and defaults behave as in modules).
- Secrets are never task arguments: `secret()` reads a variable (from ansible-vault) by name, so it
  appears in no task result, log line or -v output.
- One HostConnection per task: SSH settings as Ansible has them, one Docker client, the forward.
- A SpecdeployError is a failed result with its hint, never a Python traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from specdeploy.connection import HostConnection
from specdeploy.errors import SpecdeployError
from specdeploy.targets import CONNECTION_VARS

display = Display()


class SpecdeployAction(ActionBase):  # type: ignore[misc]
    TRANSFERS_FILES = False
    ARGUMENTS: ClassVar[dict[str, dict[str, Any]]] = {}
    # Check mode promises no change, and none of these actions can act half-way: one that changes a
    # host refuses check mode (failed, saying what to run) rather than building or rolling out for
    # real. The read-only ones set this False and run as usual.
    CHANGES_HOSTS: ClassVar[bool] = True

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        if self._task.check_mode and self.CHANGES_HOSTS:
            return {**result, "failed": True, "changed": False,
                    "msg": f"{self._task.action} changes the host and has no check mode: run without --check, or "
                           "only the phases that read (--tags preflight)"}  # fmt: skip
        self.task_vars = task_vars or {}
        _, args = self.validate_argument_spec(argument_spec=self.ARGUMENTS)
        try:
            out = self.act(args)
        except SpecdeployError as exc:
            out = {
                "failed": True,
                "changed": False,
                "msg": f"{exc.message}{f' (next: {exc.hint})' if exc.hint else ''}",
            }
        return {**result, **out}

    def act(self, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def hostvars(self) -> Mapping[str, Any]:
        return {k: self._templar.template(self.task_vars[k]) for k in CONNECTION_VARS if k in self.task_vars}

    @property
    def connection(self) -> HostConnection:
        if not hasattr(self, "_host_connection"):
            self._host_connection = HostConnection.from_hostvars(self.hostvars)
        return self._host_connection

    @property
    def host_name(self) -> str:
        return str(self.task_vars.get("inventory_hostname"))

    def secret(self, variable: str) -> str | None:
        """The value of a secret variable (vault), or None when unset or empty."""
        value = self._templar.template(self.task_vars.get(variable, ""))
        return str(value) if value else None

    def say(self, line: str) -> None:
        display.display(f"  {self.connection.target.host}: {line}")
