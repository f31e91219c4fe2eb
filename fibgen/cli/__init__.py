"""The `fibgen` command: the argument parser, the registry of commands, and `main()`.

One module of this package per command group, each with `register(subparsers)`: it parses its
arguments, calls the library, prints, and returns an exit code (`console.py`). `build.py` holds
the commands that compile (build, check, fmt, import, list); `workloads.py`, `scaffold.py`
(scaffold-solution, pack), `bench.py` (bench, report) and `validate.py` the others; `demo.py`
the tour of a generated dispatcher (`python -m fibgen.demo`). Importing this package loads no
compiler, code generator or runtime: each command imports what it drives when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import warnings

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from fibgen.cli.console import eprint as _eprint

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `fibgen` command."""
    parser = argparse.ArgumentParser(
        prog="fibgen",
        description="Kernel definitions for LLM serving: compile .fidef files, generate code.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


# The commands, in the order `fibgen --help` lists them; each module has `register(subparsers)`
# adding its subcommand(s) with `set_defaults(func=...)` (the function returns an exit code).
_COMMAND_MODULES: tuple[str, ...] = (
    "fibgen.cli.build",
    "fibgen.cli.workloads",
    "fibgen.cli.scaffold",
    "fibgen.cli.bench",
    "fibgen.cli.validate",
)


def _show_warning(
    message, category, filename, lineno, file=None, line=None
) -> None:  # noqa: ANN001
    _eprint(f"warning: {message}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fibgen` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with warnings.catch_warnings():
            # A warning is a line for the person at the terminal, not a Python source location.
            warnings.showwarning = _show_warning
            return args.func(args)
    except KeyboardInterrupt:
        _eprint("interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_OK
