"""Exit codes, stderr lines and argument checks: what every command shares with the terminal.

Note [exit codes]
~~~~~~~~~~~~~~~~~
One rule for every command (the README says it to users):

- 0: the command did what was asked.
- 1: the input is wrong, as only reading it shows: a path named on the command line that
  does not exist or is of the wrong kind (a file where a folder is expected), a folder that
  holds nothing to work on, a definition name that the definitions do not have, errors in
  the files (diagnostics, bad JSON), a `--check` that found differences, a run that did not
  pass.
- 2: the command line itself is wrong, as it can be seen without reading any file: an
  unknown command or flag, a missing argument, a value of the wrong form (a number out of
  range, an unsupported file suffix, a name that cannot be a name or a Python package),
  flags that contradict each other; or an optional package the command needs is not
  installed (the message gives the `pip install` command).

The command-line checks run before anything heavy is imported, so that a typo is answered
at once rather than after torch has loaded.
"""

from __future__ import annotations

import argparse
import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def eprint(text: str) -> None:
    """Write ``text`` to stderr as one or more whole lines; nothing when it is empty."""
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")


def did_you_mean(name: str, known: list[str] | tuple[str, ...], n: int = 3) -> str:
    """``"; did you mean `a`, `b`?"`` for the names of ``known`` close to ``name``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    return f"; did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""


def positive_float(text: str) -> float:
    """An argparse type: a number greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number greater than 0, not {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def count(text: str) -> int:
    """An argparse type: a whole number, 0 or more."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text}")
    return value
