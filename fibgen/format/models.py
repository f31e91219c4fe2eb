"""The FlashInfer Trace data model: Definition, Solution, Workload, Trace and Evaluation.

These models accept and reject what flashinfer-bench 0.1.2's own models accept and reject
(their JSON Schemas are in ``shared/reference/schemas``), with these deliberate differences:

* unknown keys are ignored, as flashinfer-bench ignores them (a file written by a newer
  version still loads), but not silently: ``strip_unknown_keys`` removes them before
  validation and the loaders in ``fibgen.format.jsonio`` warn with each key's place, so a
  misspelt ``"dtpye"`` is still reported. The models themselves forbid extra keys, so an
  object built in code cannot carry one;
* ``axes`` and workload ``inputs`` are unions tagged by ``"type"``, and the tag is required;
* a tensor may carry FlashInfer's ``"optional": true`` extension, which is kept;
* the names of definitions, op_types, solutions and authors are safe names (see Note [safe
  names]): each becomes a folder or file name in a dataset and in generated code.

Every cross-field check collects all of its problems before raising, so one load of a broken
file lists everything a curator has to fix. This module imports only pydantic and the
standard library: the runtime imports it on its hot start-up path.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fibgen.format.errors import PROBLEMS_ERROR_TYPE

DType = Literal[
    "float32",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float4_e2m1",
    "int64",
    "int32",
    "int16",
    "int8",
    "bool",
]

# The dtypes of the format, in the order flashinfer-bench lists them.
DTYPES: tuple[str, ...] = get_args(DType)

# Bytes per element as declared shapes count them (fp4 shapes count packed bytes).
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float4_e2m1": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "bool": 1,
}

LANGUAGES: tuple[str, ...] = ("python", "triton", "cpp", "cuda", "tilelang")
Language = Literal["python", "triton", "cpp", "cuda", "tilelang"]
Binding = Literal["tvm-ffi", "torch"]

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

# Note [safe names]
# A definition, op_type, solution or author name is a single path component: fibgen writes
# `definitions/<op_type>/<definition>.json`, `traces/<author>/<op_type>/<definition>.jsonl`,
# `solutions/<author>/<op_type>/<definition>/<solution>/` and `generated/cuda/<definition>/`.
# So a name is 1 to 128 characters from letters, digits, '_', '-' and '.', and starts with
# a letter, a digit or '_': no separator, no '..', no hidden file, no option-like '-x', no
# space, quote or control character. Every name in the flashinfer-trace dataset and the
# catalogue fits. The rule is checked here, where the models are built, and by the compiler
# and the command line through `name_problem`.
MAX_NAME_LENGTH = 128
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
NAME_RULE = (
    f"a name is 1 to {MAX_NAME_LENGTH} letters, digits, '_', '-' or '.', "
    "starting with a letter, a digit or '_'"
)


def name_problem(name: str) -> str | None:
    """What makes ``name`` unsafe as a file or folder name (Note [safe names]), or None."""
    if _SAFE_NAME.fullmatch(name) and len(name) <= MAX_NAME_LENGTH:
        return None
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long"
    bad = next((ch for ch in name if not (ch.isascii() and (ch.isalnum() or ch in "_.-"))), None)
    if bad == "/" or bad == "\\":
        return f"contains the path separator {bad!r}"
    if bad is not None:
        return f"contains {bad!r}"
    return f"starts with {name[0]!r}"


def _check_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}; {NAME_RULE}")  # after the field's location
    return value


def _raise_problems(problems: list[str]) -> None:
    if problems:
        raise PydanticCustomError(
            PROBLEMS_ERROR_TYPE, "{summary}", {"summary": "; ".join(problems), "problems": problems}
        )


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------------------------------
# Definition


class AxisVar(_Model):
    """An axis whose size is read from the input tensors at call time."""

    type: Literal["var"] = "var"
    description: Optional[str] = None


class AxisConst(_Model):
    """An axis whose size is fixed by the definition."""

    type: Literal["const"] = "const"
    value: int = Field(ge=0)
    description: Optional[str] = None


Axis = Annotated[Union[AxisVar, AxisConst], Field(discriminator="type")]


class TensorSpec(_Model):
    """One input or output: a shape over declared axes (None for a scalar) and a dtype."""

    shape: Optional[list[NonEmptyStr]]
    dtype: DType
    description: Optional[str] = None
    # FlashInfer extension: the argument may be None at call time. flashinfer-bench ignores it.
    optional: bool = False

    @property
    def is_scalar(self) -> bool:
        """True when the value is a Python scalar passed by value (``shape: null``)."""
        return self.shape is None


class Definition(_Model):
    """A kernel definition: axes, tensors, constraints and a Python reference."""

    # Field order is the canonical key order of a definition file (see jsonio).
    name: NonEmptyStr
    description: Optional[str] = None
    op_type: NonEmptyStr
    tags: list[NonEmptyStr] = Field(default_factory=list)
    axes: dict[NonEmptyStr, Axis]
    constraints: list[NonEmptyStr] = Field(default_factory=list)
    inputs: dict[NonEmptyStr, TensorSpec]
    outputs: dict[NonEmptyStr, TensorSpec]
    reference: NonEmptyStr

    @field_validator("name", "op_type")
    @classmethod
    def _validate_name(cls, value: str) -> str:
        return _check_name(value)

    @model_validator(mode="after")
    def _validate(self) -> Definition:
        # flashinfer-bench runs four separate validators (_validate_reference_code,
        # _validate_input_output_names, _validate_constraints_syntax,
        # _validate_tensor_axis_references); the same checks run here in one pass so that
        # every problem is reported together.
        problems = (
            reference_problems(self.reference)
            + _name_problems(self)
            + constraint_problems(self.constraints)
            + _axis_reference_problems(self)
        )
        _raise_problems(problems)
        return self

    @property
    def var_axes(self) -> list[str]:
        """Names of the var axes, in declaration order."""
        return [name for name, axis in self.axes.items() if axis.type == "var"]

    @property
    def const_axes(self) -> dict[str, int]:
        """Const axis name -> value, in declaration order."""
        return {name: axis.value for name, axis in self.axes.items() if axis.type == "const"}


def reference_problems(reference: str) -> list[str]:
    """Problems with a reference: not Python, or no top-level ``def run``."""
    try:
        module = ast.parse(reference, mode="exec")
    except SyntaxError as exc:
        return [
            f"reference: not valid Python: {exc.msg} "
            f"(line {exc.lineno}, column {exc.offset} of the reference)"
        ]
    except (ValueError, MemoryError, RecursionError) as exc:  # NUL byte; too deeply nested
        return [f"reference: not valid Python: {str(exc) or 'too deeply nested'}"]
    if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in module.body):
        return [
            "reference: defines no top-level function 'run' "
            "(the reference must contain 'def run(...)' at module level)"
        ]
    return []


def constraint_problems(constraints: list[str]) -> list[str]:
    """Problems with constraints: each must parse as one Python expression."""
    problems = []
    for i, text in enumerate(constraints):
        try:
            ast.parse(text, mode="eval")
        except SyntaxError as exc:
            problems.append(
                f"constraints[{i}]: {text!r} is not a Python expression ({exc.msg}); "
                "write a condition such as 'num_pages >= batch_size'"
            )
        except (ValueError, MemoryError, RecursionError) as exc:
            problems.append(
                f"constraints[{i}]: {text!r} is not a Python expression "
                f"({str(exc) or 'too deeply nested'})"
            )
    return problems


def _name_problems(defn: Definition) -> list[str]:
    return [
        f"outputs.{name}: the name {name!r} is also an input; "
        "input and output names must be different"
        for name in defn.outputs
        if name in defn.inputs
    ]


def _axis_reference_problems(defn: Definition) -> list[str]:
    problems = []
    for group, tensors in (("inputs", defn.inputs), ("outputs", defn.outputs)):
        for tname, spec in tensors.items():
            for i, axis in enumerate(spec.shape or ()):
                if axis not in defn.axes:
                    problems.append(
                        f"{group}.{tname}.shape[{i}]: axis {axis!r} is not declared in 'axes'"
                    )
    return problems


# ---------------------------------------------------------------------------------------
# Solution


class SourceFile(_Model):
    """One file of a solution, placed at ``path`` under the build directory."""

    path: NonEmptyStr
    content: NonEmptyStr

    @field_validator("path")
    @classmethod
    def _validate_path(cls, value: str) -> str:
        problem = source_path_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def source_path_problem(path: str) -> str | None:
    """Why a source path is not a safe relative path, or None when it is."""
    # Check both spellings: a solution written on Windows must not escape the build dir either.
    parts = path.replace("\\", "/").split("/")
    if path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        return f"source path {path!r} is absolute; use a path relative to the solution"
    if ".." in parts:
        return f"source path {path!r} contains '..'; a source may not leave the solution directory"
    # A NUL cannot be in a file name at all (the OS call fails), and other control characters
    # (newline, escape, DEL, C1) make names that terminals and logs show as something else.
    control = next((c for c in path if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        return (
            f"source path {path!r} contains the control character {control!r}; a source path "
            "is printable text"
        )
    return None


class BuildSpec(_Model):
    """How to build and call a solution."""

    language: Language
    target_hardware: list[str] = Field(min_length=1)
    entry_point: NonEmptyStr
    dependencies: list[NonEmptyStr] = Field(default_factory=list)
    destination_passing_style: bool = True
    binding: Optional[Binding] = None

    @field_validator("entry_point")
    @classmethod
    def _validate_entry_point(cls, value: str) -> str:
        count = value.count("::")
        if count != 1:
            raise ValueError(
                f"entry point {value!r} must have the form '<file>::<function>' with exactly "
                f"one '::' (found {count})"
            )
        file, symbol = value.split("::")
        if not file or not symbol:
            raise ValueError(
                f"entry point {value!r} must name both a file and a function: '<file>::<function>'"
            )
        return value

    @property
    def entry_file(self) -> str:
        """The file part of ``entry_point``."""
        return self.entry_point.split("::")[0]

    @property
    def entry_symbol(self) -> str:
        """The function part of ``entry_point``."""
        return self.entry_point.split("::")[1]


class Solution(_Model):
    """A concrete implementation of one definition."""

    name: NonEmptyStr
    definition: NonEmptyStr
    author: NonEmptyStr
    description: Optional[str] = None
    spec: BuildSpec
    sources: list[SourceFile] = Field(min_length=1)

    @field_validator("name", "definition", "author")
    @classmethod
    def _validate_name(cls, value: str) -> str:
        return _check_name(value)

    @model_validator(mode="after")
    def _validate_source_path_entry_point(self) -> Solution:
        problems = []
        seen: set[str] = set()
        for i, source in enumerate(self.sources):
            if source.path in seen:
                problems.append(f"sources[{i}].path: duplicate source path {source.path!r}")
            seen.add(source.path)
        entry_file = self.spec.entry_file
        if entry_file not in seen:
            listed = ", ".join(repr(s.path) for s in self.sources)
            problems.append(
                f"spec.entry_point: the entry file {entry_file!r} is not among the sources "
                f"({listed})"
            )
        _raise_problems(problems)
        return self


# ---------------------------------------------------------------------------------------
# Workload


class RandomInput(_Model):
    """An input filled with random values of the declared shape and dtype."""

    type: Literal["random"] = "random"


class ScalarInput(_Model):
    """A scalar input passed by value."""

    type: Literal["scalar"] = "scalar"
    value: Union[int, float, bool]

    @field_validator("value", mode="before")
    @classmethod
    def _validate_value(cls, value: Any) -> Any:
        # Without this a wrong value yields one pydantic error per union member.
        if not isinstance(value, (int, float, bool, str)):
            kind = "null" if value is None else type(value).__name__
            raise ValueError(f"a scalar value must be a number or true/false, got {kind}")
        return value


class SafetensorsInput(_Model):
    """An input stored as one tensor of a safetensors file under the dataset root."""

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyStr
    tensor_key: NonEmptyStr


InputSpec = Annotated[
    Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")
]


class Workload(_Model):
    """Concrete values for the var axes of a definition and a source for each input."""

    uuid: NonEmptyStr
    # flashinfer-bench accepts 0 (the dataset has "num_pages": 0); only negatives are wrong.
    axes: dict[str, Annotated[int, Field(ge=0)]]
    inputs: dict[str, InputSpec]


def workload_problems(definition: Definition, workload: Workload) -> list[str]:
    """Mismatches between a workload and its definition (var axes and input names)."""
    problems = []
    var_axes = definition.var_axes
    missing = [a for a in var_axes if a not in workload.axes]
    extra = [a for a in workload.axes if a not in var_axes]
    if missing:
        problems.append(f"workload.axes: no value for var axes {missing}")
    if extra:
        problems.append(f"workload.axes: {extra} are not var axes of {definition.name!r}")
    missing_in = [n for n in definition.inputs if n not in workload.inputs]
    extra_in = [n for n in workload.inputs if n not in definition.inputs]
    if missing_in:
        problems.append(f"workload.inputs: no entry for inputs {missing_in}")
    if extra_in:
        problems.append(f"workload.inputs: {extra_in} are not inputs of {definition.name!r}")
    for name, spec in workload.inputs.items():
        tensor = definition.inputs.get(name)
        if tensor is not None and tensor.is_scalar and spec.type == "random":
            problems.append(f"workload.inputs.{name}: a scalar input needs a 'scalar' value")
    return problems


# ---------------------------------------------------------------------------------------
# Evaluation and Trace


class EvaluationStatus(str, Enum):
    """The outcome of evaluating a solution on a workload."""

    PASSED = "PASSED"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    COMPILE_ERROR = "COMPILE_ERROR"
    TIMEOUT = "TIMEOUT"


class _MetricsModel(_Model):
    # flashinfer-bench writes inf/nan as the strings "Infinity", "-Infinity", "NaN";
    # pydantic reads those strings back as floats.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class Correctness(_MetricsModel):
    """Largest errors of a solution's outputs against the reference."""

    max_relative_error: float = 0.0
    max_absolute_error: float = 0.0
    extra: Optional[dict[str, Any]] = None


class Performance(_MetricsModel):
    """Timings of a solution and of the reference."""

    latency_ms: float = Field(default=0.0, ge=0.0)
    reference_latency_ms: float = Field(default=0.0, ge=0.0)
    speedup_factor: float = Field(default=0.0, ge=0.0)
    # fibgen's own: end-to-end eager latency (back-to-back calls, CPU launch included,
    # fibgen/bench/eager.py) of the solution and of the reference. flashinfer-bench's
    # Performance ignores keys it does not know, so its readers load these traces as they are.
    e2e_latency_ms: Optional[float] = Field(default=None, ge=0.0)
    reference_e2e_latency_ms: Optional[float] = Field(default=None, ge=0.0)


class Environment(_Model):
    """Where an evaluation ran."""

    hardware: NonEmptyStr
    libs: dict[str, str] = Field(default_factory=dict)


_NEEDS_CORRECTNESS = (EvaluationStatus.PASSED, EvaluationStatus.INCORRECT_NUMERICAL)


class Evaluation(_MetricsModel):
    """The result of running one solution on one workload."""

    status: EvaluationStatus
    environment: Environment
    timestamp: NonEmptyStr
    log: str = ""
    correctness: Optional[Correctness] = None
    performance: Optional[Performance] = None

    @model_validator(mode="after")
    def _validate_status_metrics(self) -> Evaluation:
        status = self.status.value
        problems = []
        if self.status in _NEEDS_CORRECTNESS and self.correctness is None:
            problems.append(f"correctness: required when status is {status}")
        if self.status not in _NEEDS_CORRECTNESS and self.correctness is not None:
            problems.append(
                f"correctness: only allowed when status is PASSED or INCORRECT_NUMERICAL, "
                f"not {status}"
            )
        if self.status is EvaluationStatus.PASSED and self.performance is None:
            problems.append("performance: required when status is PASSED")
        if self.status is not EvaluationStatus.PASSED and self.performance is not None:
            problems.append(f"performance: only allowed when status is PASSED, not {status}")
        _raise_problems(problems)
        return self


class Trace(_Model):
    """One JSONL line: a workload, and optionally a solution's evaluation on it."""

    definition: NonEmptyStr
    workload: Workload
    solution: Optional[str] = None
    evaluation: Optional[Evaluation] = None

    @field_validator("definition", "solution")
    @classmethod
    def _validate_name(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else _check_name(value)

    @property
    def is_workload_trace(self) -> bool:
        """True for a workload line (no solution and no evaluation)."""
        return self.solution is None and self.evaluation is None
