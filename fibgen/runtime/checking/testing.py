"""The checks behind the generated tests (``generated/tests/test_<family>.py``).

A generated test file holds a table of its family's definitions and calls three checks per
definition and set of var-axis values:

* ``check_reference``: the reference runs on generated inputs and returns the declared
  number of outputs with the declared shapes and dtypes;
* ``check_solutions``: every solution for the definition found under the solutions folder
  (``$FIBGEN_SOLUTIONS``, else ``solutions/`` in the current directory or the checkout),
  called through its dispatcher, matches the reference by flashinfer-bench's rule (a
  sampler by the distribution of its draws); a solution folder runs from its files as they
  are now;
* ``check_dispatch``: with a solution registered the dispatcher routes to it and counts a
  hit; without one it falls back to the reference and counts a fallback.

A definition is skipped, with the reason, only when its inputs exceed ``MEMORY_BUDGET`` or
it has no reference yet. This module never imports the compiler, lark or jinja2.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import pytest
import torch

from fibgen.runtime.checking.compare import compare, compare_sampling, is_sampling
from fibgen.runtime.inputs.make import (
    InputSpec,
    estimate_nbytes,
    generate_inputs_with_axes,
    torch_dtype,
)
from fibgen.runtime.routing.api import Api
from fibgen.runtime.routing.apply import disable_apply, enable_apply, stats
from fibgen.runtime.routing.state import OUTCOMES

__all__ = [
    "MEMORY_BUDGET",
    "Case",
    "Entry",
    "Prepared",
    "cases",
    "check_dispatch",
    "check_reference",
    "check_solutions",
    "compile_reference",
    "find_solutions",
    "prepare",
    "solutions_root",
]

# Inputs above this size are not made on the CPU: the test is skipped, saying so.
MEMORY_BUDGET = 1 << 30
SEED = 0


@dataclass(frozen=True)
class Entry:
    """One row of a generated test table: a definition and the var-axis values to try."""

    name: str
    path: str  # the definition JSON, relative to the test file
    axes: tuple[dict[str, int], ...] = ({},)
    params: dict[str, Any] = field(default_factory=dict)


class Tolerance(TypedDict, total=False):
    """A family's tolerance, as ``compare`` takes it."""

    atol: float
    rtol: float
    matched: float


@dataclass(frozen=True)
class Case:
    """One definition at one set of var-axis values, with everything its checks need."""

    name: str
    definition_path: Path
    dispatch_module: str
    dispatch_path: Path  # the folder holding the dispatch package
    hints: dict[str, str]
    tolerance: Tolerance
    axes: dict[str, int]
    params: dict[str, Any]
    repo_root: Path | None
    first: bool = False  # the family's first case (its first definition at its first axes)

    def __str__(self) -> str:
        return "-".join([self.name, *(f"{k}={v}" for k, v in self.axes.items())])


def cases(
    test_file: str,
    *,
    package: str,
    family: str,
    hints: dict[str, str],
    tolerance: Tolerance,
    entries: tuple[Entry, ...],
) -> list[Case]:
    """Expand a generated table into cases, paths resolved against the test file."""
    here = Path(test_file).resolve().parent
    root = _repo_root(here)
    out: list[Case] = []
    for entry in entries:
        for axes in entry.axes:
            out.append(
                Case(
                    name=entry.name,
                    definition_path=here / entry.path,
                    dispatch_module=f"{package}.{family}",
                    dispatch_path=here.parent / "python",
                    hints=dict(hints),
                    tolerance=tolerance.copy(),
                    axes=dict(axes),
                    params=dict(entry.params),
                    repo_root=root,
                    first=not out,
                )
            )
    return out


def _repo_root(start: Path) -> Path | None:
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return None


# ---------------------------------------------------------------------------------------
# Preparing a case: the definition, its inputs and the reference's outputs
# ---------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A case with its inputs generated and the reference's outputs computed."""

    case: Case
    definition: dict[str, Any]
    inputs: dict[str, Any]
    axes: dict[str, int]  # every axis value: given, const and derived
    expected: tuple[Any, ...]  # the reference's outputs, in output order

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(self.definition["outputs"])

    def fresh_inputs(self) -> dict[str, Any]:
        """A copy of the inputs: a call may write into them (in-place kernels)."""
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in self.inputs.items()}

    def output_buffers(self) -> dict[str, Any]:
        """One empty buffer per output with the declared shape and dtype."""
        buffers = {}
        for name, spec in self.definition["outputs"].items():
            shape = tuple(self.axes[d] for d in spec["shape"] or ())
            buffers[name] = torch.empty(shape, dtype=torch_dtype(spec["dtype"]))
        return buffers


def _load_definition(case: Case) -> dict[str, Any]:
    try:
        with open(case.definition_path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise AssertionError(
            f"cannot read the definition of {case.name} at {case.definition_path}: "
            f"{exc.strerror}; run `fibgen build` to regenerate it"
        ) from None


def compile_reference(definition: dict[str, Any]) -> Any:
    """The ``run`` function of a definition's reference."""
    namespace: dict[str, Any] = {"__name__": f"fibgen_reference_{definition['name']}"}
    code = compile(definition["reference"], f"<reference of {definition['name']}>", "exec")
    exec(code, namespace)
    return namespace["run"]


def _as_tuple(value: Any, n: int) -> tuple[Any, ...]:
    if n == 1 and not isinstance(value, (tuple, list)):
        return (value,)
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _seed() -> None:
    # Sampling references draw from torch's global generator: every call starts from the same
    # state, so that a fallback to the reference (and a torch solution) draws the same values.
    torch.manual_seed(SEED)


def prepare(case: Case) -> Prepared:
    """Generate a case's inputs and run its reference; skip when the inputs are too big."""
    definition = _load_definition(case)
    spec = InputSpec.from_definition_json(definition, case.hints)
    if case.params:
        spec = InputSpec(spec.name, spec.axes, spec.inputs, spec.constraints, dict(case.params))
    nbytes = estimate_nbytes(spec, case.axes)
    if nbytes > MEMORY_BUDGET:
        pytest.skip(
            f"{case}: its inputs take about {nbytes / 2**30:.1f} GiB, above the "
            f"{MEMORY_BUDGET / 2**30:.0f} GiB budget of a CPU test"
        )
    inputs, axes = generate_inputs_with_axes(spec, case.axes, seed=SEED)
    run = compile_reference(definition)
    fresh = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    _seed()
    try:
        result = run(**fresh)
    except NotImplementedError as exc:
        pytest.skip(f"{case.name} has no reference yet: {exc}")
    expected = _as_tuple(result, len(definition["outputs"]))
    return Prepared(case, definition, inputs, axes, expected)


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------


def check_reference(prepared: Prepared) -> None:
    """The reference returned the declared number of outputs, shapes and dtypes."""
    names = prepared.output_names
    got = prepared.expected
    assert len(got) == len(names), (
        f"{prepared.case}: the reference returned {len(got)} outputs, the definition declares "
        f"{len(names)} ({', '.join(names)})"
    )
    problems = []
    for name, value in zip(names, got):
        spec = prepared.definition["outputs"][name]
        if spec["shape"] is None:
            if isinstance(value, torch.Tensor) and value.dim() != 0:
                problems.append(f"`{name}` is a scalar but the reference returned a tensor")
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"`{name}` is a tensor but the reference returned {type(value)}")
            continue
        shape = [prepared.axes[d] for d in spec["shape"]]
        if list(value.shape) != shape:
            declared = ", ".join(f"{d}={prepared.axes[d]}" for d in spec["shape"])
            problems.append(f"`{name}` has shape {list(value.shape)}, declared [{declared}]")
        if value.dtype != torch_dtype(spec["dtype"]):
            problems.append(f"`{name}` has dtype {value.dtype}, declared {spec['dtype']}")
    assert not problems, f"{prepared.case}: " + "; ".join(problems)


def _compare_all(prepared: Prepared, actual: Any, who: str) -> list[str]:
    names = prepared.output_names
    got = _as_tuple(actual, len(names))
    if len(got) != len(names):
        return [f"{who} returned {len(got)} outputs, expected {len(names)}"]
    problems = []
    for name, a, e in zip(names, got, prepared.expected):
        result = compare(a, e, **prepared.case.tolerance)
        if not result.ok:
            problems.append(f"{who}: output `{name}`: {result}")
    return problems


def _judge_sampler(api: Api, prepared: Prepared, first: Any, who: str, device: str) -> list[str]:
    """A sampler's outputs have the declared shapes and dtypes, and its draws the reference's
    distribution (Note [judging samplers] in fibgen/runtime/checking/compare.py)."""
    from fibgen.runtime.solutions.loading import allocate_outputs

    names = prepared.output_names
    got = _as_tuple(first, len(names))
    problems = []
    for name, a, e in zip(names, got, prepared.expected):
        if tuple(a.shape) != tuple(e.shape) or a.dtype != e.dtype:
            problems.append(
                f"{who}: output `{name}` is {a.dtype}{list(a.shape)}, expected "
                f"{e.dtype}{list(e.shape)}"
            )
    if problems:
        return problems
    name = prepared.case.name

    def draw(inputs: dict[str, Any]) -> Any:
        inputs = {k: _to(v, device) for k, v in inputs.items()}
        values = api.call_definition(name, inputs, allocate_outputs(prepared.definition, inputs))
        return _as_tuple(values, len(names))[0]

    reference = compile_reference(prepared.definition)
    result = compare_sampling(
        draw,
        lambda inputs: _as_tuple(reference(**inputs), len(names))[0],
        prepared.fresh_inputs(),
        prepared.definition,
    )
    return [] if result.ok else [f"{who}: output `{names[0]}`: {result}"]


def _counts(label: str) -> dict[str, int]:
    return stats().get(label, dict.fromkeys(OUTCOMES, 0))


def _dispatcher(case: Case) -> Api:
    package = case.dispatch_module.partition(".")[0]
    beside = str(case.dispatch_path)
    if package not in sys.modules and (case.dispatch_path / package).is_dir():
        # The dispatchers generated beside this test are the ones it holds to the definitions.
        if beside not in sys.path:
            sys.path.insert(0, beside)
    try:
        module = importlib.import_module(case.dispatch_module)
    except Exception as exc:
        raise AssertionError(
            f"{case}: the dispatch module {case.dispatch_module} does not import: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    return module._api


def _call(api: Api, prepared: Prepared, device: str = "cpu") -> Any:
    inputs, buffers = prepared.fresh_inputs(), prepared.output_buffers()
    if device != "cpu":
        # Inputs are made on the CPU (the same values everywhere); a GPU solution gets copies
        # on its device and its outputs come back for the comparison with the reference.
        inputs = {k: _to(v, device) for k, v in inputs.items()}
        buffers = {k: _to(v, device) for k, v in buffers.items()}
    _seed()
    result = api.call_definition(prepared.case.name, inputs, buffers)
    if device == "cpu":
        return result
    if isinstance(result, tuple):
        return tuple(_to(v, "cpu") for v in result)
    return _to(result, "cpu")


def _to(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _device_for(solution: Any) -> str:
    """Where a solution's inputs live: its GPU when one is present, else the CPU."""
    gpu = solution.spec.language in ("cuda", "cpp", "tilelang", "triton")
    return "cuda" if gpu and torch.cuda.is_available() else "cpu"


def _disable() -> None:
    with warnings.catch_warnings():
        # A case that fails early leaves its solution unmatched; that is reported already.
        warnings.simplefilter("ignore", RuntimeWarning)
        disable_apply()


# Note [the fallback leg]
# A fallback runs the reference again, through the dispatcher. The dispatcher and its fallback
# are one per family, so that leg is run on the family's first case and on every case whose
# inputs are small; on the large ones (a GEMM of 28672 x 4096, an MoE of 128 experts) it cost
# as much as the reference itself, half of the generated tests' time, for the same code again.
# The hit leg, which routes by the definition's own key, runs on every case.
FALLBACK_LEG_BYTES = 32 << 20


def _runs_fallback_leg(prepared: Prepared) -> bool:
    """Whether `check_dispatch` also checks the fallback (Note [the fallback leg])."""
    if prepared.case.first:
        return True
    tensors = (v for v in prepared.inputs.values() if isinstance(v, torch.Tensor))
    return sum(t.nbytes for t in tensors) <= FALLBACK_LEG_BYTES


def check_dispatch(prepared: Prepared) -> None:
    """With a solution registered the dispatcher routes to it; without one it falls back
    (on the family's first case and on small ones: Note [the fallback leg])."""
    case = prepared.case
    api = _dispatcher(case)
    calls = []

    def stand_in(**inputs: Any) -> Any:
        calls.append(inputs)
        values = tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in prepared.expected)
        return values[0] if len(values) == 1 else values

    try:
        enable_apply({case.name: stand_in}, patch=False, packages=())
        result = _call(api, prepared)
        counts = _counts(api.label)
        assert len(calls) == 1, f"{case}: the dispatcher did not call the registered solution"
        assert counts["hit"] == 1, f"{case}: expected one hit, stats show {counts}"
        problems = _compare_all(prepared, result, "the routed call")
        assert not problems, f"{case}: " + "; ".join(problems)
        if not _runs_fallback_leg(prepared):
            return

        with warnings.catch_warnings():
            # Nothing registered is what this leg is for; enable_apply would say so.
            warnings.filterwarnings("ignore", "fibgen: enable_apply.{}.: no solution given")
            enable_apply({}, patch=False, packages=())
        result = _call(api, prepared)
        counts = _counts(api.label)
        assert len(calls) == 1, f"{case}: the dispatcher called a solution that is not registered"
        assert (
            counts["fallback_no_candidate"] == 1 and counts["hit"] == 0
        ), f"{case}: expected one fallback, stats show {counts}"
        problems = _compare_all(prepared, result, "the fallback")
        assert not problems, f"{case}: " + "; ".join(problems)
    finally:
        _disable()


def solutions_root(case: Case | None = None) -> Path:
    """``$FIBGEN_SOLUTIONS``, else ``solutions/`` in the current directory, else the checkout's."""
    env = os.environ.get("FIBGEN_SOLUTIONS", "").strip()
    if env:
        return Path(env)
    local = Path.cwd() / "solutions"
    if local.is_dir() or case is None or case.repo_root is None:
        return local
    return case.repo_root / "solutions"


_index: dict[Path, dict[str, list[Path]]] = {}


def find_solutions(root: Path, definition: str) -> list[Path]:
    """Solution JSON files under ``root`` for one definition, sorted (indexed once per root)."""
    root = root.resolve()
    index = _index.get(root)
    if index is None:
        index = _index[root] = {}
        for path in sorted(root.rglob("*.json")) if root.is_dir() else ():
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue  # not a solution: the loader reports bad files of a definition
            if isinstance(data, dict) and isinstance(data.get("definition"), str):
                index.setdefault(data["definition"], []).append(path)
    return index.get(definition, [])


def _hardware_problem(solution: Any) -> str | None:
    language = solution.spec.language
    if language in ("cuda", "cpp", "tilelang") and not torch.cuda.is_available():
        return f"{language} solution {solution.name!r} needs a CUDA device"
    if language == "triton" and not torch.cuda.is_available():
        # Note: without a GPU, triton kernels run under its interpreter. It is read when a
        # kernel is decorated, so it must be set before the solution is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ["TRITON_INTERPRET"] != "1":
            return f"triton solution {solution.name!r} needs a GPU or TRITON_INTERPRET=1"
    return None


def check_solutions(prepared: Prepared) -> None:
    """Every solution found for the definition matches the reference through the dispatcher."""
    from fibgen.format.dataset import read_solution
    from fibgen.format.errors import FormatError

    case = prepared.case
    root = solutions_root(case)
    paths = find_solutions(root, case.name)
    if not paths:
        return
    api = _dispatcher(case)
    problems: list[str] = []
    skipped: list[str] = []
    ran = 0
    for path in paths:
        try:
            # A solution folder's files, as they are now (Note [solution folders]).
            solution = read_solution(path)
        except FormatError as exc:
            problems.append(f"bad solution file {exc}")
            continue
        why = _hardware_problem(solution)
        if why is not None:
            skipped.append(f"{path}: {why}")
            continue
        try:
            # Strict: a solution that fails must fail its test, not fall back to the reference.
            # By its path: failures name the solution's own files (Note [source names]).
            enable_apply({case.name: str(path)}, patch=False, packages=(), strict=True)
            result = _call(api, prepared, _device_for(solution))
            counts = _counts(api.label)
            if counts["hit"] != 1:
                problems.append(f"{path}: the dispatcher did not route to it ({counts})")
            who = f"solution {solution.name!r} ({path})"
            if is_sampling(prepared.definition):
                problems += _judge_sampler(api, prepared, result, who, _device_for(solution))
            else:
                problems += _compare_all(prepared, result, who)
        except Exception as exc:
            problems.append(f"{path}: {type(exc).__name__}: {exc}")
        finally:
            _disable()
        ran += 1
    assert not problems, f"{case}:\n  " + "\n  ".join(problems)
    if not ran:
        pytest.skip(f"{case}: " + "; ".join(skipped))
