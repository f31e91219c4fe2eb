"""What a bench run will do, decided before any worker starts: the options, the devices,
and the work grouped by (definition, workload) with each definition's sidecar.

A run cannot mislead: devices are checked against the machine before a worker starts; a
filter that selects nothing, or a dataset with nothing to run, is an error that lists what
there is; what is not run (solutions without workloads or definition) is said. ``resume``
leaves out what the dataset's traces hold already, and a solution folder whose files changed
since its JSON was packed is listed to be packed (and run again).
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from fibgen.bench.timing import Flush, check_flush
from fibgen.curation.workloads import load_workloads
from fibgen.format import (
    Definition,
    FormatError,
    Solution,
    Workload,
    dataset_files,
    load_definition_files,
    read_solution,
)
from fibgen.format.dataset import is_solution_folder, is_stale, read_extras, trace_path

__all__ = [
    "BenchError",
    "BenchOptions",
    "DeviceError",
    "Plan",
    "check_devices",
    "load_extras",
    "plan",
    "traced_triples",
]


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
    flush: Flush = "read"
    # Each solution in a fresh process of its own (Note [isolated solutions] in
    # isolation.py); off only to measure what that costs (benchmarks/isolation.py).
    isolate: bool = True


@dataclass(frozen=True)
class Group:
    definition: Definition
    workload: Workload
    solutions: tuple[Solution, ...]
    tolerance: dict
    hints: dict
    # (solution, its JSON, whether it is a solution folder): logs name the user's files.
    origins: tuple[tuple[str, str, bool], ...] = ()

    def origin(self, solution: str) -> tuple[str, bool] | None:
        """Where ``solution`` was read from: its JSON and whether it is a solution folder."""
        for name, path, folder in self.origins:
            if name == solution:
                return (path, folder)
        return None


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


def load_extras(definition_file: Path, definition: Definition, root: Path | None = None) -> dict:
    """The sidecar beside a definition JSON: ``{"tolerance": {...}, "hints": {...}}``.

    A definition without one that has the same axes, tensors and constraints as the
    built-in catalogue's definition of its name (a flashinfer-bench dataset's, say) gets the
    catalogue's: its index tensors are then made valid and its tolerance applies.
    """
    try:
        extras = read_extras(definition_file, root=root)
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


def listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return (shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")) or "none"


def _solution_files(
    root: Path, options: BenchOptions
) -> tuple[list[tuple[Path, Solution]], list[tuple[Path, Solution]]]:
    """The dataset's solutions, and those ``--solutions`` adds (a folder or file that adds
    none is an error); patterns are applied later."""
    found = [(p, read_solution(p)) for p in dataset_files(root, "solutions")]
    added: list[tuple[Path, Solution]] = []
    for item in options.solutions:
        path = Path(item)
        if path.is_dir():
            files = [
                (p, read_solution(p))
                for p in sorted(path.rglob("*.json"))
                if not any(part.startswith(".") for part in p.relative_to(path).parts)
            ]
            if not files:
                raise BenchError(f"--solutions {item}: the folder holds no Solution JSON")
            added += files
        elif path.is_file():
            added.append((path, read_solution(path)))
    return found, added


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

    groups: list[Group]
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
                f"{listing(sorted(definitions))}"
            )
    found, added = _solution_files(root, options)
    names: dict[str, tuple[Path, Solution]] = {}
    for path, solution in found + added:
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
                f"folder; the solutions are: {listing(sorted(names))}"
            )
    if added and not patterns:
        # Files or folders alone: those are the solutions to run, beside the dataset's own.
        chosen_names = {s.name for _, s in added}
        selected = [(p, s) for p, s in names.values() if s.name in chosen_names]
    else:
        selected = [(p, s) for p, s in names.values() if _matches(s.name, patterns)]
    workloads = load_workloads(root)
    by_definition: dict[str, list[Solution]] = {}
    notes: list[str] = []
    unknown = sorted({s.definition for _, s in selected if s.definition not in definitions})
    if unknown:
        notes.append(
            f"not run: solutions of {len(unknown)} definition(s) that are not in "
            f"{root}/definitions: {listing(unknown)}"
        )
    gpu = any(d.strip().startswith("cuda") for d in options.devices)
    cpu_only = sorted(s.name for _, s in selected if s.spec.language == "cuda" and not gpu)
    if cpu_only:
        notes.append(
            f"not run: {len(cpu_only)} cuda solution(s) on a CPU ({listing(cpu_only)}); "
            "give --devices cuda:N on a machine with a GPU"
        )
    for _, solution in selected:
        if solution.name not in cpu_only:
            by_definition.setdefault(solution.definition, []).append(solution)
    stale = sorted(
        p for p, s in selected if s.definition in definitions and root in p.parents and is_stale(p)
    )
    packed = {s.name for p, s in selected if p in stale}
    # Absolute: trace logs that name them are read later, from anywhere.
    origins = {s.name: (os.path.abspath(p), is_solution_folder(p, s)) for p, s in selected}
    done = traced_triples(root) if options.resume else set()
    groups: list[Group] = []
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
        extras = load_extras(definition_files[name][0], definition, root)
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
                    Group(
                        definition,
                        workload,
                        todo,
                        _tolerance(extras),
                        extras.get("hints") or {},
                        tuple((s.name, *origins[s.name]) for s in todo),
                    )
                )
    if no_workloads:
        notes.append(
            f"not run: no workloads for {listing(no_workloads)} (make some with `fibgen "
            f"workloads {no_workloads[0]} --axes AXIS=V1,V2 -o {root}`)"
        )
    if not groups and not skipped:
        what = []
        if options.definitions:
            what.append(f"--definitions {' '.join(options.definitions)}")
        if options.solutions:
            what.append(f"--solutions {' '.join(options.solutions)}")
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
    """The devices, checked against this machine before any worker starts (DeviceError if
    not), as the workers take them: ``cuda`` is ``cuda:0``, the first device CUDA shows."""
    import torch

    if not devices:
        raise DeviceError("--devices is empty; give cpu, cuda or cuda:N (comma-separated)")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = []
    for text in devices:
        try:
            device = torch.device(text)
        except (RuntimeError, ValueError):
            raise DeviceError(
                f"--devices {text!r} is not a device; write cpu, cuda or cuda:N"
            ) from None
        if device.type == "cpu":
            out.append(text)
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
        out.append(f"cuda:{device.index or 0}")
    return tuple(out)
