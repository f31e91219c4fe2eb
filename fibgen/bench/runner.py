"""The benchmark runner: every definition × workload × solution, in worker processes.

Work is grouped by (definition, workload): a worker makes the inputs and the reference
outputs once, then evaluates each solution of the definition on them. One worker runs per
device entry (``cuda:0,cuda:1`` runs two in parallel; ``cpu,cpu`` also works), each driven by
a thread of the runner. A solution that kills its worker (a crash, ``os.abort()``, a CUDA
error) is recorded as RUNTIME_ERROR, one that outlasts ``timeout`` as TIMEOUT; the worker is
started again and the run goes on.

Results are appended as Trace lines to ``traces/<author>/<op_type>/<definition>.jsonl`` after
each workload, so an interrupted run keeps what it finished and ``resume`` skips it.
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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
    load_definitions,
    load_solution,
    load_solutions,
)
from fibgen.runtime.workloads import load_workloads

# Suffix of the sidecar beside a definition JSON that holds what flashinfer-bench's format
# has no field for: the `.fidef` tolerance and input generation hints. Not `.json`, so that
# flashinfer-bench's loader, which reads every JSON file under definitions/, skips it.
EXTRAS_SUFFIX = ".fibgen"

# Preparing a workload (inputs, the reference and its timing) gets this many timeouts.
PREPARE_TIMEOUTS = 4


class BenchError(Exception):
    """A benchmark that cannot start: a bad dataset, filter or option."""


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
    """What a run did: traces written by status, triples skipped, workloads that failed."""

    statuses: Counter = field(default_factory=Counter)
    skipped: int = 0
    problems: list[str] = field(default_factory=list)
    trace_files: set[Path] = field(default_factory=set)

    @property
    def traces(self) -> int:
        """Number of traces written."""
        return sum(self.statuses.values())


@dataclass(frozen=True)
class _Group:
    definition: Definition
    workload: Workload
    solutions: tuple[Solution, ...]
    tolerance: dict
    hints: dict


def load_extras(root: Path, definition: Definition) -> dict:
    """The sidecar of a definition: ``{"tolerance": {...}, "hints": {...}}``, or empty."""
    path = root / "definitions" / definition.op_type / f"{definition.name}{EXTRAS_SUFFIX}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise BenchError(f"{path}: not a readable JSON sidecar: {exc}") from None
    if not isinstance(data, dict):
        raise BenchError(f"{path}: expected a JSON object with 'tolerance' and 'hints'")
    return data


def _tolerance(extras: dict) -> dict:
    given = extras.get("tolerance") or {}
    return {k: given.get(k) for k in ("atol", "rtol", "matched")}


def _matches(name: str, patterns: list[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _solution_pool(root: Path, options: BenchOptions) -> list[Solution]:
    pool = load_solutions(root)
    patterns = []
    for item in options.solutions:
        path = Path(item)
        if path.is_dir():
            pool.extend(load_solution(p) for p in sorted(path.rglob("*.json")))
        elif path.is_file():
            pool.append(load_solution(path))
        else:
            patterns.append(item)
    seen: dict[tuple[str, str], Solution] = {}
    for solution in pool:
        key = (solution.definition, solution.name)
        if key in seen and seen[key] != solution:
            raise BenchError(
                f"two different solutions named {solution.name!r} for {solution.definition!r}"
            )
        seen[key] = solution
    return [s for s in seen.values() if _matches(s.name, patterns)]


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


def plan(root: Path, options: BenchOptions) -> tuple[list[_Group], int]:
    """The work of a run, grouped by (definition, workload); and how many triples it skips."""
    try:
        check_flush(options.flush)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if not root.is_dir():
        raise BenchError(f"dataset {root} does not exist")
    definitions = load_definitions(root)
    if not definitions:
        raise BenchError(f"dataset {root} has no definitions under {root}/definitions/")
    workloads = load_workloads(root)
    by_definition: dict[str, list[Solution]] = {}
    for solution in _solution_pool(root, options):
        by_definition.setdefault(solution.definition, []).append(solution)
    done = traced_triples(root) if options.resume else set()
    groups, skipped = [], 0
    for name in sorted(definitions):
        if not _matches(name, list(options.definitions)):
            continue
        definition = definitions[name]
        candidates = sorted(by_definition.get(name, ()), key=lambda s: s.name)
        if not candidates:
            continue
        extras = load_extras(root, definition)
        for workload in workloads.get(name, ()):
            todo = tuple(s for s in candidates if (name, workload.uuid, s.name) not in done)
            skipped += len(candidates) - len(todo)
            if todo:
                groups.append(
                    _Group(
                        definition, workload, todo, _tolerance(extras), extras.get("hints") or {}
                    )
                )
    return groups, skipped


class _Handle:
    """One worker process on one device, started again after it dies or hangs."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.process: Any = None
        self.conn: Any = None

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=w.main, args=(child, self.device), daemon=True)
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


def _evaluation(result: dict, ref_ms: float, hardware: str, libs: dict) -> dict:
    evaluation: dict = {
        "status": result["status"],
        "environment": {"hardware": hardware, "libs": libs},
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "log": result.get("log", ""),
    }
    if "correctness" in result:
        evaluation["correctness"] = result["correctness"]
    if result["status"] == w.PASSED:
        latency = result["latency_ms"]
        evaluation["performance"] = {
            "latency_ms": latency,
            "reference_latency_ms": ref_ms,
            "speedup_factor": ref_ms / latency if latency > 0 else 0.0,
        }
    return evaluation


def _run_group(handle: _Handle, group: _Group, root: Path, options: BenchOptions) -> tuple:
    """Evaluate every solution of a group; (traces, problem or None)."""
    request = (
        "workload",
        group.definition.model_dump(mode="json", exclude_none=True),
        group.workload.model_dump(mode="json"),
        str(root),
        group.hints,
        options.seed,
        options.flush,
    )
    prepare_timeout = options.timeout * PREPARE_TIMEOUTS
    reply = handle.ask(request, prepare_timeout)
    if reply[0] != "ready":
        why = {"timeout": f"timed out after {prepare_timeout:g} s"}.get(reply[0], reply[-1])
        return [], f"{group.definition.name} workload {group.workload.uuid}: {why}"
    _, ref_ms, hardware, libs = reply
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
            ),
            options.timeout,
        )
        if reply[0] == "result":
            result = reply[1]
        elif reply[0] == "timeout":
            result = {"status": w.TIMEOUT, "log": f"no result after {options.timeout:g} s"}
        elif reply[0] == "died":
            result = {"status": w.RUNTIME_ERROR, "log": reply[1]}
        else:
            result = {"status": w.RUNTIME_ERROR, "log": reply[1]}
        if handle.process is None:
            # The worker is gone (or exited after a CUDA error): a new one needs the inputs.
            again = handle.ask(request, prepare_timeout)
            if again[0] != "ready":
                traces.append((solution, _evaluation(result, ref_ms, hardware, libs)))
                rest = ", ".join(s.name for s in group.solutions[len(traces) :])
                return traces, (
                    f"{group.definition.name} workload {group.workload.uuid}: a new worker "
                    f"could not prepare the workload; not run: {rest or 'none'}"
                )
        traces.append((solution, _evaluation(result, ref_ms, hardware, libs)))
    return traces, None


def run_bench(
    root: str | os.PathLike[str],
    options: BenchOptions = BenchOptions(),
    *,
    progress: bool = True,
    on_trace: Callable[[Trace], None] | None = None,
) -> BenchSummary:
    """Benchmark every solution on every workload of the dataset; append Trace lines."""
    root = Path(root)
    if not options.devices:
        raise BenchError("no devices given")
    try:
        groups, skipped = plan(root, options)
    except FormatError as exc:
        raise BenchError(str(exc)) from None
    summary = BenchSummary(skipped=skipped)
    work: queue.Queue[_Group] = queue.Queue()
    for group in groups:
        work.put(group)
    bar = _Progress(groups, progress)
    lock = threading.Lock()

    def drive(device: str) -> None:
        handle = _Handle(device)
        try:
            while True:
                try:
                    group = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    results, problem = _run_group(handle, group, root, options)
                except Exception as exc:
                    # The runner itself failed on this device (no worker could start):
                    # report it and leave the remaining work to the other devices.
                    with lock:
                        summary.problems.append(f"device {device}: {type(exc).__name__}: {exc}")
                    return
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
                with lock:
                    for trace in traces:
                        summary.statuses[trace.evaluation.status.value] += 1
                        if on_trace is not None:
                            on_trace(trace)
                    if traces:
                        paths = append_traces(root, group.definition.op_type, traces)
                        summary.trace_files.update(paths)
                    if problem is not None:
                        summary.problems.append(problem)
                bar.tick(group, len(group.solutions), True)
        finally:
            handle.stop()

    threads = [threading.Thread(target=drive, args=(d,), daemon=True) for d in options.devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    return summary
