"""`fibgen build`, `check`, `fmt`, `import` and `list`: the commands that compile `.fidef` files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from fibgen.cli.console import eprint as _eprint


def _package_name(text: str) -> str:
    """An argparse type: a name the generated dispatchers' package may take."""
    from fibgen.codegen.python.packages import package_problem

    problem = package_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return text


def _without_sources(paths: list[str]) -> int | None:
    """EXIT_FAIL, said, when a folder among ``paths`` holds no `.fidef` file; else None.

    A mistyped folder (a dataset, a solutions folder) must not pass as "0 definitions".
    """
    empty = [p for p in paths if Path(p).is_dir() and next(Path(p).rglob("*.fidef"), None) is None]
    for folder in empty:
        hint = ""
        if (Path(folder) / "definitions").is_dir():
            hint = (
                "\n  = help: a dataset's definitions are JSON: `fibgen validate` checks a dataset"
            )
        _eprint(f"error: no .fidef files in {folder}{hint}")
    return EXIT_FAIL if empty else None


class _EntryPoints:
    """FlashInfer's traced entry points, read when the compiler asks (the sources declare
    `unroutable` ones), and why there are none where it is not installed."""

    def __init__(self) -> None:
        self.problem: str | None = None

    def __call__(self):
        from fibgen.format.fi_apis import FlashInferUnavailable, traced_apis

        try:
            return traced_apis()
        except FlashInferUnavailable as exc:
            self.problem = str(exc)
            return None


def _compile(paths: list[str], *, say_unchecked: bool = True):
    """Compile ``paths``, printing the diagnostics; ``say_unchecked``: note it where FlashInfer
    could not be read to check the `unroutable` declarations against (a command that needs it
    says so itself)."""
    from fibgen.compiler import compile_paths
    from fibgen.compiler.diagnostics import render_all

    entry_points = _EntryPoints()
    result = compile_paths(paths, entry_points)
    _eprint(render_all(result.diagnostics, result.sources))
    declared = result.module is not None and bool(result.module.unroutables())
    if entry_points.problem is not None and say_unchecked and declared:
        # Not an error of the sources, but what was not checked is said.
        _eprint(
            "note: the paths of `unroutable` declarations were checked only against each "
            f"other and the families, not against FlashInfer: {entry_points.problem}"
        )
    return result


def cmd_build(args: argparse.Namespace) -> int:
    from fibgen.codegen.python.packages import default_package
    from fibgen.codegen.writer import inputs_digest, up_to_date
    from fibgen.compiler import discover, read_source

    if _without_sources(args.paths) is not None:
        return EXIT_FAIL
    if Path(args.output).exists() and not Path(args.output).is_dir():
        _eprint(f"error: -o {args.output} is a file; give the folder to write into")
        return EXIT_FAIL
    if args.package is None:
        args.package = default_package(args.paths)
    # Fast path: nothing that the output depends on changed since the last build, and nobody
    # edited the output. Checked without importing the compiler or the generators.
    found, problems = discover(args.paths)
    digest = None
    if not problems and found:
        try:
            sources = [(item.stable, read_source(item.path)) for item in found]
        except (OSError, UnicodeDecodeError):
            sources = None
        if sources is not None:
            digest = inputs_digest(sources, f"package={args.package}")
            if up_to_date(Path(args.output), digest):
                print(f"{args.output} is up to date ({len(found)} source files)")
                return EXIT_OK
    return _build(args, digest)


def _build(args: argparse.Namespace, digest: str | None) -> int:
    from fibgen.codegen import generate
    from fibgen.codegen.writer import WriteError, write_files

    result = _compile(args.paths)
    if result.module is None:
        return EXIT_FAIL
    from fibgen.codegen.errors import GenerateError

    try:
        files = generate(result.module, package=args.package)
    except GenerateError as exc:
        _eprint(f"error: {exc}\n  = note: nothing was written")
        return EXIT_FAIL
    try:
        report = write_files(Path(args.output), files, check=args.check, inputs=digest)
    except WriteError as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        _eprint(f"error: cannot write into {args.output}: {exc.strerror or exc}{where}")
        return EXIT_FAIL
    n_defs = len(result.module.definitions)
    if args.check:
        if report.changed:
            sys.stdout.write(report.diff)
            _eprint(
                f"error: {args.output} is stale: {len(report.written)} file(s) would change, "
                f"{len(report.removed)} would be removed\n"
                f"  = help: run `fibgen build {' '.join(args.paths)} -o {args.output}`"
            )
            return EXIT_FAIL
        print(f"{args.output} is up to date ({n_defs} definitions, {len(files)} files)")
        return EXIT_OK
    print(
        f"built {n_defs} definitions into {args.output}: {len(report.written)} written, "
        f"{len(report.unchanged)} unchanged, {len(report.removed)} removed; dispatchers in "
        f"package {args.package} ({args.output}/python/{args.package}/)"
    )
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    if _without_sources(args.paths) is not None:
        return EXIT_FAIL
    result = _compile(args.paths)
    if result.module is None:
        return EXIT_FAIL
    # What the build would refuse to generate is an error of the check too.
    from fibgen.codegen import DEFAULT_PACKAGE
    from fibgen.codegen.errors import GenerateError
    from fibgen.codegen.python.dispatch.emit import plan_dispatch

    try:
        plan_dispatch(result.module, DEFAULT_PACKAGE)
    except GenerateError as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    print(f"ok: {len(result.module.definitions)} definitions in {len(result.module.files)} files")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    paths = args.paths
    if not paths:
        # As scaffold-solution and workloads do: the catalogue installed with fibgen, so the
        # command works in any folder, not only in a checkout that has definitions/.
        from fibgen.paths import definitions_dir

        paths = [str(definitions_dir())]
    if _without_sources(paths) is not None:
        return EXIT_FAIL
    result = _compile(paths, say_unchecked=not args.apis)
    if result.module is None:
        return EXIT_FAIL
    if args.by_definition:
        return _list_apis(result.module)
    if args.apis:
        return _list_entry_points(result.module)
    rows = [(d.name, d.op_type, f"{d.span.file}:{d.span.line}") for d in result.module.definitions]
    rows.sort()
    width = [max((len(r[i]) for r in rows), default=0) for i in range(2)]
    for name, op_type, where in rows:
        print(f"{name:<{width[0]}}  {op_type:<{width[1]}}  {where}")
    return EXIT_OK


def _list_entry_points(module) -> int:
    """FlashInfer's traced entry points: routed (by which families), declared unroutable
    (and why), or not yet covered, flagged; then the count of each."""
    from fibgen.compiler.coverage import api_coverage, route_text
    from fibgen.format.fi_apis import FlashInferUnavailable, TemplateUnavailable, traced_apis

    try:
        entry_points = traced_apis()
    except FlashInferUnavailable as exc:
        # An optional package the command needs (README, exit codes).
        _eprint(
            f"error: --apis lists FlashInfer's traced entry points from its installed source: "
            f"{exc}\n  = help: `fibgen list --by-definition` shows the API of each "
            "definition without it"
        )
        return EXIT_USAGE
    coverage = api_coverage(module, entry_points)
    rows = []
    for entry in coverage.entries:
        try:
            op_types = ", ".join(entry_points.op_types(entry.api))
        except TemplateUnavailable:
            op_types = "?"
        status = entry.status
        unroutable = entry.unroutable  # set when the status is "both" or "unroutable"
        if status in ("routed", "both"):
            n = len(entry.definitions)
            routes = route_text(entry.routes, entry.api.path)
            what = f"routed: {routes} ({n} definition{'s' if n != 1 else ''})"
            if status == "both" and unroutable is not None:
                what += f"; ALSO declared unroutable at {unroutable.span}"
        elif status == "unroutable" and unroutable is not None:
            what = f"unroutable: {unroutable.reason}"
        else:
            what = "NOT YET COVERED: neither routed nor declared unroutable"
        rows.append((entry.api.path, op_types, what))
    print(
        f"flashinfer {coverage.version} traces {len(coverage.entries)} API entry points "
        f"({entry_points.source.root})"
    )
    width = [max(len(r[i]) for r in rows) for i in range(2)] if rows else [0, 0]
    for path, op_types, what in rows:
        print(f"{path:<{width[0]}}  {op_types:<{width[1]}}  {what}")
    for route in coverage.untraced:
        print(
            f"note: family `{route.family}` routes `{route.path}` ({route.keyword}), which "
            f"flashinfer {coverage.version} does not trace"
        )
    for u in coverage.unknown:
        print(f"note: `unroutable {u.path}` at {u.span} names no traced entry point")
    for module, why in entry_points.unreadable:
        # Its entry points are unknown, so the list above lacks them: said, not left out.
        print(f"warning: {module} cannot be read ({why}): its traced entry points are not listed")
    print(coverage.summary())
    return EXIT_OK


def _list_apis(module) -> int:
    """Which API routes each definition, and why the others have none."""
    families = {f.name: f for f in module.families()}
    rows = []
    for d in sorted(module.definitions, key=lambda d: d.name):
        fam = families[d.family]
        if fam.api is not None:
            rules = f"{len(fam.rules)} rule{'s' if len(fam.rules) != 1 else ''}"
            plan = " + plan" if fam.plan is not None else ""
            rows.append((d.name, f"{fam.api.path}{plan} ({rules})"))
        else:
            rows.append((d.name, f"none: {fam.no_api or 'no reason given'}"))
    width = max((len(name) for name, _ in rows), default=0)
    for name, what in rows:
        print(f"{name:<{width}}  {what}")
    routed = [d for d in module.definitions if families[d.family].api is not None]
    apis = {families[d.family].api.path for d in routed}
    without = {d.family for d in module.definitions if families[d.family].api is None}
    print(
        f"{len(module.definitions)} definitions: {len(routed)} routed through {len(apis)} APIs, "
        f"{len(module.definitions) - len(routed)} with no api ({len(without)} families)"
    )
    return EXIT_OK


def cmd_fmt(args: argparse.Namespace) -> int:
    from fibgen.compiler.formatter import format_paths

    if _without_sources(args.paths) is not None:
        return EXIT_FAIL
    return format_paths(args.paths, check=args.check, out=sys.stdout, err=sys.stderr)


def cmd_import(args: argparse.Namespace) -> int:
    from fibgen.pipeline import import_paths

    return import_paths(
        args.inputs, Path(args.output), force=args.force, out=sys.stdout, err=sys.stderr
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `build`, `check`, `fmt`, `import` and `list` subcommands."""
    p = sub.add_parser("build", help="compile definitions and write generated files")
    p.add_argument("paths", nargs="+", metavar="DIR", help=".fidef files or folders")
    p.add_argument("-o", "--output", default="generated", help="output folder (default: generated)")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when the output is stale",
    )
    p.add_argument(
        "--package",
        default=None,
        type=_package_name,
        help="Python package of the dispatch modules (default: fibgen_kernels for the built-in "
        "catalogue, else <folder>_kernels after the first DIR)",
    )
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("check", help="compile definitions and report diagnostics only")
    p.add_argument("paths", nargs="+", metavar="DIR", help=".fidef files or folders")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "fmt",
        help="rewrite .fidef files in canonical form (comments kept, meaning checked unchanged)",
        description="Rewrite each .fidef file in place in canonical form: the layout fibgen "
        "prints, comments kept, its meaning checked unchanged before it is written. With "
        "--check nothing is written.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help=".fidef files or folders")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff of the files that are not formatted",
    )
    p.set_defaults(func=cmd_fmt)

    p = sub.add_parser("import", help="turn flashinfer-bench definition JSON into .fidef files")
    p.add_argument("inputs", nargs="+", metavar="JSON|DIR")
    p.add_argument("-o", "--output", required=True, help="folder for the .fidef files")
    p.add_argument("--force", action="store_true", help="overwrite existing .fidef files")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("list", help="list definitions with op_type and source location")
    p.add_argument(
        "paths",
        nargs="*",
        metavar="DIR",
        help=".fidef files or folders (default: the built-in catalogue)",
    )
    view = p.add_mutually_exclusive_group()
    view.add_argument(
        "--apis",
        action="store_true",
        help="show every API entry point the installed FlashInfer traces: routed (by which "
        "families), declared unroutable (and why), or not yet covered",
    )
    view.add_argument(
        "--by-definition",
        action="store_true",
        help="show the API that routes each definition, or why it has none (needs no FlashInfer)",
    )
    p.set_defaults(func=cmd_list)
