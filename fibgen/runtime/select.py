"""The best-solution table: from benchmark traces, which solution serves each call.

Per definition, the traces of one hardware are used: this machine's where it has any, else
another device of its kind, else any (Note [selection per hardware]); latencies of different
hardware are never compared. A solution is a candidate when it can run on this device, has
passing traces and no failing ones on that hardware (a solution wrong on one workload is not
trusted on another), and each passing trace meets the policy's tolerances. Of several traces
of one solution on one workload and hardware, the last one read counts: a solution repaired
and benchmarked again is judged on what it is now. The table holds, per definition:

- ``ranking``: candidates by the geometric mean of their speedup over the reference, best
  first; the first is the definition's best;
- ``keys``: per var-axis key (the workload's var-axis values in declaration order), the
  candidate with the lowest median latency at that key.

Speedups and latencies are end to end in an eager loop by default, GPU time with the
policy's ``metric="gpu"`` (Note [selection metric]).

``entries(root, config)`` turns the table into apply entries. A definition whose keys all
pick its best gets a plain entry: its calls cost what any solution's do. Only a definition
with per-key choices gets a keyed entry, which reads the var axes off the inputs and calls
the solution chosen for them; on a key that no trace covers it follows the policy's
``on_miss``: the definition's best (``"best"``), the solution of the nearest traced key by
the sum of |log2| ratios of the axis values (``"nearest"``), the dispatcher's fallback, that
is the original API (``"fallback"``, through ``Decline``), or the definition's reference
(``"reference"``, slow: for checking).

The table is cached in ``$FIBGEN_CACHE_DIR/select/`` under a digest of its inputs (paths,
sizes and mtimes of the trace, solution and definition files, the configuration and this
process's hardware), and
rebuilt when they change. Nothing is imported or built at enable except the ``prebuild``
top solutions a policy asks for. This module imports neither pydantic nor the compiler.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fibgen.runtime import hardware, solutions
from fibgen.runtime.errors import ApplyConfigError, Decline

__all__ = ["Policy", "build_table", "entries", "load_table", "normalize_config"]

# Bumped when the table's layout changes, so that old cache files are not read.
TABLE_VERSION = 5
ON_MISS = ("best", "nearest", "fallback", "reference")
METRICS = ("e2e", "gpu")


@dataclass(frozen=True)
class Policy:
    """How one definition's solution is chosen from its traces.

    ``atol``/``rtol``: the largest max_absolute_error / max_relative_error a passing trace may
    report (None: any); ``on_miss``: what a keyed definition does on an untraced key;
    ``prebuild``: how many of its top solutions are loaded when apply is enabled;
    ``metric``: what is compared (Note [selection metric]).
    """

    atol: float | None = None
    rtol: float | None = None
    on_miss: str = "best"
    prebuild: int = 0
    metric: str = "e2e"

    def __post_init__(self) -> None:
        # Checked here, with the key named, so that a bad value fails at enable_apply and not
        # as a TypeError (or a silent no-op, for NaN) when the table is built.
        for key in ("atol", "rtol"):
            value = getattr(self, key)
            if value is None:
                continue
            if not _is_real(value) or not math.isfinite(value) or value < 0:
                raise ApplyConfigError(
                    f"{key} must be None or a finite number 0 or more, not {value!r}"
                )
        if not isinstance(self.on_miss, str) or self.on_miss not in ON_MISS:
            raise ApplyConfigError(
                f"on_miss must be one of {', '.join(ON_MISS)}, not {self.on_miss!r}"
            )
        if not isinstance(self.prebuild, int) or isinstance(self.prebuild, bool):
            raise ApplyConfigError(f"prebuild must be a whole number, not {self.prebuild!r}")
        if self.prebuild < 0:
            raise ApplyConfigError(f"prebuild must be 0 or more, not {self.prebuild}")
        if not isinstance(self.metric, str) or self.metric not in METRICS:
            raise ApplyConfigError(
                f"metric must be one of {', '.join(METRICS)}, not {self.metric!r}"
            )


def _is_real(value: Any) -> bool:
    # bool is an int to Python, but True as a tolerance is a mistake, not 1.0.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_POLICY_KEYS = tuple(f.name for f in fields(Policy))


def normalize_config(config: Mapping[str, Any] | Policy | None) -> dict[str, Policy]:
    """``{definition name or "*": Policy}`` from a Policy, a mapping of Policies or dicts."""
    if config is None:
        return {"*": Policy()}
    if isinstance(config, Policy):
        return {"*": config}
    if not isinstance(config, Mapping):
        raise ApplyConfigError(
            f"the selection config must be a Policy or a mapping, not {type(config).__name__}"
        )
    out: dict[str, Policy] = {}
    for name, policy in config.items():
        if isinstance(policy, Mapping):
            unknown = sorted(str(k) for k in policy if k not in _POLICY_KEYS)
            if unknown:
                raise ApplyConfigError(
                    f"config for {name!r}: unknown key {unknown[0]!r}; the keys are "
                    f"{', '.join(_POLICY_KEYS)}"
                )
            try:
                policy = Policy(**policy)
            except ApplyConfigError as exc:
                raise ApplyConfigError(f"config for {name!r}: {exc}") from None
        if not isinstance(policy, Policy):
            raise ApplyConfigError(f"config for {name!r} must be a Policy or a dict")
        out[str(name)] = policy
    out.setdefault("*", Policy())
    return out


def _policy(config: dict[str, Policy], name: str) -> Policy:
    return config.get(name) or config["*"]


# ---------------------------------------------------------------------------------------
# Inputs of the table and their digest


def _scan(base: str, suffix: str, out: list[tuple[str, int, int]]) -> None:
    # os.scandir, not pathlib: the warm path stats every file and must stay in milliseconds.
    # Any depth, as flashinfer-bench reads (Note [dataset depth] in fibgen/format/dataset.py);
    # names starting with a dot are a writer's temporary files and locks.
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


def _digest(root: Path, inputs: dict, config: dict[str, Policy], where: hardware.Here) -> str:
    payload = {
        "version": TABLE_VERSION,
        "root": str(root),
        "inputs": inputs,
        "config": {k: asdict(v) for k, v in sorted(config.items())},
        "hardware": where.as_dict(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _cache_file(root: Path) -> Path:
    return (
        solutions.cache_root().parent
        / "select"
        / f"{hashlib.sha256(str(root).encode()).hexdigest()[:24]}.json"
    )


# ---------------------------------------------------------------------------------------
# Building the table


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


def load_table(root: str | os.PathLike[str], config: Any = None) -> tuple[dict, bool]:
    """The table for ``root`` and ``config`` on this process's hardware, from the cache when
    current; (table, from_cache)."""
    root = Path(root).resolve()
    config = normalize_config(config)
    inputs = _inputs(root)
    where = hardware.here()
    digest = _digest(root, inputs, config, where)
    cache = _cache_file(root)
    try:
        cached = json.loads(cache.read_text(encoding="utf-8"))
        if cached.get("digest") == digest:
            return cached["table"], True
    except (OSError, ValueError):
        pass
    table = _build(root, inputs, config, where)
    _write_cache(cache, {"digest": digest, "table": table})
    return table, False


def _write_cache(path: Path, data: dict) -> None:
    # A cache that cannot be written (read-only home) only costs the next enable a rebuild.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------
# Entries for apply


class _LazySolution:
    """A Solution JSON read and validated on first use (enabling reads no solution file)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._model: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._model is None:
            # A solution folder's files are read now (Note [solution folders]).
            from fibgen.format.dataset import read_solution

            self._model = read_solution(self._path)
        return getattr(self._model, attr)


def _entry(root: Path, name: str, solution: str, relpath: str) -> solutions.Entry:
    path = root / relpath
    return solutions.Entry(
        name, f"solution {solution!r} ({path})", solution=_LazySolution(path), root=root
    )


def _declining(name: str, key: Any) -> Callable[..., Any]:
    """A solution that hands every call back: the dispatcher falls back (``on_miss="fallback"``)."""

    def decline(**_: Any) -> Any:
        raise Decline(f"{name}: no trace covers var-axis values {key!r}")

    return decline


def _log_distance(a: list[int], b: list[int]) -> float:
    return sum(abs(math.log2(max(x, 1) / max(y, 1))) for x, y in zip(a, b))


def _keyed(root: Path, name: str, info: dict, policy: Policy) -> solutions.Entry:
    keyed = info["keyed"]
    inputs, outputs = tuple(keyed["inputs"]), tuple(keyed["outputs"])
    loaded: dict[str, solutions.Loaded] = {}

    def load(solution: str) -> solutions.Loaded:
        found = loaded.get(solution)
        if found is None:
            entry = _entry(root, name, solution, info["solutions"][solution])
            found = loaded[solution] = solutions.load(entry, inputs, outputs)
        return found

    # The keyed entry is destination-passing when any of its choices is: value-returning
    # choices then copy into the buffers, so no choice needs outputs allocated for it.
    chosen = {s for _, s in keyed["keys"]} | {info["ranking"][0]}
    dps = keyed["dps"]

    def adapt(fn: Callable[..., Any], fn_dps: bool) -> Callable[..., Any]:
        if fn_dps == dps:
            return fn

        def returns_into(**kwargs: Any) -> None:
            values = fn(**{k: kwargs[k] for k in inputs})
            values = values if isinstance(values, (tuple, list)) else (values,)
            for o, v in zip(outputs, values):
                kwargs[o].copy_(v)

        return returns_into

    # choices: key -> callable. A solution starts as a stub that loads it on its first call
    # and then puts the loaded callable in place of every occurrence of the stub.
    current: dict[str, Callable[..., Any]] = {}
    choices: dict[Any, Callable[..., Any]] = {}

    def install(solution: str) -> Callable[..., Any]:
        found = load(solution)
        fn = adapt(found.fn, found.dps)
        stub = current.get(solution)
        current[solution] = fn
        for k, v in list(choices.items()):
            if v is stub:
                choices[k] = fn
        return fn

    def stub_for(solution: str) -> Callable[..., Any]:
        if solution not in current:

            def first_call(**kwargs: Any) -> Any:
                return install(solution)(**kwargs)

            current[solution] = first_call
        return current[solution]

    traced: list[tuple[list[int], str]] = []
    single = len(keyed["bind"]) == 1
    for values, solution in keyed["keys"]:
        choices[values[0] if single else tuple(values)] = stub_for(solution)
        traced.append((values, solution))
    best = info["ranking"][0]
    stub_for(best)
    for solution in info["ranking"][: policy.prebuild]:
        if solution in chosen:
            install(solution)

    reference_fn: list[Callable[..., Any]] = []

    def miss(key: Any) -> Callable[..., Any]:
        if policy.on_miss == "nearest":
            values = [key] if single else list(key)
            _, solution = min(traced, key=lambda t: (_log_distance(t[0], values), t[1]))
            fn = current[solution]
        elif policy.on_miss == "fallback":
            fn = _declining(name, key)
        elif policy.on_miss == "reference":
            if not reference_fn:
                namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{name}"}
                exec(compile(keyed["reference"], f"<reference of {name}>", "exec"), namespace)
                reference_fn.append(adapt(namespace["run"], False))
            fn = reference_fn[0]
        else:
            fn = current[best]
        if len(choices) < 4096:  # remembered, within reason: keys are batch sizes
            choices[key] = fn
        return fn

    # Generated with the exact parameters, so that apply checks and calls it like any
    # solution and the key is read without building a dict or a signature per call.
    params = list(inputs) + (list(outputs) if dps else [])
    reads = [f"{i}.shape[{d}]" for i, d in keyed["bind"]]
    key_expr = reads[0] if single else f"({', '.join(reads)},)"
    call_args = ", ".join(f"{p}={p}" for p in params)
    source = (
        f"def run({', '.join(params)}):\n"
        f"    key = {key_expr}\n"
        f"    fn = choices.get(key)\n"
        f"    if fn is None:\n"
        f"        fn = miss(key)\n"
        f"    return fn({call_args})\n"
    )
    namespace = {"choices": choices, "miss": miss}
    exec(compile(source, f"<keyed selection of {name}>", "exec"), namespace)
    label = f"keyed selection of {len(chosen)} solutions for {name!r} from {root}/traces"
    return solutions.Entry(name, label, fn=namespace["run"])


def _examples(items: list[str]) -> str:
    shown = ", ".join(items[:3])
    return shown + (f", ... ({len(items) - 3} more)" if len(items) > 3 else "")


def unused_message(root: Path, table: dict) -> str | None:
    """What a dataset holds that apply cannot route, with counts and reasons; None if nothing."""
    unused = table.get("unused") or {}
    parts = []
    if unused.get("failed"):
        parts.append(
            f"{len(unused['failed'])} solution(s) failed on some workload "
            f"({_examples(unused['failed'])})"
        )
    if unused.get("tolerance"):
        parts.append(
            f"{len(unused['tolerance'])} solution(s) exceed the policy's atol/rtol "
            f"({_examples(unused['tolerance'])})"
        )
    if unused.get("untraced"):
        parts.append(
            f"{len(unused['untraced'])} solution(s) have no benchmark traces "
            f"({_examples(unused['untraced'])}; run `fibgen bench {root}`)"
        )
    if unused.get("missing"):
        parts.append(
            f"traces name {len(unused['missing'])} solution(s) not under {root}/solutions "
            f"({_examples(unused['missing'])})"
        )
    if unused.get("unreadable"):
        parts.append(
            f"{unused['unreadable']} file(s) under {root}/solutions are not Solution JSON "
            f"(`fibgen validate {root}` names them)"
        )
    where = table.get("hardware") or {}
    here = where.get("names", ["?"])[0] if where.get("kind") == "cuda" else "this CPU"
    if unused.get("not_here"):
        parts.append(
            f"{len(unused['not_here'])} solution(s) cannot run on {here} "
            f"({_examples(unused['not_here'])})"
        )
    if unused.get("other_hardware"):
        parts.append(
            f"{len(unused['other_hardware'])} solution(s) have traces only from other hardware "
            f"than their definition is ranked on ({_examples(unused['other_hardware'])}; "
            f"run `fibgen bench {root}` here)"
        )
    notes = []
    elsewhere = sorted(
        f"{name} ({info['hardware']})"
        for name, info in table.get("definitions", {}).items()
        if not info.get("measured_here", True)
    )
    if elsewhere:
        notes.append(
            f"{len(elsewhere)} definition(s) ranked on traces from other hardware than {here}, "
            f"which may rank otherwise here ({_examples(elsewhere)}; run `fibgen bench {root}` "
            "here)"
        )
    if unused.get("unknown_definitions"):
        notes.append(
            f"{len(unused['unknown_definitions'])} solution(s) are for definitions that neither "
            f"{root}/definitions nor fibgen's catalogue has "
            f"({_examples(unused['unknown_definitions'])}); only a dispatcher that knows the "
            "name can route them"
        )
    routed = len(table.get("definitions", {}))
    tail = "".join(f"; {n}" for n in notes)
    if routed == 0:
        head = (
            f"fibgen: {root}: nothing is routed: {unused.get('solution_files', 0)} solution "
            f"file(s), {unused.get('evaluated_traces', 0)} evaluated trace(s)"
        )
        return head + (": " + "; ".join(parts) if parts else "") + tail
    if not parts and not notes:
        return None
    message = f"fibgen: {root}: {routed} definition(s) routed"
    return message + ("; not usable: " + "; ".join(parts) if parts else "") + tail


def entries(root: str | os.PathLike[str], config: Any = None) -> dict[str, solutions.Entry]:
    """Apply entries for every definition the traces under ``root`` rank a solution for.

    What the dataset holds but cannot route (failing or untraced solutions, traces of
    solutions that are not there, solutions that cannot run on this device) and solutions for
    definitions nobody has are said in one RuntimeWarning.
    """
    root = Path(root).resolve()
    config = normalize_config(config)
    table, _ = load_table(root, config)
    message = unused_message(root, table)
    if message is not None:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    out: dict[str, solutions.Entry] = {}
    for name, info in table["definitions"].items():
        policy = _policy(config, name)
        if "keyed" in info:
            out[name] = _keyed(root, name, info, policy)
            continue
        best = info["ranking"][0]
        entry = _entry(root, name, best, info["solutions"][best])
        if policy.prebuild:
            # Imported now (materialized and in sys.modules): the first call only binds it.
            solutions.load(entry, (), ())
        out[name] = entry
    return out


def is_traced_dataset(target: Any) -> bool:
    """Whether ``enable_apply``'s argument is a dataset folder with benchmark traces."""
    return isinstance(target, (str, os.PathLike)) and os.path.isdir(os.path.join(target, "traces"))
