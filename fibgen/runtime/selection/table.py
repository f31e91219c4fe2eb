"""Building the best-solution table: reading traces, and ranking the solutions per
definition and per var-axis key on one hardware."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from fibgen.runtime.selection import hardware
from fibgen.runtime.selection.policy import Policy, normalize_config, policy_of
from fibgen.runtime.solutions.loading import (
    BUILT_LANGUAGES,
    IMPORTED_LANGUAGES,
    bad_definition_files,
    is_definition_json,
)


def _scan(base: str, suffix: str, out: list[tuple[str, int, int]]) -> None:
    # os.scandir, not pathlib: the warm path stats every file and must stay in milliseconds.
    # Any depth, as flashinfer-bench reads (Note [dataset depth] in
    # fibgen/format/dataset/layout.py); names starting with a dot are a writer's temporary
    # files and locks.
    try:
        it = os.scandir(base)
    except (FileNotFoundError, NotADirectoryError):
        return
    with it:
        for entry in it:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                _scan(entry.path, suffix, out)
            elif entry.name.endswith(suffix) and entry.is_file():
                st = entry.stat()
                out.append((entry.path, st.st_size, st.st_mtime_ns))


def trace_inputs(root: Path) -> dict[str, list[tuple[str, int, int]]]:
    found: dict[str, list[tuple[str, int, int]]] = {}
    for kind, suffix in (("traces", ".jsonl"), ("solutions", ".json"), ("definitions", ".json")):
        files: list[tuple[str, int, int]] = []
        _scan(str(root / kind), suffix, files)
        found[kind] = sorted(files)
    return found


# Note [reading traces]
# A trace file is read line by line as JSON, as flashinfer-bench and fibgen write it, and no
# line can stop apply from being enabled:
# - Non-finite errors read as the floats they stand for, in either spelling: Python's json
#   reads bare NaN and Infinity, and flashinfer-bench writes them as the strings "NaN",
#   "Infinity" and "-Infinity" (pydantic's ser_json_inf_nan="strings"). A string that is no
#   number, or a value of another type, is an unknown error: NaN.
# - No tolerance admits a NaN, infinite or negative error (flashinfer-bench's filter,
#   `error <= tol`, rejects NaN and inf too, and its model refuses a negative error). A
#   missing error counts as 0, the default of both formats' models; a PASSED trace with no
#   correctness object has unknown errors, which a policy with atol or rtol rejects, as
#   flashinfer-bench's filter rejects a trace without correctness.
# - A latency that is not a positive finite number is unknown, and the slowest; a speedup
#   that is not a finite number of 0 or more is 0. flashinfer-bench's Performance writes a
#   non-finite latency as null, and a solution whose timing is unknown is never the fastest.
# - A line that is not a trace (not JSON; a definition, workload uuid or solution that is not
#   a string; axis values that are not whole numbers; other axes than most traces of its
#   definition have, so no key to judge it at) is skipped and counted, and the warning at
#   enable says how many (`fibgen validate` names them); so is a file that cannot be
#   read, as one line. A workload trace (no solution, no evaluation: what tracing writes) is
#   not an evaluation and is not counted at all.


def _number(value: Any) -> float:
    """A metric as a float, in either spelling of a non-finite one (Note [reading traces])."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "NaN", "Infinity", "-Infinity" as flashinfer-bench writes them
        except ValueError:
            return math.nan
    return math.nan


def _errors(evaluation: dict) -> tuple[float, float]:
    """(max absolute error, max relative error) of an evaluation (Note [reading traces])."""
    correctness = evaluation.get("correctness")
    if not isinstance(correctness, dict):
        return math.nan, math.nan
    return (
        _number(correctness.get("max_absolute_error", 0.0)),
        _number(correctness.get("max_relative_error", 0.0)),
    )


def _within(error: float, limit: float | None) -> bool:
    # False for NaN, and for a negative error, which no evaluator writes: unknown errors are
    # within no tolerance.
    return limit is None or 0.0 <= error <= limit


def _meets(evaluation: dict, policy: Policy) -> bool:
    abs_err, rel_err = _errors(evaluation)
    return _within(abs_err, policy.atol) and _within(rel_err, policy.rtol)


def _parse(line: str) -> tuple[str, str, str, dict, dict] | str | None:
    """(definition, workload uuid, solution, axes, evaluation) of a trace line; "workload" for
    a workload trace; None for a line that is not a trace (Note [reading traces])."""
    try:
        trace = json.loads(line)
    except ValueError:
        return None
    if not isinstance(trace, dict):
        return None
    name, workload = trace.get("definition"), trace.get("workload")
    if not isinstance(name, str) or not isinstance(workload, dict):
        return None
    uuid, axes = workload.get("uuid"), workload.get("axes")
    if not isinstance(uuid, str) or not isinstance(axes, dict):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in axes.values()):
        return None
    solution, evaluation = trace.get("solution"), trace.get("evaluation")
    if solution is None or not evaluation:
        return "workload"
    if not isinstance(solution, str) or not isinstance(evaluation, dict):
        return None
    return name, uuid, solution, axes, evaluation


def _var_axes(definition: dict) -> list[str]:
    return [a for a, spec in definition["axes"].items() if spec.get("type") == "var"]


def _bindings(definition: dict) -> list[list] | None:
    # Where each var axis can be read at call time: the first input whose shape names it
    # ([input, dim]), else the integer scalar input of its name ([input, None]; Note [axes
    # bound by a scalar] in fibgen/compiler/ir.py).
    # Imported here: the selection modules import no pydantic at start-up.
    from fibgen.format.models import var_axis_scalars

    out: list[list] = []
    scalars = var_axis_scalars(definition["axes"], definition["inputs"])
    for axis in _var_axes(definition):
        if axis in scalars:
            out.append([scalars[axis], None])
            continue
        for name, tensor in definition["inputs"].items():
            shape = tensor.get("shape") or []
            if axis in shape:
                out.append([name, shape.index(axis)])
                break
        else:
            return None
    return out


def _is_dps(path: Path) -> bool:
    try:
        spec = json.loads(path.read_text(encoding="utf-8")).get("spec", {})
    except (OSError, ValueError, AttributeError):
        return False  # reported with the file named when the solution is loaded
    return bool(spec.get("destination_passing_style", True))


def build_table(
    root: str | os.PathLike[str], config: Any = None, where: hardware.Here | None = None
) -> dict:
    """Build the table from the traces under ``root`` (no cache), for the hardware ``where``
    (default: this process's)."""
    root = Path(root).resolve()
    where = hardware.here() if where is None else where
    return build_ranking(root, trace_inputs(root), normalize_config(config), where)


def _read_json(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # reported with the file named when the solution is loaded, or counted


def _solution_index(
    root: Path, inputs: dict
) -> tuple[dict[str, dict[str, str]], dict[tuple[str, str], tuple[Any, Any]], int]:
    """definition → solution name → JSON path relative to root; each solution's (language,
    target_hardware); and the number of unreadable files."""
    paths: dict[str, dict[str, str]] = {}
    specs: dict[tuple[str, str], tuple[Any, Any]] = {}
    unreadable = 0
    for path, _, _ in inputs["solutions"]:
        data = _read_json(path)
        name = data.get("name") if isinstance(data, dict) else None
        definition = data.get("definition") if isinstance(data, dict) else None
        if not isinstance(name, str) or not isinstance(definition, str):
            unreadable += 1
            continue
        if name not in paths.setdefault(definition, {}):
            paths[definition][name] = os.path.relpath(path, root)
            spec = data.get("spec") if isinstance(data.get("spec"), dict) else {}
            specs[(definition, name)] = (spec.get("language"), spec.get("target_hardware"))
    return paths, specs, unreadable


def _definition_json(inputs: dict, name: str, cache: dict[str, Any]) -> dict | None:
    """The JSON of definition ``name``: the dataset's (the file named after it first, then
    every file), else fibgen's catalogue's, as ``solutions.find_definition`` looks it up."""
    if name in cache:
        return cache[name]
    files = [p for p, _, _ in inputs["definitions"]]
    named = [p for p in files if Path(p).stem == name]
    # Every file is read once: a name found in none of them needs no second scan.
    for path in named + ([] if _NAMES in cache else files):
        data = _read_json(path)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            cache.setdefault(_NAMES, set()).add(data["name"])
            if is_definition_json(data):
                cache.setdefault(data["name"], data)
    cache.setdefault(_NAMES, set())
    found = cache.get(name)
    if found is None and name not in cache[_NAMES]:
        from fibgen.paths import builtin_definition_file

        path = builtin_definition_file(name)
        data = None if path is None else _read_json(path)
        found = data if is_definition_json(data) and data["name"] == name else None
    cache[name] = found
    return found


def _has_definition(inputs: dict, name: str, cache: dict[str, Any]) -> bool:
    """Whether the dataset or fibgen's catalogue defines ``name`` (in a file fit or not)."""
    from fibgen.paths import builtin_definition_file

    _definition_json(inputs, name, cache)
    return name in cache[_NAMES] or builtin_definition_file(name) is not None


# The names in the dataset's definition files, under a key no definition can have.
_NAMES = "\0names"


# Note [selection per hardware]
# Latencies measured on different hardware are never compared: an H100 trace of a CUDA
# solution says nothing about how it compares with a Python solution timed on a CPU, and the
# CUDA solution cannot run on the CPU at all. Traces are grouped by the hardware they were
# measured on (Note [hardware strings] in fibgen/runtime/selection/hardware.py; every string that names
# this machine is one group), and the last trace of a (definition, workload, solution) counts
# within its group only: a CPU run does not supersede an H100 one. A solution is judged in a
# group by its traces there (Note [selection beside flashinfer-bench]), and each definition is
# ranked on one group: of those with a candidate that can run here, the one measured on this
# machine, else on hardware of this kind (another GPU), else any other; more candidates, then
# more traces, break ties. A candidate can run here when fibgen can build or import its
# language, the language can run on this device (cuda needs a GPU; triton a GPU or its
# interpreter) and, unless it was measured on this machine, its spec.target_hardware names
# this kind of device or no kind at all (flashinfer-bench itself does not read
# target_hardware, so a trace from here outweighs it).


def _hardware_of(evaluation: dict) -> str:
    environment = evaluation.get("environment")
    hw = environment.get("hardware") if isinstance(environment, dict) else None
    return hw if isinstance(hw, str) and hw.strip() else "unknown"


def _runnable(spec: tuple[Any, Any], where: hardware.Here, measured_here: bool) -> str | None:
    """Why a solution cannot run on ``where``, or None (Note [selection per hardware])."""
    language, target = spec
    if language not in IMPORTED_LANGUAGES + BUILT_LANGUAGES:
        # flashinfer-bench's tilelang, or a language a newer writer adds.
        return f"fibgen cannot build or import {language} solutions"
    problem = hardware.language_problem(str(language), where)
    if problem is None and not measured_here:
        problem = hardware.target_problem(target, where)
    return problem


# Note [selection beside flashinfer-bench]
# flashinfer-bench 0.1.2's apply (apply/table.py) keeps the traces that PASSED within its
# tolerances (max_atol 1e-2, max_rtol 1e-5 by default), one by one, and picks per var-axis key
# the trace with the highest speedup_factor; a key that no such trace covers is a miss, which
# calls the fallback, or with on_miss_policy="use_def_best" the solution that won the most
# keys. fibgen selects per trace too, with these differences, each on the safe side:
#
# - A solution is a candidate at a key where its traces pass; a key where one of its traces
#   failed (another workload of the same key) is not one of its keys. flashinfer-bench would
#   still pick it there on the passing trace.
# - A solution with a failing trace is *partial*: it serves the keys where it passed and no
#   other. A key that no trace covers, or that only failures cover, goes to the *trusted*
#   solutions, those with no failing trace on the hardware the definition is ranked on:
#   the best of them (on_miss "best"), the fastest of them at the nearest traced key
#   ("nearest"), and the fallback where none is trusted. A solution known to be wrong on some
#   input is not trusted on inputs nobody tried. flashinfer-bench's best-by-wins may be such
#   a solution.
# - The definition's best is the trusted solution with the highest geometric mean of its
#   speedups over its traces, not the one that wins the most keys. Counting wins ignores by
#   how much: a solution 1% ahead on three keys and ten times slower on two beats one that is
#   1% behind on three and ten times faster on two, and which keys happen to be benchmarked
#   (ten small batch sizes and one large) decides the count. The geometric mean weighs every
#   trace by its ratio, and a miss is served by what is fast across the inputs measured.
# - Per key, the fastest is the highest median speedup over the reference end to end (Note
#   [selection metric]), as flashinfer-bench picks the highest speedup_factor; by GPU time,
#   the lowest median latency. An end-to-end figure is taken in the solution's own process
#   (Note [isolated solutions] in fibgen/bench/isolation.py), and on one H100 host the same
#   routed call, and a bare ``torch.empty``, cost up to 1.7x more in one process than in the
#   next, and in one process from one second to the next: it is the machine's speed, not the
#   process's (benchmarks/README.md, "Process to process", "Host speed"). Latencies from two
#   processes do not rank two solutions, while each one's ratio to the reference timed in
#   the same rounds of the same process does. The API's own function is compared the same
#   way, per trace.
# - Tolerances are off by default (any PASSED trace counts: bench judged it against the
#   definition's own tolerance); a policy's atol/rtol filter as flashinfer-bench's do, and
#   no tolerance admits an unknown or non-finite error (Note [reading traces]).


class _Record:
    """One solution's traces of one definition on one hardware: the figures of the keys where
    they passed, and the keys where one failed."""

    __slots__ = ("passed", "failed", "tolerance")

    def __init__(self) -> None:
        self.passed: dict[tuple, list[tuple]] = {}
        self.failed: set[tuple] = set()
        self.tolerance = False  # some key failed on the policy's atol/rtol alone

    def keys(self) -> list[tuple]:
        """The keys this solution may serve (Note [selection beside flashinfer-bench])."""
        return [k for k in self.passed if k not in self.failed]


def _read_traces(
    inputs: dict, where: hardware.Here
) -> tuple[dict[tuple[str, str, str, str], tuple[dict, dict]], dict[str, str], int, int]:
    """The last trace of each (definition, workload, solution, hardware group) in reading
    order; a label per group; the number of evaluated traces and of lines skipped."""
    # The last trace supersedes the earlier ones: a solution repaired and benchmarked again is
    # judged on what it is now. Traces of other hardware do not (Note [selection per hardware]).
    latest: dict[tuple[str, str, str, str], tuple[dict, dict]] = {}
    labels: dict[str, str] = {}  # hardware group -> the first hardware string read of it
    evaluated = skipped = 0
    for path, _, _ in inputs["traces"]:
        try:
            # Bytes that are not UTF-8 spoil their line only: it is not JSON.
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            skipped += 1
            continue
        for line in lines:
            if not line.strip():
                continue
            parsed = _parse(line)
            if parsed is None:
                skipped += 1
                continue
            if isinstance(parsed, str):  # "workload"
                continue
            name, uuid, solution, axes, evaluation = parsed
            evaluated += 1
            hw = _hardware_of(evaluation)
            group = "" if where.is_here(hw) else hardware.normalize(hw) or "unknown"
            labels.setdefault(group, hw)
            key = (name, uuid, solution, group)
            latest.pop(key, None)
            latest[key] = (evaluation, axes)
    return latest, labels, evaluated, skipped


def _judge(
    latest: dict[tuple[str, str, str, str], tuple[dict, dict]], config: dict[str, Policy]
) -> tuple[dict[str, dict[str, dict[str, _Record]]], dict[str, list[str]], int]:
    """definition → hardware group → solution → its record; each definition's key order (the
    axes most of its traces have); and the number of traces with other axes."""
    # axis names → [traces that have them, their order in the first such trace]
    seen: dict[str, dict[frozenset[str], list]] = {}
    for (name, *_), (_, axes) in latest.items():
        seen.setdefault(name, {}).setdefault(frozenset(axes), [0, list(axes)])[0] += 1
    axes_of = {name: max(sets.values(), key=lambda c: c[0])[1] for name, sets in seen.items()}
    stats: dict[str, dict[str, dict[str, _Record]]] = {}
    unkeyed = 0
    for (name, _, solution, group), (evaluation, axes) in latest.items():
        order = axes_of[name]
        if len(axes) != len(order) or any(a not in axes for a in order):
            unkeyed += 1  # no key to judge it at (Note [reading traces])
            continue
        key = tuple(axes[a] for a in order)
        record = stats.setdefault(name, {}).setdefault(group, {}).setdefault(solution, _Record())
        policy = policy_of(config, name)
        if evaluation.get("status") != "PASSED":
            record.failed.add(key)
        elif not _meets(evaluation, policy):
            record.failed.add(key)
            record.tolerance = True
        else:
            perf = evaluation.get("performance")
            figures = _figures(perf if isinstance(perf, dict) else {}, policy)
            record.passed.setdefault(key, []).append(figures)
    return stats, axes_of, unkeyed


def _rank(candidates: dict[str, _Record]) -> tuple[list[str], dict[tuple, str], dict[tuple, str]]:
    """The trusted candidates best first; per key the fastest candidate; per key the fastest
    trusted one (Note [selection beside flashinfer-bench])."""
    trusted = sorted(s for s, r in candidates.items() if not r.failed)
    rows = {s: [f for figures in candidates[s].passed.values() for f in figures] for s in trusted}
    # The metric asked for where every ranked trace records it, GPU time otherwise; each key
    # decides alike among its own candidates (_fastest).
    e2e = all(f[3] is not None for figures in rows.values() for f in figures)
    ranking = sorted(
        trusted,
        key=lambda s: (
            -statistics.fmean(math.log(max(f[3 if e2e else 1], 1e-12)) for f in rows[s]),
            s,
        ),
    )
    per_key: dict[tuple, dict[str, list[tuple]]] = {}
    for s, r in candidates.items():
        for key in r.keys():
            per_key.setdefault(key, {})[s] = r.passed[key]
    keys = {key: _fastest(c) for key, c in per_key.items()}
    trusted_keys = {}
    for key, c in per_key.items():
        safe = {s: figures for s, figures in c.items() if s in trusted}
        if safe:
            trusted_keys[key] = _fastest(safe)
    return ranking, keys, trusted_keys


def _miss_original(candidates: dict[str, _Record], ranking: list[str]) -> bool:
    """Whether the definition's best is slower than the API's own function (Note [the API's
    own function as a candidate])."""
    if not ranking:
        return False
    rows = [f for figures in candidates[ranking[0]].passed.values() for f in figures]
    e2e = all(f[3] is not None for f in rows)
    return not _beats_original(rows, e2e)


def _keyed(
    root: Path,
    definition: dict | None,
    trace_axes: list[str],
    known: dict[str, str],
    ranking: list[str],
    keys: dict[tuple, str],
    trusted_keys: dict[tuple, str],
) -> tuple[dict | None, str]:
    """What a keyed entry needs (``entries.keyed_entry``), or None and why it cannot be."""
    if definition is None:
        return None, "its definition is neither under definitions/ nor in fibgen's catalogue"
    bind = _bindings(definition)
    if bind is None:
        return None, "a var axis of its definition is in no input's shape"
    axes = _var_axes(definition)
    if sorted(axes) != sorted(trace_axes):
        return None, (
            f"its traces' workload axes ({', '.join(trace_axes)}) are not its var axes "
            f"({', '.join(axes)})"
        )
    # Keys in the definition's var-axis order, as the keyed entry reads them.
    position = [trace_axes.index(a) for a in axes]
    chosen = (set(keys.values()) | set(trusted_keys.values()) | set(ranking[:1])) - {ORIGINAL}

    def listed(choices: dict[tuple, str]) -> list:
        return [[[k[i] for i in position], s] for k, s in sorted(choices.items())]

    return {
        "dps": any(_is_dps(root / known[s]) for s in chosen),
        "bind": bind,
        "inputs": list(definition["inputs"]),
        "outputs": list(definition["outputs"]),
        "reference": definition["reference"],
        "keys": listed(keys),
        "trusted": listed(trusted_keys),
    }, ""


def build_ranking(
    root: Path, inputs: dict, config: dict[str, Policy], where: hardware.Here
) -> dict:
    latest, labels, evaluated, skipped = _read_traces(inputs, where)
    stats, axes_of, unkeyed = _judge(latest, config)
    paths, specs, unreadable = _solution_index(root, inputs)
    definitions: dict[str, Any] = {}
    table: dict[str, Any] = {}
    chosen_groups: dict[str, str] = {}
    unkeyable: dict[str, str] = {}
    slower: dict[str, str] = {}  # definitions the API's own function serves best
    for name, by_group in sorted(stats.items()):
        known = paths.get(name, {})
        choices = []
        measured_here = by_group.get("", {})
        for group, by_solution in by_group.items():
            candidates = {
                s: r
                for s, r in by_solution.items()
                if r.keys()
                and s in known
                and _runnable(specs[(name, s)], where, s in measured_here) is None
            }
            if candidates:
                tier = 0 if group == "" else where.tier(labels[group])
                size = sum(len(f) for r in candidates.values() for f in r.passed.values())
                choices.append(((tier, -len(candidates), -size, labels[group]), group, candidates))
        if not choices:
            continue
        _, group, candidates = min(choices)
        chosen_groups[name] = group
        ranking, keys, trusted_keys = _rank(candidates)
        miss_original = _miss_original(candidates, ranking)
        if miss_original and all(s == ORIGINAL for s in keys.values()):
            # Nothing beats the API's own function: the definition is not routed.
            slower[name] = labels[group]
            continue
        entry: dict[str, Any] = {
            "ranking": ranking,
            "solutions": {s: known[s] for s in sorted(candidates)},
            "hardware": labels[group],
            "measured_here": group == "",
        }
        if miss_original:
            entry["miss_original"] = True
        if not ranking or miss_original or any(s != ranking[0] for s in keys.values()):
            keyed, why = _keyed(
                root,
                _definition_json(inputs, name, definitions),
                axes_of[name],
                known,
                ranking,
                keys,
                trusted_keys,
            )
            if keyed is not None:
                entry["keyed"] = keyed
            elif not ranking:
                # Only partial solutions, which may serve their own keys alone: unroutable.
                unkeyable[name] = why
                continue
        table[name] = entry
    unused = _unused(
        stats,
        chosen_groups,
        table,
        unkeyable,
        paths,
        specs,
        where,
        _unknown_definitions(inputs, paths, definitions),
        unreadable,
        evaluated,
        skipped + unkeyed,
        len(inputs["solutions"]),
        slower,
    )
    files = [Path(p) for p, _, _ in inputs["definitions"]]
    unused["bad_definitions"] = bad_definition_files(root, files)
    return {"root": str(root), "hardware": where.as_dict(), "definitions": table, "unused": unused}


def _unknown_definitions(
    inputs: dict, paths: dict[str, dict[str, str]], cache: dict[str, Any]
) -> list[str]:
    """Solutions (``definition/solution``) for definitions neither the dataset nor fibgen's
    catalogue has: only a dispatcher that knows the name can route them."""
    return sorted(
        f"{d}/{s}" for d, by in paths.items() if not _has_definition(inputs, d, cache) for s in by
    )


# Note [the API's own function as a candidate]
# A routed call replaces the API's own function (FlashInfer's kernel): substituting a solution
# that is slower than it makes the engine slower, whatever the solution's speedup over the
# definition's reference. So bench times the API's own function beside each solution, in the
# same paired rounds and behind the same L2 flush (Note [bench e2e] in fibgen/bench/worker.py),
# and selection treats it as one more candidate, ``ORIGINAL``: a key whose fastest solution is
# slower than the API's own function in that solution's traces routes to the API (the keyed
# entry declines the call, and the dispatcher falls back to the original); a miss does too
# when the definition's best is slower than the API across its traces (``miss_original``);
# and a definition whose every key goes to the API is not routed at all, and is said so
# (``unused["slower"]``). Traces without the API's figures (written by flashinfer-bench, by
# an older fibgen, or where the API does not run) leave the solutions to the reference
# speedups alone, as before. FlashInfer-Bench's own selection has no such candidate: its
# apply substitutes the best solution even where it loses to the API it replaces.
#
# Hand-written code routed by name (``apply``) falls back to the caller's own code, not to
# the API: the API's own function stands for it, which holds where that code calls FlashInfer
# (flashinfer-bench's integrations wrap FlashInfer's calls so). Where it does not (a torch
# fallback, say), a solution slower than FlashInfer's kernel but faster than that code would
# be left unused: the policy's ``original=False`` takes the API's own function out of the
# candidates for the definitions it names, as flashinfer-bench selects.

ORIGINAL = "@original"


# Note [selection metric]
# A trace written by fibgen bench holds two timings of a solution: its GPU time behind an L2
# flush (latency_ms, flashinfer-bench's) and its end-to-end eager latency (e2e_latency_ms:
# back-to-back calls, Python and launch included, fibgen/bench/eager.py). They rank solutions
# differently for small calls, where a kernel that is fast on the GPU can cost more to launch
# than it saves. The default, "e2e", ranks by what a routed call costs when it is called
# eagerly, which is how apply is reached (a serving engine's prefill, an eager decode loop,
# tests); "gpu" ranks by kernel time alone, which is what a call replayed in a CUDA graph
# costs (the launch is replayed away), so a dataset for graph-captured decoding should ask
# for it. Where a candidate's traces lack the e2e figures (written by flashinfer-bench, or by
# an older fibgen), its definition is ranked by GPU time, the one figure all traces have.


def _latency(value: Any) -> float | None:
    """A latency in ms; None where it is not a positive finite number (Note [reading traces])."""
    ms = _number(value)
    return ms if 0.0 < ms < math.inf else None


def _figures(perf: dict, policy: Policy) -> tuple:
    """(GPU latency, GPU speedup, e2e latency or None, e2e speedup or None, the API's own GPU
    latency or None, its e2e latency or None) of a trace."""
    latency = _latency(perf.get("latency_ms"))
    speedup = _number(perf.get("speedup_factor"))
    figures = (
        math.inf if latency is None else latency,
        speedup if 0.0 <= speedup < math.inf else 0.0,
    )
    # Without the API's own figures where the policy does not make it a candidate.
    original = policy.original
    own = (_latency(perf.get("original_latency_ms")) if original else None,)
    e2e = _latency(perf.get("e2e_latency_ms"))
    ref_e2e = _latency(perf.get("reference_e2e_latency_ms"))
    if policy.metric != "e2e" or e2e is None or ref_e2e is None:
        return figures + (None, None) + own + (None,)
    own_e2e = _latency(perf.get("original_e2e_latency_ms")) if original else None
    return figures + (e2e, ref_e2e / e2e) + own + (own_e2e,)


def _fastest(candidates: dict[str, list[tuple]]) -> str:
    """The candidate of one key with the lowest median latency, e2e where all have it; the
    API's own function (``ORIGINAL``) where the traces of that candidate measured it faster
    (Note [the API's own function as a candidate])."""
    e2e = all(f[2] is not None for rows in candidates.values() for f in rows)
    if e2e:  # ratios within one process (Note [selection beside flashinfer-bench])
        best = max(sorted(candidates), key=lambda s: statistics.median(f[3] for f in candidates[s]))
    else:
        best = min(sorted(candidates), key=lambda s: statistics.median(f[0] for f in candidates[s]))
    at, own = (2, 5) if e2e else (0, 4)
    rows = candidates[best]
    if rows and all(f[own] is not None for f in rows):
        # Per trace: the API's own function and the solution, timed in the same rounds.
        if statistics.median(f[own] / f[at] for f in rows) < 1.0:
            return ORIGINAL
    return best


def _beats_original(rows: list[tuple], e2e: bool) -> bool:
    """Whether a solution is faster than the API's own function across its traces (the
    geometric mean of the paired ratios); True where its traces did not measure it."""
    at, own = (2, 5) if e2e else (0, 4)
    pairs = [(f[at], f[own]) for f in rows if f[own] is not None and f[at] is not None]
    if not pairs:
        return True
    return statistics.fmean(math.log(max(o, 1e-12) / max(t, 1e-12)) for t, o in pairs) > 0


def _unused(
    stats: dict[str, dict[str, dict[str, _Record]]],
    chosen: dict[str, str],
    table: dict[str, Any],
    unkeyable: dict[str, str],
    paths: dict[str, dict[str, str]],
    specs: dict[tuple[str, str], tuple[Any, Any]],
    where: hardware.Here,
    unknown: list[str],
    unreadable: int,
    evaluated: int,
    skipped: int,
    files: int,
    slower: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What the table could not use, counted by reason, for the warning at enable; and the
    partial solutions it routes to some keys only."""
    # Labels of the solution files, by reason.
    failed: list[str] = []
    tolerance: list[str] = []
    untraced: list[str] = []
    other: list[str] = []
    not_here: list[str] = []
    partial: list[str] = []
    keyless: list[str] = []
    for d, by in sorted(paths.items()):
        groups = stats.get(d, {})
        for s in sorted(by):
            label = f"{d}/{s}"
            records = {g: r[s] for g, r in groups.items() if s in r}
            why = _runnable(specs[(d, s)], where, "" in records)
            if why is not None:
                not_here.append(f"{label}: {why}")
            elif not records:
                untraced.append(label)
            elif d in chosen and chosen[d] not in records:
                other.append(label)
            else:
                # Judged where its definition is ranked; with no group ranked, anywhere.
                judged = [records[chosen[d]]] if d in chosen else list(records.values())
                if not any(r.keys() for r in judged):
                    (tolerance if any(r.tolerance for r in judged) else failed).append(label)
                elif d in unkeyable:
                    keyless.append(f"{label}: {unkeyable[d]}")
                elif any(r.failed for r in judged) and "keyed" in table.get(d, {}):
                    partial.append(label)
    missing = sorted(
        {
            f"{d}/{s}"
            for d, by in stats.items()
            for records in by.values()
            for s in records
            if s not in paths.get(d, {})
        }
    )
    return {
        "solution_files": files,
        "evaluated_traces": evaluated,
        "skipped_lines": skipped,
        "unreadable": unreadable,
        "failed": failed,
        "tolerance": tolerance,
        "untraced": untraced,
        "missing": missing,
        "not_here": not_here,
        "other_hardware": other,
        "unkeyable": keyless,
        "partial": partial,
        "unknown_definitions": unknown,
        "slower": sorted(f"{d} ({hw})" for d, hw in (slower or {}).items()),
    }
