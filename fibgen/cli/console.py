"""Exit codes and stderr lines: what every command shares with the terminal.

Exit codes: 0 success; 1 the input has errors (diagnostics), or `--check` found differences;
2 the command line itself is wrong.
"""

from __future__ import annotations

import sys

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def eprint(text: str) -> None:
    """Write ``text`` to stderr as one or more whole lines; nothing when it is empty."""
    if text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
