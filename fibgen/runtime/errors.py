"""The runtime's error types: a bad apply configuration, and a solution that failed."""

from __future__ import annotations


class ApplyConfigError(ValueError):
    """``enable_apply`` was given something it cannot use (a mapping, a folder, a file)."""


class SolutionError(RuntimeError):
    """A solution matched a call but could not be loaded or raised while running."""

    def __init__(self, message: str, definition: str, solution: str) -> None:
        super().__init__(message)
        self.definition = definition
        self.solution = solution
