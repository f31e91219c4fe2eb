"""Building the best-solution table: reading traces, and ranking the solutions per
definition and per var-axis key on one hardware."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from fibgen.runtime import hardware
from fibgen.runtime.select_policy import Policy, _policy, normalize_config


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


def _inputs(root: Path) -> dict[str, list[tuple[str, int, int]]]:
    found: dict[str, list[tuple[str, int, int]]] = {}
    for kind, suffix in (("traces", ".jsonl"), ("solutions", ".json"), ("definitions", ".json")):
        files: list[tuple[str, int, int]] = []
        _scan(str(root / kind), suffix, files)
        found[kind] = sorted(files)
    return found


def _meets(evaluation: dict, policy: Policy) -> bool:
    correctness = evaluation.get("correctness") or {}
    if policy.atol is not None and correctness.get("max_absolute_error", 0.0) > policy.atol:
        return False
    return policy.rtol is None or correctness.get("max_relative_error", 0.0) <= policy.rtol


def _var_axes(definition: dict) -> list[str]:
    return [a for a, spec in definition.get("axes", {}).items() if spec.get("type") == "var"]


def _bindings(definition: dict) -> list[list] | None:
    # Where each var axis can be read at call time: the first input whose shape names it.
    out = []
    for axis in _var_axes(definition):
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
    return _build(root, _inputs(root), normalize_config(config), where)


def _read_json(path: str) -> Any:
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
    """The JSON of definition ``name``: the file named after it first, then every file."""
    if name in cache:
        return cache[name]
    files = [p for p, _, _ in inputs["definitions"]]
    for path in [p for p in files if Path(p).stem == name] + files:
        data = _read_json(path)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            cache[data["name"]] = data
            if data["name"] == name:
                return data
    cache[name] = None
    return None


# Note [selection per hardware]
# Latencies measured on different hardware are never compared: an H100 trace of a CUDA
# solution says nothing about how it compares with a Python solution timed on a CPU, and the
# CUDA solution cannot run on the CPU at all. Traces are grouped by the hardware they were
# measured on (Note [hardware strings] in fibgen/runtime/hardware.py; every string that names
# this machine is one group), and the last trace of a (definition, workload, solution) counts
# within its group only: a CPU run does not supersede an H100 one. A solution is judged in a
# group by its traces there (passed on every workload, within the policy's tolerances), and
# each definition is ranked on one group: of those with a candidate that can run here, the
# one measured on this machine, else on hardware of this kind (another GPU), else any other;
# more candidates, then more traces, break ties. A candidate can run here when its language
# can (cuda needs a GPU; triton a GPU or its interpreter) and, unless it was measured on this
# machine, its spec.target_hardware names this kind of device or no kind at all
# (flashinfer-bench itself does not read target_hardware, so a trace from here outweighs it).


def _hardware_of(evaluation: dict) -> str:
    environment = evaluation.get("environment")
    hw = environment.get("hardware") if isinstance(environment, dict) else None
    return hw if isinstance(hw, str) and hw.strip() else "unknown"


def _runnable(spec: tuple[Any, Any], where: hardware.Here, measured_here: bool) -> str | None:
    """Why a solution cannot run on ``where``, or None (Note [selection per hardware])."""
    language, target = spec
    problem = hardware.language_problem(str(language), where)
    if problem is None and not measured_here:
        problem = hardware.target_problem(target, where)
    return problem


def _build(root: Path, inputs: dict, config: dict[str, Policy], where: hardware.Here) -> dict:
    # definition -> hardware group -> solution -> {"ok": [(key, figures...)], "failed": bool}
    stats: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    labels: dict[str, str] = {}  # hardware group -> the first hardware string read of it
    axes_of: dict[str, list[str]] = {}
    evaluated = 0
    # The last trace of a (definition, workload, solution) on one hardware, in reading order,
    # supersedes the earlier ones: a solution repaired and benchmarked again is judged on
    # what it is now. Traces of other hardware do not (Note [selection per hardware]).
    latest: dict[tuple[str, str, str, str], tuple[dict, dict]] = {}
    for path, _, _ in inputs["traces"]:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    trace = json.loads(line)
                    name, solution = trace["definition"], trace["solution"]
                    evaluation = trace["evaluation"]
                    workload = trace["workload"]
                    axes, uuid = workload["axes"], workload["uuid"]
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged line tells nothing about speed
                if solution is None or not isinstance(evaluation, dict) or not evaluation:
                    continue
                evaluated += 1
                hw = _hardware_of(evaluation)
                group = "" if where.is_here(hw) else hardware.normalize(hw) or "unknown"
                labels.setdefault(group, hw)
                key = (name, uuid, solution, group)
                latest.pop(key, None)
                latest[key] = (evaluation, axes)
    for (name, _, solution, group), (evaluation, axes) in latest.items():
        record = (
            stats.setdefault(name, {})
            .setdefault(group, {})
            .setdefault(solution, {"ok": [], "failed": False, "tolerance": False})
        )
        policy = _policy(config, name)
        if evaluation.get("status") != "PASSED":
            record["failed"] = True
            continue
        if not _meets(evaluation, policy):
            record["failed"] = record["tolerance"] = True
            continue
        perf = evaluation.get("performance") or {}
        order = axes_of.setdefault(name, list(axes))
        key = tuple(axes.get(a) for a in order)
        record["ok"].append((key, *_figures(perf, policy.metric)))
    paths, specs, unreadable = _solution_index(root, inputs)
    definitions: dict[str, Any] = {}
    table: dict[str, Any] = {}
    chosen_groups: dict[str, str] = {}
    for name, by_group in sorted(stats.items()):
        known = paths.get(name, {})
        choices = []
        measured_here = by_group.get("", {})
        for group, by_solution in by_group.items():
            good = {
                s: r["ok"]
                for s, r in by_solution.items()
                if r["ok"]
                and not r["failed"]
                and s in known
                and _runnable(specs[(name, s)], where, s in measured_here) is None
            }
            if good:
                tier = 0 if group == "" else where.tier(labels[group])
                size = sum(len(rows) for rows in good.values())
                choices.append(((tier, -len(good), -size, labels[group]), group, good))
        if not choices:
            continue
        _, group, good = min(choices)
        chosen_groups[name] = group
        # The metric asked for where every candidate's traces record it, GPU time otherwise.
        e2e = all(x[3] is not None for rows in good.values() for x in rows)
        ranking = sorted(
            good,
            key=lambda s: (
                -statistics.fmean(math.log(max(x[4 if e2e else 2], 1e-12)) for x in good[s]),
                s,
            ),
        )
        per_key: dict[tuple, dict[str, list[tuple]]] = {}
        for s, rows in good.items():
            for key, *figures in rows:
                per_key.setdefault(key, {}).setdefault(s, []).append(figures)
        keys = {key: _fastest(c) for key, c in per_key.items()}
        entry: dict[str, Any] = {
            "ranking": ranking,
            "solutions": {s: known[s] for s in ranking},
            "hardware": labels[group],
            "measured_here": group == "",
        }
        definition = None
        if any(s != ranking[0] for s in keys.values()):
            definition = _definition_json(inputs, name, definitions)
        if definition is not None:
            bind = _bindings(definition)
            axes = _var_axes(definition)
            if bind is not None and sorted(axes) == sorted(axes_of[name]):
                # Keys in the definition's var-axis order, as the keyed entry reads them.
                position = [axes_of[name].index(a) for a in axes]
                chosen = set(keys.values()) | {ranking[0]}
                entry["keyed"] = {
                    "dps": any(_is_dps(root / known[s]) for s in chosen),
                    "bind": bind,
                    "inputs": list(definition["inputs"]),
                    "outputs": list(definition["outputs"]),
                    "reference": definition["reference"],
                    "keys": [[[k[i] for i in position], s] for k, s in sorted(keys.items())],
                }
        table[name] = entry
    return {
        "root": str(root),
        "hardware": where.as_dict(),
        "definitions": table,
        "unused": _unused(
            stats,
            chosen_groups,
            paths,
            specs,
            where,
            _unknown_definitions(inputs, paths, definitions),
            unreadable,
            evaluated,
            len(inputs["solutions"]),
        ),
    }


def _unknown_definitions(
    inputs: dict, paths: dict[str, dict[str, str]], cache: dict[str, Any]
) -> list[str]:
    """Solutions (``definition/solution``) for definitions neither the dataset nor fibgen's
    catalogue has: only a dispatcher that knows the name can route them."""
    from fibgen.paths import builtin_definition_file

    return sorted(
        f"{d}/{s}"
        for d, by in paths.items()
        if _definition_json(inputs, d, cache) is None and builtin_definition_file(d) is None
        for s in by
    )


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


def _figures(perf: dict, metric: str) -> tuple:
    """(GPU latency, GPU speedup, e2e latency or None, e2e speedup or None) of a trace."""
    latency = perf.get("latency_ms", math.inf)
    speedup = perf.get("speedup_factor", 0.0)
    e2e, ref_e2e = perf.get("e2e_latency_ms"), perf.get("reference_e2e_latency_ms")
    if (
        metric != "e2e"
        or not isinstance(e2e, (int, float))
        or not isinstance(ref_e2e, (int, float))
    ):
        return latency, speedup, None, None
    return latency, speedup, e2e, ref_e2e / e2e if e2e > 0 else 0.0


def _fastest(candidates: dict[str, list[tuple]]) -> str:
    """The candidate of one key with the lowest median latency, e2e where all have it."""
    e2e = all(f[2] is not None for rows in candidates.values() for f in rows)
    at = 2 if e2e else 0
    return min(sorted(candidates), key=lambda s: statistics.median(f[at] for f in candidates[s]))


def _unused(
    stats: dict[str, dict[str, dict[str, dict[str, Any]]]],
    chosen: dict[str, str],
    paths: dict[str, dict[str, str]],
    specs: dict[tuple[str, str], tuple[Any, Any]],
    where: hardware.Here,
    unknown: list[str],
    unreadable: int,
    evaluated: int,
    files: int,
) -> dict[str, Any]:
    """What the table could not use, counted by reason, for the warning at enable."""
    failed, tolerance, untraced, other, not_here = [], [], [], [], []
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
                if all(r["failed"] for r in judged):
                    if any(r["tolerance"] for r in judged):
                        tolerance.append(label)
                    else:
                        failed.append(label)
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
        "unreadable": unreadable,
        "failed": failed,
        "tolerance": tolerance,
        "untraced": untraced,
        "missing": missing,
        "not_here": not_here,
        "other_hardware": other,
        "unknown_definitions": unknown,
    }
