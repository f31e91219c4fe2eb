"""The progress line bench writes on stderr: rewritten in place on a terminal, a line every
few seconds in a log."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    """One line on stderr. On a terminal it is rewritten at most every ``tty_interval``
    seconds; in a log a new line comes at most every ``log_interval`` seconds, and only when
    it says something new. ``due`` says whether to show now; ``show`` writes the line."""

    def __init__(self, enabled: bool, tty_interval: float = 0.0, log_interval: float = 5.0):
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.interval = tty_interval if self.tty else log_interval
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = ""

    def due(self, final: bool = False) -> float | None:
        """The time now if a line is to be shown (always when ``final``), else None."""
        if not self.enabled:
            return None
        now = time.monotonic()
        if not final and now - self.last < self.interval:
            return None
        self.last = now
        return now

    def show(self, line: str) -> None:
        if not self.tty and line == self.shown:
            return  # a log gets a line when something changed
        sys.stderr.write(("\r\x1b[K" + line) if self.tty else line + "\n")
        sys.stderr.flush()
        self.shown = line

    def note(self, text: str) -> None:
        """A line of its own, above the progress line."""
        if not self.enabled:
            return
        sys.stderr.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        """End the line on a terminal (also when the run is interrupted)."""
        if self.enabled and self.tty and self.shown:
            sys.stderr.write("\n")
            self.shown = ""
