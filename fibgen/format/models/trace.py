"""Workloads and traces: a workload's inputs, an evaluation's results, one JSONL line."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, field_validator, model_validator

from fibgen.format.models.base import Model, NonEmptyStr, check_name, raise_problems
from fibgen.format.models.definition import Definition

# ---------------------------------------------------------------------------------------
# Workload


class RandomInput(Model):
    """An input filled with random values of the declared shape and dtype."""

    type: Literal["random"] = "random"


class ScalarInput(Model):
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


class SafetensorsInput(Model):
    """An input stored as one tensor of a safetensors file under the dataset root."""

    type: Literal["safetensors"] = "safetensors"
    path: NonEmptyStr
    tensor_key: NonEmptyStr


InputSpec = Annotated[
    Union[RandomInput, ScalarInput, SafetensorsInput], Field(discriminator="type")
]


class Workload(Model):
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


class _MetricsModel(Model):
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
    # fibgen's own (Note [bench e2e] in fibgen/bench/worker.py): the API's own function in the
    # same paired rounds and behind the same L2 flush, where it runs here; the relative spread
    # of the solution's e2e figure over its rounds; whether the e2e figure is of the call
    # routed through the generated dispatcher (True) or of the solution called directly.
    original_e2e_latency_ms: Optional[float] = Field(default=None, ge=0.0)
    original_latency_ms: Optional[float] = Field(default=None, ge=0.0)
    e2e_spread: Optional[float] = Field(default=None, ge=0.0)
    e2e_routed: Optional[bool] = None


class Environment(Model):
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
        raise_problems(problems)
        return self


class Trace(Model):
    """One JSONL line: a workload, and optionally a solution's evaluation on it."""

    definition: NonEmptyStr
    workload: Workload
    solution: Optional[str] = None
    evaluation: Optional[Evaluation] = None

    @field_validator("definition", "solution")
    @classmethod
    def _validate_name(cls, value: Optional[str]) -> Optional[str]:
        return None if value is None else check_name(value)

    @property
    def is_workload_trace(self) -> bool:
        """True for a workload line (no solution and no evaluation)."""
        return self.solution is None and self.evaluation is None
