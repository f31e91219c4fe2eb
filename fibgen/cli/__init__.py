"""The `fibgen` command: the argument parser, the registry of commands, and `main()`.

One module of this package per command group, each with `register(subparsers)`: it parses its
arguments, calls the library, prints, and returns an exit code (`console.py`, Note [exit
codes]). `build.py` holds the commands that compile (build, check, fmt, import, list);
`workloads.py`, `scaffold.py` (scaffold-solution, pack), `bench.py` (bench, report) and
`validate.py` the others; `demo.py` the tour of a generated dispatcher (`python -m
fibgen.demo`). Importing this package loads no compiler, code generator or runtime, nor torch:
each command imports what it drives when it runs, after its arguments are checked.
"""

from __future__ import annotations

import argparse
import importlib
import warnings

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE, did_you_mean
from fibgen.cli.console import eprint as _eprint

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]


class Parser(argparse.ArgumentParser):
    """argparse with a did-you-mean for a mistyped choice (a command, ``--language`` ...)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        # argparse's own check, with the closest choices named; the rest of argparse is as is.
        choices = action.choices
        if choices is not None and value not in choices:
            names = [str(c) for c in choices]
            raise argparse.ArgumentError(
                action,
                f"invalid choice: {value!r}{did_you_mean(str(value), names)} "
                f"(choose from {', '.join(names)})",
            )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"fibgen {version('fibgen')}"
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "fibgen (not installed: no version recorded)"


class _Version(argparse.Action):
    # argparse's own "version" action formats its text when the parser is built; this one
    # reads the installed metadata only when --version is given.
    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print fibgen's version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        print(_version())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `fibgen` command."""
    parser = Parser(
        prog="fibgen",
        description="Kernel definitions for LLM serving: compile .fidef files, generate code.",
        epilog="Exit codes: 0 ok; 1 the input is wrong (missing or bad files, failed checks); "
        "2 the command line is wrong, or an optional package it needs is not installed.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported by its command, with the closest flags."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _subparser(parser, args.command)
        flags = [s for a in command._actions for s in a.option_strings]
        hints = "".join(
            f"\n  {x}: {did_you_mean(x.split('=')[0], flags)[2:]}"
            for x in extras
            if x.startswith("-") and did_you_mean(x.split("=")[0], flags)
        )
        command.error(f"unrecognized arguments: {' '.join(extras)}{hints}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fibgen` console script."""
    parser = build_parser()
    args = _parse(parser, argv)
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
