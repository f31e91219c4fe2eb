"""The benchmark runner: every definition × workload × solution, in worker processes.

Work is grouped by (definition, workload): a worker makes the inputs and the reference
outputs once, then evaluates each solution of the definition on them, each in a fresh
process of its own that the worker judges (Note [isolated solutions] in isolation.py). One
worker runs per device entry (``cuda:0,cuda:1`` runs two in parallel; ``cpu,cpu`` also
works), each driven by a thread of the runner. A solution that kills its process (a crash,
``os.abort()``, a CUDA error) is recorded as RUNTIME_ERROR, one that outlasts ``timeout`` (a
sampler, judged by thousands of draws, ``SAMPLING_TIMEOUT_SCALE`` times it) as TIMEOUT, and
the run goes on; a worker that dies is started again.

Benches that share a dataset share its runs (Note [bench claims] in claims.py), and a Ctrl-C
stops a run cleanly (Note [stopping bench]).

Results are appended as Trace lines to ``traces/<op_type>/<definition>.jsonl`` (where
flashinfer-bench writes them) after each workload, so an interrupted run keeps what it
finished and ``resume`` skips it.

A run cannot mislead: devices are checked against the machine before a worker starts; a
filter that selects nothing, or a dataset with nothing to run, is an error that lists what
there is; what is not run (solutions without workloads or definition) is said; a solution
folder whose files changed since its JSON was packed is packed first, so that the traces
and the dataset's JSON are of the same sources (and --resume runs it again).

This module is the run loop and its summary; what a run will do is decided in
``planning.py``, and each worker process is driven through ``worker_handle.py``.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from fibgen.bench import messages as m
from fibgen.bench import worker as w
from fibgen.bench.claims import Claims
from fibgen.bench.lifetime import START_TIMEOUT
from fibgen.bench.planning import (
    BenchError,
    BenchOptions,
    DeviceError,
    Group,
    Plan,
    check_devices,
    listing,
    load_extras,
    plan,
)
from fibgen.bench.progress import ProgressLine
from fibgen.bench.worker_handle import (
    Handle,
    stop_on_sigint,
    workers_die_on_sigterm,
)
from fibgen.format import FormatError, Solution, Trace, append_traces
from fibgen.format.dataset import EXTRAS_SUFFIX, drop_torn_last_line, pack_solution, trace_path
from fibgen.runtime.checking.compare import SAMPLING_TIMEOUT_SCALE, is_sampling
from fibgen.runtime.solutions.loading import BUILT_LANGUAGES

__all__ = [
    "EXTRAS_SUFFIX",
    "BenchError",
    "BenchOptions",
    "BenchSummary",
    "DeviceError",
    "Plan",
    "check_devices",
    "load_extras",
    "plan",
    "run_bench",
]

# Preparing a workload (inputs, the reference and its timing) gets this many timeouts.
PREPARE_TIMEOUTS = 4


@dataclass
class BenchSummary:
    """What a run did: traces written by status, triples skipped, workloads that failed,
    notes on what was not run or packed, and timings too noisy to trust."""

    statuses: Counter = field(default_factory=Counter)
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    trace_files: set[Path] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    noisy: list[str] = field(default_factory=list)
    # Runs another bench on the dataset claimed, by who it is (Note [bench claims]).
    claimed: Counter = field(default_factory=Counter)
    # Stopped by Ctrl-C: what was written stays, the workloads in progress were dropped.
    interrupted: bool = False

    @property
    def traces(self) -> int:
        """Number of traces written."""
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        """Runs that did not pass."""
        return sum(n for status, n in self.statuses.items() if status != w.PASSED)

    def verdict(self, root: str | os.PathLike[str]) -> str:
        """The last line of a run: passed, failed, or nothing run, and where to look."""
        failed = {k: v for k, v in sorted(self.statuses.items()) if k != w.PASSED}
        shown = ", ".join(f"{k} {v}" for k, v in failed.items())
        report = f"; see `fibgen report {root}`" if self.traces else ""
        if self.interrupted:
            return (
                f"bench: interrupted: {self.traces} trace(s) written, the workloads in progress "
                f"dropped; `fibgen bench {root} --resume` runs the rest"
            )
        if self.problems:
            # An error (a workload that could not be prepared, traces that could not be
            # written) fails the run even when every trace that was written passed.
            did_not_pass = f", {self.failed} did not pass ({shown})" if failed else ""
            return (
                f"bench: FAILED: {len(self.problems)} error(s) above; {self.traces} trace(s) "
                f"written{did_not_pass}{report}"
            )
        if not self.traces:
            others = sum(self.claimed.values())
            by_other = f", {others} run(s) by another bench" if others else ""
            return (
                f"bench: nothing run ({self.skipped} run(s) already traced, skipped" f"{by_other})"
            )
        if failed:
            return (
                f"bench: FAILED: {self.failed} of {self.traces} run(s) did not pass ({shown})"
                f"{report}"
            )
        return f"bench: all {self.traces} run(s) PASSED"


class _Progress:
    """The progress of a run: definitions, workloads, runs and ETA, on one line."""

    def __init__(self, groups: list[Group], enabled: bool) -> None:
        self.line = ProgressLine(enabled)
        self.total_runs = sum(len(g.solutions) for g in groups)
        self.total_defs = len({g.definition.name for g in groups})
        self.total_workloads = len(groups)
        self.runs = self.workloads = 0
        self.defs_done: Counter = Counter(g.definition.name for g in groups)
        self.lock = threading.Lock()

    def begin(self) -> None:
        """The first line, before any work: what there is to do."""
        with self.lock:
            self._show("starting", final=True)

    def note(self, text: str) -> None:
        """A line of its own (a build starting), above the progress line."""
        with self.lock:
            self.line.note(text)
            self._show(text, final=True)

    def tick(self, group: Group, runs: int, workload_done: bool) -> None:
        with self.lock:
            self.runs += runs
            if workload_done:
                self.workloads += 1
                self.defs_done[group.definition.name] -= 1
            self._show(group.definition.name)

    def _show(self, current: str, final: bool = False) -> None:
        now = self.line.due(final)
        if now is None:
            return
        elapsed = now - self.line.start
        eta = elapsed / self.runs * (self.total_runs - self.runs) if self.runs else math.nan
        defs = sum(1 for v in self.defs_done.values() if v == 0)
        self.line.show(
            f"bench: definitions {defs}/{self.total_defs}, workloads "
            f"{self.workloads}/{self.total_workloads}, runs {self.runs}/{self.total_runs}, "
            f"ETA {duration(eta)} ({current})"
        )

    def close(self) -> None:
        self.line.close()


def duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# A timing whose interquartile range exceeds this share of its median is reported as noisy.
NOISY_SPREAD = 0.25


def _describe(timing: dict) -> str:
    from fibgen.bench.timing import Timing

    return Timing(
        timing["median_ms"],
        timing["q1_ms"],
        timing["q3_ms"],
        timing["samples"],
        timing["calls_per_sample"],
    ).describe()


def _spread(timing: dict) -> float:
    median = timing["median_ms"]
    return (timing["q3_ms"] - timing["q1_ms"]) / median if median > 0 else math.inf


def _evaluation(result: dict, reference: dict, hardware: str, libs: dict) -> dict:
    evaluation: dict = {
        "status": result["status"],
        "environment": {"hardware": hardware, "libs": libs},
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "log": result.get("log", ""),
    }
    if "correctness" in result:
        evaluation["correctness"] = result["correctness"]
    if result["status"] == w.PASSED:
        latency = result["timing"]["median_ms"]
        ref_ms = reference["median_ms"]
        evaluation["performance"] = {
            "latency_ms": latency,
            "reference_latency_ms": ref_ms,
            "speedup_factor": ref_ms / latency if latency > 0 else 0.0,
        }
        timing = result["timing"]
        if "e2e_ms" in timing:
            # Beside the GPU time: what a call costs in an eager loop as apply delivers it
            # (Note [bench e2e] in worker.py). flashinfer-bench ignores keys it does not know.
            performance = evaluation["performance"]
            performance["e2e_latency_ms"] = timing["e2e_ms"]
            ref_e2e = timing.get("reference_e2e_ms", reference.get("e2e_ms"))
            if ref_e2e is not None:
                performance["reference_e2e_latency_ms"] = ref_e2e
            for key, field in (
                ("original_e2e_ms", "original_e2e_latency_ms"),
                ("original_ms", "original_latency_ms"),
                ("e2e_spread", "e2e_spread"),
                ("e2e_routed", "e2e_routed"),
            ):
                if key in timing:
                    performance[field] = timing[key]
        # The spread of both timings, which the Performance record has no field for.
        evaluation["log"] = f"timing: {_describe(timing)}; reference: {_describe(reference)}"
        if timing.get("e2e_note"):
            evaluation["log"] += "; " + timing["e2e_note"]
    return evaluation


def run_group(
    handle: Handle,
    group: Group,
    root: Path,
    options: BenchOptions,
    note: Callable[[str], None] | None = None,
) -> tuple:
    """Evaluate every solution of a group; (traces, problem or None, noisy timings).

    ``note`` is told before a solution whose first call compiles it (a cpp or cuda build
    takes tens of seconds, which would otherwise pass in silence).
    """
    request = m.Prepare(
        group.definition.model_dump(mode="json", exclude_none=True),
        group.workload.model_dump(mode="json"),
        str(root),
        group.hints,
        options.seed,
        options.warmup,
        options.repeat,
        options.flush,
    )
    prepare_timeout = options.timeout * PREPARE_TIMEOUTS
    reply = handle.ask(request, prepare_timeout)
    where = f"{group.definition.name} workload {group.workload.uuid}"
    if isinstance(reply, m.Invalid):
        # The worker's one line names the workload, its definition and the input.
        return [], reply.why, []
    if not isinstance(reply, m.Prepared):
        why = m.reply_text(reply)
        if isinstance(reply, m.TimedOut):
            why = (
                f"making the inputs and timing the reference took over {prepare_timeout:g} s "
                f"({PREPARE_TIMEOUTS} times --timeout); give a longer --timeout, or fewer "
                "--repeat"
            )
        return [], f"{where}: {why}", []
    # A sampler is judged by thousands of draws, each a call (Note [judging samplers]).
    sampler = is_sampling(
        {"op_type": group.definition.op_type, "outputs": group.definition.outputs}
    )
    limit = options.timeout * (SAMPLING_TIMEOUT_SCALE if sampler else 1)
    reference, hardware, libs = reply.reference, reply.hardware, reply.libs
    noisy = []
    if _spread(reference) > NOISY_SPREAD:
        noisy.append(f"{where}: reference {_describe(reference)}")
    # The worker holds an isolated solution to ``limit`` itself, from the moment its process
    # started (Note [isolated solutions] in isolation.py): the runner's wait also covers that
    # start, and is the bound for a worker that no longer answers.
    wait = limit + START_TIMEOUT + 30 if options.isolate else limit
    traces: list[tuple[Solution, dict]] = []
    for solution in group.solutions:
        if note is not None and solution.spec.language in BUILT_LANGUAGES:
            from fibgen.runtime.solutions.builders import is_built

            if not is_built(solution):
                note(
                    f"bench: building {solution.name} ({solution.spec.language}) for its first "
                    f"run; a build takes a minute or so"
                )
        run = m.Run(
            solution.model_dump(mode="json", exclude_none=True),
            group.tolerance,
            options.warmup,
            options.repeat,
            options.flush,
            limit,
            group.origin(solution.name),
        )
        evaluate = m.Evaluate(run, options.isolate)
        answer = handle.ask(evaluate, wait)
        if isinstance(answer, m.Stopped):
            return traces, f"{where}: stopped", noisy
        if isinstance(answer, m.Result):
            result = answer.fields
        elif isinstance(answer, m.TimedOut):
            scaled = (
                f" ({SAMPLING_TIMEOUT_SCALE} times --timeout, for a sampler)" if sampler else ""
            )
            result = {
                "status": w.TIMEOUT,
                "log": f"no result after {limit:g} s{scaled}: the solution hangs or is slower "
                f"than that; if it is slow, give a longer --timeout (now {options.timeout:g} s)",
            }
        else:
            result = {"status": w.RUNTIME_ERROR, "log": m.reply_text(answer)}
        if "timing" in result and _spread(result["timing"]) > NOISY_SPREAD:
            noisy.append(f"{where}: {solution.name} {_describe(result['timing'])}")
        if "timing" in result and result["timing"].get("e2e_spread", 0.0) > NOISY_SPREAD:
            spread = result["timing"]["e2e_spread"]
            noisy.append(
                f"{where}: {solution.name} end to end: its ratio to the reference spread "
                f"{spread:.0%} over {w.e2e_rounds(options.repeat)} paired rounds"
            )
        if handle.process is None:
            # The worker is gone (or exited after a CUDA error): a new one needs the inputs.
            again = handle.ask(request, prepare_timeout)
            if not isinstance(again, m.Prepared):
                traces.append((solution, _evaluation(result, reference, hardware, libs)))
                rest = ", ".join(s.name for s in group.solutions[len(traces) :])
                return (
                    traces,
                    f"{where}: a new worker could not prepare the workload; not run: "
                    f"{rest or 'none'}",
                    noisy,
                )
        traces.append((solution, _evaluation(result, reference, hardware, libs)))
    return traces, None, noisy


def prepare_dataset(root: Path, work_plan: Plan, summary: BenchSummary) -> None:
    """What a run writes before its first trace, said in ``summary.notes``: solution folders
    whose files changed are packed into their JSON, and torn last trace lines dropped."""
    try:
        for path in work_plan.stale:
            pack_solution(path)
    except FormatError as exc:
        raise BenchError(str(exc)) from None
    if work_plan.stale:
        summary.notes.append(
            f"packed {len(work_plan.stale)} solution folder(s) whose files changed, so that "
            f"the dataset's JSON holds what is run: " + ", ".join(str(p) for p in work_plan.stale)
        )
    # A run killed while writing a trace leaves a torn last line: it is dropped before this
    # run appends (Note [torn lines] in fibgen/format/dataset/writers.py), and said once here
    # rather than by each append; also where --resume finds everything traced, so that what
    # the run leaves reads cleanly.
    for path in work_plan.trace_files:
        try:
            # Also the guard of where traces go (Note [confined paths] in fibgen/fsutil.py):
            # a link out of the dataset is refused before any solution runs.
            dropped = drop_torn_last_line(path, root=root)
        except FormatError as exc:
            raise BenchError(str(exc)) from None
        except OSError as exc:
            raise BenchError(f"cannot read {path}: {exc}") from None
        if dropped is not None:
            summary.notes.append(dropped)


def record_group(
    root: Path,
    group: Group,
    results: list[tuple[Solution, dict]],
    problem: str | None,
    noisy: list[str],
    summary: BenchSummary,
    on_trace: Callable[[Trace], None] | None = None,
) -> bool:
    """Append the traces of a finished group and count them; False when they could not be
    written (said in ``summary.problems``). The one place where a run writes traces."""
    where = f"{group.definition.name} workload {group.workload.uuid}"
    traces: list[Trace] = []
    try:
        traces = [
            Trace.model_validate(
                {
                    "definition": group.definition.name,
                    "workload": group.workload.model_dump(mode="json"),
                    "solution": solution.name,
                    "evaluation": evaluation,
                }
            )
            for solution, evaluation in results
        ]
        if traces:
            summary.trace_files.update(append_traces(root, group.definition.op_type, traces))
    except (OSError, ValueError) as exc:
        path = trace_path(root, group.definition.op_type, group.definition.name)
        summary.problems.append(
            f"cannot write {len(results)} trace(s) of {where} to {path}: {exc}; their results "
            "are lost"
        )
        return False
    for trace in traces:
        assert trace.evaluation is not None  # each was made with its evaluation
        summary.statuses[trace.evaluation.status.value] += 1
        if on_trace is not None:
            on_trace(trace)
    if problem is not None:
        summary.problems.append(problem)
    summary.noisy.extend(noisy)
    return True


# Note [stopping bench]
# A Ctrl-C reaches the runner and, in a terminal (or under `timeout -s INT`), every process of
# its group: workers that were importing torch printed a KeyboardInterrupt traceback each, and
# the runner's exit another. So the runner alone takes it: its threads block SIGINT, so that
# the main thread's handler gets it, and every process below the runner (workers, their fork
# servers, solution processes) ignores it as the first thing it does, before it imports
# torch (``lifetime.ignore_ctrl_c``). A blocked signal does not carry over: spawn's new
# interpreter starts with none blocked, and multiprocessing's fork server sets its own
# SIGINT handling only after its preload is imported. On the interrupt the runner kills its workers, drops the
# workloads they were running (a half-run workload is no result), keeps what was appended
# (each append replaces the trace file whole: Note [torn lines] in writers.py), releases its
# claims (Note [bench claims] in claims.py), and says what was written; the command exits 130.
# `--resume` runs the rest.


def run_bench(
    root: str | os.PathLike[str],
    options: BenchOptions = BenchOptions(),
    *,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
) -> BenchSummary:
    """Benchmark every solution on every workload of the dataset; append Trace lines."""
    root = Path(root)
    devices = check_devices(options.devices)
    if devices != options.devices:
        options = replace(options, devices=devices)
    try:
        work_plan = plan(root, options)
    except FormatError as exc:
        raise BenchError(str(exc)) from None
    groups = work_plan.groups
    summary = BenchSummary(skipped=work_plan.skipped, notes=list(work_plan.notes))
    prepare_dataset(root, work_plan, summary)
    work: queue.Queue[Group] = queue.Queue()
    handles: list[Handle] = []
    for group in groups:
        work.put(group)
    bar = _Progress(groups, progress)
    lock = threading.Lock()
    stop = threading.Event()
    claims = Claims(root)
    announced: set[str] = set()

    def note(text: str) -> None:
        with lock:
            if text in announced:
                return
            announced.add(text)
        bar.note(text)

    def drive(device: str) -> None:
        # Ctrl-C is the runner's: blocked in this thread, so that the main thread's handler
        # takes it; the worker this thread starts ignores it (Note [stopping bench]).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        # Every failure of this thread ends up in summary.problems, which fails the run: an
        # exception escaping here would only print a traceback while the run exits 0.
        handle = Handle(device)
        with lock:
            handles.append(handle)
        try:
            while not stop.is_set():
                try:
                    group = work.get_nowait()
                except queue.Empty:
                    return
                where = f"{group.definition.name} workload {group.workload.uuid}"
                try:
                    # Runs another bench on the dataset claimed are its (Note [bench claims]).
                    mine, theirs = claims.claim(
                        group.definition.name, group.workload.uuid, list(group.solutions)
                    )
                    if theirs:
                        with lock:
                            summary.claimed.update(theirs)
                        bar.tick(group, sum(theirs.values()), not mine)
                        if not mine:
                            continue
                        group = replace(group, solutions=tuple(mine))
                    results, problem, noisy = run_group(handle, group, root, options, note)
                except Exception as exc:
                    # The runner itself failed on this device (no worker could start):
                    # report it and leave the remaining work to the other devices.
                    with lock:
                        summary.problems.append(
                            f"device {device}: {type(exc).__name__}: {exc}; not run: "
                            f"{len(group.solutions)} run(s) of {where}"
                        )
                    return
                with lock:
                    if stop.is_set():
                        return  # its worker was killed mid-run: nothing of it is recorded
                    if not record_group(root, group, results, problem, noisy, summary, on_trace):
                        return
                bar.tick(group, len(group.solutions), True)
        finally:
            handle.stop()

    threads = [threading.Thread(target=drive, args=(d,), daemon=True) for d in options.devices]
    try:
        bar.begin()
        # Note [stopping bench]: a Ctrl-C kills the workers, whose groups are dropped; what
        # was appended stays whole.
        with workers_die_on_sigterm(handles), stop_on_sigint(stop, handles):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        summary.interrupted = stop.is_set()
    finally:
        claims.release()
    bar.close()
    left = []
    while True:
        try:
            left.append(work.get_nowait())
        except queue.Empty:
            break
    if left and not summary.interrupted:
        # Every runner thread stopped on an error above before the work was done.
        runs = sum(len(g.solutions) for g in left)
        shown = listing([f"{g.definition.name} workload {g.workload.uuid}" for g in left], 5)
        summary.problems.append(
            f"not run: {runs} run(s) of {len(left)} workload(s) after the error(s) above: {shown}"
        )
    return summary
