"""What every model shares: the dtypes, the languages, a frozen base, all problems at once."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, StringConstraints
from pydantic_core import PydanticCustomError

from fibgen.format.errors import PROBLEMS_ERROR_TYPE
from fibgen.format.models.names import NAME_RULE, name_problem

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


def check_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}; {NAME_RULE}")  # after the field's location
    return value


def raise_problems(problems: list[str]) -> None:
    if problems:
        raise PydanticCustomError(
            PROBLEMS_ERROR_TYPE, "{summary}", {"summary": "; ".join(problems), "problems": problems}
        )


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
