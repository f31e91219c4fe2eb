"""The benchmark runner: every definition × workload × solution, in worker processes.

Work is grouped by (definition, workload): a worker makes the inputs and the reference
outputs once, then evaluates each solution of the definition on them. One worker runs per
device entry (``cuda:0,cuda:1`` runs two in parallel; ``cpu,cpu`` also works), each driven by
a thread of the runner. A solution that kills its worker (a crash, ``os.abort()``, a CUDA
error) is recorded as RUNTIME_ERROR, one that outlasts ``timeout`` (a sampler, judged by
thousands of draws, ``SAMPLING_TIMEOUT_SCALE`` times it) as TIMEOUT; the worker is started
again and the run goes on.

Results are appended as Trace lines to ``traces/<op_type>/<definition>.jsonl`` (where
flashinfer-bench writes them) after each workload, so an interrupted run keeps what it
finished and ``resume`` skips it.

A run cannot mislead: devices are checked against the machine before a worker starts; a
filter that selects nothing, or a dataset with nothing to run, is an error that lists what
there is; what is not run (solutions without workloads or definition) is said; a solution
folder whose files changed since its JSON was packed is packed first, so that the traces
and the dataset's JSON are of the same sources (and --resume runs it again).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fibgen.bench import child as entry
from fibgen.bench import worker as w
from fibgen.bench.timing import check_flush
from fibgen.format import (
    Definition,
    FormatError,
    Solution,
    Trace,
    Workload,
    append_traces,
    dataset_files,
    load_definition_files,
    read_solution,
)
from fibgen.format.dataset import (
    EXTRAS_SUFFIX,
    drop_torn_last_line,
    is_stale,
    pack_solution,
    read_extras,
    trace_path,
)
from fibgen.runtime.compare import SAMPLING_TIMEOUT_SCALE, is_sampling
from fibgen.runtime.workloads import load_workloads

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


class BenchError(Exception):
    """A benchmark that cannot start: a bad dataset, filter or option."""


class DeviceError(BenchError):
    """A ``--devices`` value this machine cannot run (a command-line mistake)."""


@dataclass(frozen=True)
class BenchOptions:
    """What to run and how; see ``fibgen bench --help``."""

    devices: tuple[str, ...] = ("cpu",)
    definitions: tuple[str, ...] = ()
    solutions: tuple[str, ...] = ()
    resume: bool = False
    timeout: float = 120.0
    warmup: int = 3
    repeat: int | None = None
    seed: int = 0
    # How L2 is flushed before each timed call on a GPU (Note [flushing L2] in timing.py).
    flush: str = "read"


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
        if self.problems:
            # An error (a workload that could not be prepared, traces that could not be
            # written) fails the run even when every trace that was written passed.
            did_not_pass = f", {self.failed} did not pass ({shown})" if failed else ""
            return (
                f"bench: FAILED: {len(self.problems)} error(s) above; {self.traces} trace(s) "
                f"written{did_not_pass}{report}"
            )
        if not self.traces:
            return f"bench: nothing run ({self.skipped} run(s) already traced, skipped)"
        if failed:
            return (
                f"bench: FAILED: {self.failed} of {self.traces} run(s) did not pass ({shown})"
                f"{report}"
            )
        return f"bench: all {self.traces} run(s) PASSED"


@dataclass(frozen=True)
class _Group:
    definition: Definition
    workload: Workload
    solutions: tuple[Solution, ...]
    tolerance: dict
    hints: dict


def _contract(definition: Definition) -> tuple:
    # What a sidecar's hints and tolerance are about: axes, tensors and constraints.
    def tensors(group: dict) -> list:
        return [(n, t.shape, t.dtype, t.optional) for n, t in group.items()]

    axes = [(n, a.type, getattr(a, "value", None)) for n, a in definition.axes.items()]
    return (
        axes,
        tensors(definition.inputs),
        tensors(definition.outputs),
        definition.constraints,
    )


def load_extras(definition_file: Path, definition: Definition) -> dict:
    """The sidecar beside a definition JSON: ``{"tolerance": {...}, "hints": {...}}``.

    A definition without one that has the same axes, tensors and constraints as the
    built-in catalogue's definition of its name (a flashinfer-bench dataset's, say) gets the
    catalogue's: its index tensors are then made valid and its tolerance applies.
    """
    try:
        extras = read_extras(definition_file)
        if extras:
            return extras
        from fibgen.format import load_definition
        from fibgen.paths import builtin_definition_file

        builtin = builtin_definition_file(definition.name)
        if builtin is None or builtin.resolve() == Path(definition_file).resolve():
            return {}
        if _contract(load_definition(builtin)) != _contract(definition):
            return {}
        return read_extras(builtin)
    except FormatError as exc:
        raise BenchError(str(exc)) from None


def _tolerance(extras: dict) -> dict:
    given = extras.get("tolerance") or {}
    return {k: given.get(k) for k in ("atol", "rtol", "matched")}


def _matches(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return (shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")) or "none"


def _solution_files(root: Path, options: BenchOptions) -> list[tuple[Path, Solution]]:
    """The dataset's solutions and those ``--solutions`` adds; patterns are applied later."""
    found = [(p, read_solution(p)) for p in dataset_files(root, "solutions")]
    for item in options.solutions:
        path = Path(item)
        if path.is_dir():
            found += [
                (p, read_solution(p))
                for p in sorted(path.rglob("*.json"))
                if not any(part.startswith(".") for part in p.relative_to(path).parts)
            ]
        elif path.is_file():
            found.append((path, read_solution(path)))
    return found


def _patterns(options: BenchOptions) -> list[str]:
    return [item for item in options.solutions if not Path(item).exists()]


def traced_triples(root: Path) -> set[tuple[str, str, str]]:
    """(definition, workload uuid, solution) of every evaluated trace under ``root/traces``."""
    done = set()
    for path in dataset_files(root, "traces"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record.get("solution") is not None:
                    done.add((record["definition"], record["workload"]["uuid"], record["solution"]))
            except (ValueError, KeyError, TypeError):
                # A damaged line is not a finished run: it is run again.
                continue
    return done


@dataclass
class Plan:
    """The work of a run, grouped by (definition, workload), and what it leaves out.

    ``stale``: solution folders of the dataset whose files changed since their JSON was
    packed; ``run_bench`` packs them before running (Note [solution folders]).
    """

    groups: list[_Group]
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    stale: list[Path] = field(default_factory=list)
    # The trace files of the definitions the run covers (run or already traced).
    trace_files: list[Path] = field(default_factory=list)


def plan(root: Path, options: BenchOptions) -> Plan:
    """What a run would do; a BenchError when it would do nothing or a filter is wrong."""
    root = Path(root)
    try:
        check_flush(options.flush)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if not root.is_dir():
        raise BenchError(f"dataset {root} does not exist")
    definition_files = load_definition_files(root)
    definitions = {name: defn for name, (_, defn) in definition_files.items()}
    if not definitions:
        raise BenchError(
            f"dataset {root} has no definitions under {root}/definitions/ "
            "(`fibgen workloads NAME --axes ... -o DATASET` writes one with its workloads)"
        )
    for pattern in options.definitions:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in definitions):
            raise BenchError(
                f"--definitions {pattern!r} matches no definition of {root}; it has: "
                f"{_listing(sorted(definitions))}"
            )
    files = _solution_files(root, options)
    names: dict[str, tuple[Path, Solution]] = {}
    for path, solution in files:
        other = names.get(solution.name)
        if other is not None and (other[1].definition, other[1]) != (
            solution.definition,
            solution,
        ):
            raise BenchError(
                f"two different solutions named {solution.name!r}: {other[0]} and {path}; "
                "a solution name is unique in a dataset (flashinfer-bench refuses the dataset "
                "otherwise)"
            )
        names.setdefault(solution.name, (path, solution))
    patterns = _patterns(options)
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise BenchError(
                f"--solutions {pattern!r} matches no solution of {root} and is no file or "
                f"folder; the solutions are: {_listing(sorted(names))}"
            )
    selected = [(p, s) for p, s in names.values() if _matches(s.name, patterns)]
    workloads = load_workloads(root)
    by_definition: dict[str, list[Solution]] = {}
    notes: list[str] = []
    unknown = sorted({s.definition for _, s in selected if s.definition not in definitions})
    if unknown:
        notes.append(
            f"not run: solutions of {len(unknown)} definition(s) that are not in "
            f"{root}/definitions: {_listing(unknown)}"
        )
    gpu = any(d.strip().startswith("cuda") for d in options.devices)
    cpu_only = sorted(s.name for _, s in selected if s.spec.language == "cuda" and not gpu)
    if cpu_only:
        notes.append(
            f"not run: {len(cpu_only)} cuda solution(s) on a CPU ({_listing(cpu_only)}); "
            "give --devices cuda:N on a machine with a GPU"
        )
    for _, solution in selected:
        if solution.name not in cpu_only:
            by_definition.setdefault(solution.definition, []).append(solution)
    stale = sorted(
        p for p, s in selected if s.definition in definitions and root in p.parents and is_stale(p)
    )
    packed = {s.name for p, s in selected if p in stale}
    done = traced_triples(root) if options.resume else set()
    groups: list[_Group] = []
    skipped = 0
    no_workloads = []
    trace_files: list[Path] = []
    for name in sorted(definitions):
        if not _matches(name, list(options.definitions)):
            continue
        candidates = sorted(by_definition.get(name, ()), key=lambda s: s.name)
        if not candidates:
            continue
        if not workloads.get(name):
            no_workloads.append(name)
            continue
        definition = definitions[name]
        trace_files.append(trace_path(root, definition.op_type, name))
        extras = load_extras(definition_files[name][0], definition)
        for workload in workloads[name]:
            # A solution whose files changed has traces of other sources: it runs again.
            todo = tuple(
                s
                for s in candidates
                if s.name in packed or (name, workload.uuid, s.name) not in done
            )
            skipped += len(candidates) - len(todo)
            if todo:
                groups.append(
                    _Group(
                        definition, workload, todo, _tolerance(extras), extras.get("hints") or {}
                    )
                )
    if no_workloads:
        notes.append(
            f"not run: no workloads for {_listing(no_workloads)} (make some with `fibgen "
            f"workloads {no_workloads[0]} --axes AXIS=V1,V2 -o {root}`)"
        )
    if not groups and not skipped:
        what = []
        if options.definitions:
            what.append(f"--definitions {' '.join(options.definitions)}")
        if patterns:
            what.append(f"--solutions {' '.join(patterns)}")
        chosen = f" with {' and '.join(what)}" if what else ""
        reasons = "; ".join(notes) or (
            f"{root}/solutions holds no solution (`fibgen scaffold-solution NAME --language "
            f"python -o {root}/solutions` writes one)"
            if not names
            else "no solution is for a selected definition"
        )
        raise BenchError(f"nothing to run in {root}{chosen}: {reasons}")
    return Plan(groups, skipped, notes, stale, trace_files)


def check_devices(devices: tuple[str, ...]) -> tuple[str, ...]:
    """The devices, checked against this machine before any worker starts; DeviceError if not."""
    import torch

    if not devices:
        raise DeviceError("--devices is empty; give cpu, cuda or cuda:N (comma-separated)")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for text in devices:
        try:
            device = torch.device(text)
        except (RuntimeError, ValueError):
            raise DeviceError(
                f"--devices {text!r} is not a device; write cpu, cuda or cuda:N"
            ) from None
        if device.type == "cpu":
            continue
        if device.type != "cuda":
            raise DeviceError(f"--devices {text!r}: fibgen bench runs on cpu and cuda devices")
        if count == 0:
            raise DeviceError(
                f"--devices {text!r}: this machine has no CUDA device (torch "
                f"{torch.__version__} sees none); use --devices cpu"
            )
        if device.index is not None and device.index >= count:
            have = ", ".join(f"cuda:{i}" for i in range(count))
            raise DeviceError(
                f"--devices {text!r}: this machine has {count} CUDA device(s): {have}"
            )
    return devices


class _Handle:
    """One worker process on one device, started again after it dies or hangs."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.process: Any = None
        self.conn: Any = None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        # Started through the light entry module, which ties the worker's life to this
        # process's before it imports torch (Note [worker lifetime] in child.py).
        process = context.Process(
            target=entry.main, args=(child, self.device, os.getpid()), daemon=True
        )
        try:
            process.start()
        finally:
            child.close()
        self.process, self.conn = process, parent

    def ask(self, request: tuple, timeout: float) -> tuple:
        """Send a request; the reply, or ("timeout",) / ("died", why)."""
        if self.process is None or not self.process.is_alive():
            self.start()
        try:
            self.conn.send(request)
            if not self.conn.poll(timeout):
                self.kill()
                return ("timeout",)
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            why = self._death()
            self.kill()
            return ("died", why)

    def _death(self) -> str:
        self.process.join(timeout=5)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"worker process killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker process killed by signal {-code}"
        return f"worker process exited with status {code}"

    def signal_kill(self) -> None:
        """SIGKILL the worker and return at once: all a signal handler may do."""
        process = self.process
        if process is not None and process.pid is not None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except OSError:  # gone already
                pass

    def kill(self) -> None:
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(timeout=5)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None

    def stop(self) -> None:
        if self.process is not None and self.process.is_alive():
            try:
                self.conn.send(("stop",))
                self.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()


class _Progress:
    """A one-line progress report on stderr: definitions, workloads, runs and ETA."""

    def __init__(self, groups: list[_Group], enabled: bool) -> None:
        self.enabled = enabled
        self.total_runs = sum(len(g.solutions) for g in groups)
        self.total_defs = len({g.definition.name for g in groups})
        self.total_workloads = len(groups)
        self.runs = self.workloads = 0
        self.defs_done: Counter = Counter(g.definition.name for g in groups)
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def tick(self, group: _Group, runs: int, workload_done: bool) -> None:
        with self.lock:
            self.runs += runs
            if workload_done:
                self.workloads += 1
                self.defs_done[group.definition.name] -= 1
            self._show(group.definition.name)

    def _show(self, current: str, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and not self.tty and now - self.last < 5.0:
            return
        self.last = now
        elapsed = now - self.start
        eta = elapsed / self.runs * (self.total_runs - self.runs) if self.runs else math.nan
        defs = sum(1 for v in self.defs_done.values() if v == 0)
        line = (
            f"bench: definitions {defs}/{self.total_defs}, workloads "
            f"{self.workloads}/{self.total_workloads}, runs {self.runs}/{self.total_runs}, "
            f"ETA {_duration(eta)} ({current})"
        )
        sys.stderr.write(("\r\x1b[K" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def _duration(seconds: float) -> str:
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
        if "e2e_ms" in result["timing"] and "e2e_ms" in reference:
            # Beside the GPU time: what a call costs in an eager loop (fibgen/bench/eager.py).
            # flashinfer-bench's Performance ignores keys it does not know.
            evaluation["performance"]["e2e_latency_ms"] = result["timing"]["e2e_ms"]
            evaluation["performance"]["reference_e2e_latency_ms"] = reference["e2e_ms"]
        # The spread of both timings, which the Performance record has no field for.
        evaluation["log"] = (
            f"timing: {_describe(result['timing'])}; reference: {_describe(reference)}"
        )
    return evaluation


def _run_group(handle: _Handle, group: _Group, root: Path, options: BenchOptions) -> tuple:
    """Evaluate every solution of a group; (traces, problem or None, noisy timings)."""
    request = (
        "workload",
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
    if reply[0] == "invalid":
        # The worker's one line names the workload, its definition and the input.
        return [], reply[1], []
    if reply[0] != "ready":
        timed_out = (
            f"making the inputs and timing the reference took over {prepare_timeout:g} s "
            f"({PREPARE_TIMEOUTS} times --timeout); give a longer --timeout, or fewer --repeat"
        )
        why = {"timeout": timed_out}.get(reply[0], reply[-1])
        return [], f"{where}: {why}", []
    # A sampler is judged by thousands of draws, each a call (Note [judging samplers]).
    sampler = is_sampling({"op_type": group.definition.op_type, "inputs": group.definition.inputs})
    limit = options.timeout * (SAMPLING_TIMEOUT_SCALE if sampler else 1)
    _, reference, hardware, libs = reply
    noisy = []
    if _spread(reference) > NOISY_SPREAD:
        noisy.append(f"{where}: reference {_describe(reference)}")
    traces = []
    for solution in group.solutions:
        reply = handle.ask(
            (
                "solution",
                solution.model_dump(mode="json", exclude_none=True),
                group.tolerance,
                options.warmup,
                options.repeat,
                options.flush,
                limit,
            ),
            limit,
        )
        if reply[0] == "result":
            result = reply[1]
        elif reply[0] == "timeout":
            scaled = (
                f" ({SAMPLING_TIMEOUT_SCALE} times --timeout, for a sampler)" if sampler else ""
            )
            result = {
                "status": w.TIMEOUT,
                "log": f"no result after {limit:g} s{scaled}: the solution hangs or is slower "
                f"than that; if it is slow, give a longer --timeout (now {options.timeout:g} s)",
            }
        else:
            result = {"status": w.RUNTIME_ERROR, "log": reply[1]}
        if "timing" in result and _spread(result["timing"]) > NOISY_SPREAD:
            noisy.append(f"{where}: {solution.name} {_describe(result['timing'])}")
        if handle.process is None:
            # The worker is gone (or exited after a CUDA error): a new one needs the inputs.
            again = handle.ask(request, prepare_timeout)
            if again[0] != "ready":
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


def record_group(
    root: Path,
    group: _Group,
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
        summary.statuses[trace.evaluation.status.value] += 1
        if on_trace is not None:
            on_trace(trace)
    if problem is not None:
        summary.problems.append(problem)
    summary.noisy.extend(noisy)
    return True


@contextlib.contextmanager
def _workers_die_on_sigterm(handles: list[_Handle]) -> Iterator[None]:
    """While the run lasts, a SIGTERM that would end the runner kills its workers first.

    Only where SIGTERM has its default action (the runner then dies) and only on the main
    thread, where Python runs handlers; elsewhere the workers still die with the runner
    (Note [worker lifetime] in child.py).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        for handle in list(handles):
            handle.signal_kill()
        # Then die of the signal, as the runner would have without this handler.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_bench(
    root: str | os.PathLike[str],
    options: BenchOptions = BenchOptions(),
    *,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
) -> BenchSummary:
    """Benchmark every solution on every workload of the dataset; append Trace lines."""
    root = Path(root)
    check_devices(options.devices)
    try:
        work_plan = plan(root, options)
        for path in work_plan.stale:
            pack_solution(path)
    except FormatError as exc:
        raise BenchError(str(exc)) from None
    groups = work_plan.groups
    summary = BenchSummary(skipped=work_plan.skipped, notes=list(work_plan.notes))
    if work_plan.stale:
        summary.notes.append(
            f"packed {len(work_plan.stale)} solution folder(s) whose files changed, so that "
            f"the dataset's JSON holds what is run: " + ", ".join(str(p) for p in work_plan.stale)
        )
    work: queue.Queue[_Group] = queue.Queue()
    handles: list[_Handle] = []
    for group in groups:
        work.put(group)
    bar = _Progress(groups, progress)
    lock = threading.Lock()

    # A run killed while writing a trace leaves a torn last line: it is dropped before this
    # run appends (Note [torn lines]), and said once here rather than by each append; also
    # where --resume finds everything traced, so that what the run leaves reads cleanly.
    for path in work_plan.trace_files:
        try:
            dropped = drop_torn_last_line(path)
        except OSError as exc:
            raise BenchError(f"cannot read {path}: {exc}") from None
        if dropped is not None:
            summary.notes.append(dropped)

    def drive(device: str) -> None:
        # Every failure of this thread ends up in summary.problems, which fails the run: an
        # exception escaping here would only print a traceback while the run exits 0.
        handle = _Handle(device)
        with lock:
            handles.append(handle)
        try:
            while True:
                try:
                    group = work.get_nowait()
                except queue.Empty:
                    return
                where = f"{group.definition.name} workload {group.workload.uuid}"
                try:
                    results, problem, noisy = _run_group(handle, group, root, options)
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
                    if not record_group(root, group, results, problem, noisy, summary, on_trace):
                        return
                bar.tick(group, len(group.solutions), True)
        finally:
            handle.stop()

    threads = [threading.Thread(target=drive, args=(d,), daemon=True) for d in options.devices]
    with _workers_die_on_sigterm(handles):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    bar.close()
    left = []
    while True:
        try:
            left.append(work.get_nowait())
        except queue.Empty:
            break
    if left:
        # Every runner thread stopped on an error above before the work was done.
        runs = sum(len(g.solutions) for g in left)
        shown = _listing([f"{g.definition.name} workload {g.workload.uuid}" for g in left], 5)
        summary.problems.append(
            f"not run: {runs} run(s) of {len(left)} workload(s) after the error(s) above: {shown}"
        )
    return summary
