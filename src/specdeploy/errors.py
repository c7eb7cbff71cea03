"""The one error type users see: a message and what to do about it, never a traceback."""

from __future__ import annotations


class SpecdeployError(Exception):
    """A failure the operator can act on. The CLI prints it and exits with status 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"
