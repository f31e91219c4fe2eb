"""The runtime's error types: a bad apply configuration, a solution that failed or declined,
a call that strict mode refuses to fall back."""

from __future__ import annotations


class ApplyConfigError(ValueError):
    """``enable_apply`` was given something it cannot use (a mapping, a folder, a file)."""


class Decline(Exception):
    """Raised by a solution to hand a call back: the dispatcher then falls back as on a miss.

    The call goes to the original API (or the next family of a dispatch group), and stats
    count it under ``fallback_declined``, not ``hit``. Raise it before writing any output.
    A best-solution entry with ``on_miss="fallback"`` raises it on a var-axis key that no
    trace covers.
    """


class SolutionError(RuntimeError):
    """A solution matched a call but could not be loaded or raised while running.

    ``signature`` is set when the solution does not take the definition's inputs and
    outputs: for a name several families of one API could spell, another family's.
    """

    def __init__(
        self, message: str, definition: str | None, solution: str, *, signature: bool = False
    ) -> None:
        super().__init__(message)
        self.definition = definition
        self.solution = solution
        self.signature = signature


class FallbackError(RuntimeError):
    """Strict mode: a call would have fallen back (a miss, a failed rule, a decline)."""
