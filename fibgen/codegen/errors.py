"""The code generator's error: an input its emitters cannot generate code for."""

from __future__ import annotations


class GenerateError(ValueError):
    """An input the emitters cannot generate code for; the message names what and where."""
