"""The `bench` and `report` commands: benchmark solutions on a dataset, and report on it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fibgen.cli.console import EXIT_FAIL, EXIT_OK, EXIT_USAGE, count, positive_float, positive_int
from fibgen.cli.console import eprint as _eprint

EXIT_INTERRUPTED = 130  # as a shell reports a process that SIGINT ended
NOISY_PERCENT = 25  # fibgen.bench.runner.NOISY_SPREAD, without importing torch at start-up


def _list(values: list[str]) -> tuple[str, ...]:
    # Accept both `--definitions a b` and `--definitions a,b`.
    return tuple(p for v in values for p in v.split(",") if p)


def _default_devices() -> str:
    import torch

    if torch.cuda.is_available():
        return ",".join(f"cuda:{i}" for i in range(torch.cuda.device_count()))
    return "cpu"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` and `report` subcommands."""
    p = subparsers.add_parser(
        "bench",
        help="run every solution on every workload of a dataset and append traces",
        description=(
            "For every definition × workload × solution of DATASET: run the solution in a "
            "fresh process of its own, compare it with the reference in the worker process "
            "that started it (a sampler by the distribution of its draws; inputs the solution "
            "changed fail it), time it, and append a Trace line to "
            "traces/<op_type>/<definition>.jsonl. A crash or hang marks that solution "
            "RUNTIME_ERROR or TIMEOUT and the run goes on. Solutions are found at any depth "
            "under DATASET/solutions; a solution folder runs from its files (and is packed "
            "first when they changed). On a CPU, workers run torch with one thread and Triton "
            "under its interpreter; timings are medians with their spread in the trace's log. "
            "Exit 1 when a run did not pass or could not run; the last line says which."
        ),
    )
    p.add_argument("dataset", metavar="DATASET", help="dataset folder (definitions/, workloads/)")
    p.add_argument(
        "--definitions",
        nargs="+",
        default=[],
        metavar="NAME",
        help="only these definitions (names or glob patterns; one that matches nothing is "
        "an error)",
    )
    p.add_argument(
        "--solutions",
        nargs="+",
        default=[],
        metavar="NAME_OR_PATH",
        help="solution names or patterns to run, and/or solution JSON files or folders to add "
        "to the dataset's; files or folders alone run only what they hold (a pattern that "
        "matches nothing, and a folder that holds no solution, are errors)",
    )
    p.add_argument(
        "--devices",
        default=None,
        help="comma-separated devices, one worker each: cuda:0,cuda:1 or cpu, checked "
        "against this machine first (default: every CUDA device, else cpu)",
    )
    p.add_argument("--resume", action="store_true", help="skip runs already in traces/")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        help="seconds per solution and workload (120; a sampler gets 5 times it)",
    )
    p.add_argument("--warmup", type=count, default=3, help="untimed calls before timing (3)")
    p.add_argument(
        "--repeat",
        type=positive_int,
        default=None,
        help="timed calls (default: as many as fit in 100 ms, at least 10 on a GPU and 30 "
        "on a CPU)",
    )
    p.add_argument(
        "--flush",
        choices=("read", "zero", "none"),
        default="read",
        help="how L2 is flushed before each timed call on a GPU: read a large buffer (default), "
        "zero it as triton.testing.do_bench does, or not at all",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs (0)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run on a Ray cluster, one worker per GPU (or CPU with --devices cpu) of it: "
        "HOST:PORT or ray://HOST:PORT joins a cluster, auto the one this machine is in, no "
        "ADDRESS starts a local Ray instance (put --ray after DATASET); needs "
        "`pip install 'fibgen[ray]'`",
    )
    p.add_argument(
        "--retries",
        type=count,
        default=2,
        metavar="N",
        help="with --ray: how often a job whose worker or node was lost is sent again (2)",
    )
    p.set_defaults(func=cmd_bench)

    r = subparsers.add_parser(
        "report",
        help="per definition: solutions, pass/fail counts, speedups, best per workload",
    )
    r.add_argument("dataset", metavar="DATASET", help="dataset folder holding traces/")
    r.add_argument("--format", choices=("text", "md", "json"), default="text")
    r.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw speedup per workload into FILE (.png, .svg, .pdf ...; needs "
        "`pip install 'fibgen[plot]'`); its folder is made if missing",
    )
    r.set_defaults(func=cmd_report)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 1 when a run did not pass or could not run.

    The last line says whether every run passed; notes on what was not run, packed or timed
    noisily go to stderr before it.
    """
    problem = _dataset_problem(args.dataset)
    if problem is not None:
        _eprint(f"error: {problem}")
        return EXIT_FAIL
    from fibgen.bench import ray_runner
    from fibgen.bench.runner import (
        BenchError,
        BenchOptions,
        BenchSummary,
        DeviceError,
        check_devices,
        run_bench,
    )
    from fibgen.format import FormatError

    # On a cluster the devices are the cluster's: without --devices, its GPUs if it has any.
    given = args.devices if args.devices is not None or args.ray else _default_devices()
    devices = () if given is None else tuple(d.strip() for d in given.split(","))
    try:
        if args.ray:
            ray_runner.device_kind(devices)
            ray_runner.import_ray()
        else:
            devices = check_devices(devices)
    except (DeviceError, ray_runner.RayMissing) as exc:
        # A device the machine lacks is a wrong --devices; Ray missing, an optional package
        # (Note [exit codes] in fibgen/cli/console.py).
        _eprint(f"error: {exc}")
        return EXIT_USAGE
    options = BenchOptions(
        devices=devices,
        definitions=_list(args.definitions),
        solutions=_list(args.solutions),
        resume=args.resume,
        timeout=args.timeout,
        warmup=args.warmup,
        repeat=args.repeat,
        seed=args.seed,
        flush=args.flush,
    )
    summary: BenchSummary
    try:
        if args.ray:
            ray = ray_runner.RayOptions(address=args.ray, retries=args.retries)
            summary = ray_runner.run_bench_ray(args.dataset, options, ray, progress=not args.quiet)
        else:
            summary = run_bench(args.dataset, options, progress=not args.quiet)
    except (BenchError, FormatError) as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items())) or "none"
    print(f"{summary.traces} traces written ({counts}); {summary.skipped} already traced, skipped")
    for path in sorted(summary.trace_files):
        print(f"  {path}")
    for note in summary.notes:
        _eprint(f"note: {note}")
    for who, runs in sorted(summary.claimed.items()):
        _eprint(
            f"note: skipped {runs} run(s) that another bench on {args.dataset} is running "
            f"({who}); its traces will hold them"
        )
    if summary.noisy:
        _eprint(
            f"note: {len(summary.noisy)} timing(s) spread more than "
            f"{NOISY_PERCENT}% around their median (a busy machine?); their speedups are "
            "not to be trusted:"
        )
        for line in summary.noisy[:10]:
            _eprint(f"  {line}")
        if len(summary.noisy) > 10:
            _eprint(f"  ... and {len(summary.noisy) - 10} more")
    for problem in summary.problems:
        _eprint(f"error: {problem}")
    sys.stderr.flush()
    print(summary.verdict(args.dataset))
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAIL if summary.problems or summary.failed else EXIT_OK


def _dataset_problem(dataset: str) -> str | None:
    """Why ``dataset`` cannot be a dataset folder, seen before anything heavy is imported."""
    path = Path(dataset)
    if not path.exists():
        return f"dataset folder {dataset} does not exist"
    if not path.is_dir():
        return f"{dataset} is not a folder; give the dataset folder"
    return None


def _plot_problem(target: str) -> tuple[int, str] | None:
    """(exit code, message) when the report cannot be drawn into ``target``; checked before
    the report is printed, so that a bad --plot does not come after a page of output."""
    from fibgen.bench.plotting import PlotUnavailable, plot_formats

    try:
        formats = plot_formats()
    except PlotUnavailable as exc:
        return EXIT_USAGE, str(exc)
    if Path(target).is_dir():
        return EXIT_FAIL, f"--plot {target} is a folder; give a file name such as {target}/x.png"
    suffix = Path(target).suffix.lower().lstrip(".")
    if suffix not in formats:
        what = f"a .{suffix} file" if suffix else "a file name without a suffix"
        return EXIT_USAGE, (
            f"--plot {target}: matplotlib cannot draw {what}; end the name with one of "
            f"{', '.join(f'.{f}' for f in sorted(formats))}"
        )
    for folder in Path(target).parents:
        if folder.exists():
            if not folder.is_dir():
                return EXIT_FAIL, f"--plot {target}: {folder} is a file, not a folder"
            break
    return None


def cmd_report(args: argparse.Namespace) -> int:
    """Print the report; draw the plot when asked."""
    problem = _dataset_problem(args.dataset)
    if problem is not None:
        _eprint(f"error: {problem}")
        return EXIT_FAIL
    if args.plot:
        plot_problem = _plot_problem(args.plot)
        if plot_problem is not None:
            _eprint(f"error: {plot_problem[1]}")
            return plot_problem[0]
    from fibgen.bench.report import ReportError, plot, render, summarize
    from fibgen.format import FormatError

    try:
        summary = summarize(args.dataset)
        sys.stdout.write(render(summary, args.format))
        if args.plot:
            sys.stdout.flush()
            plot(summary, args.plot)
            _eprint(f"wrote {args.plot}")
    except (ReportError, FormatError) as exc:
        _eprint(f"error: {exc}")
        return EXIT_FAIL
    return EXIT_OK
