"""What every CUDA file of one definition is written from: its view, C++ names and types."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fibgen.codegen.cuda import cppliteral
from fibgen.codegen.errors import GenerateError
from fibgen.compiler import ir
from fibgen.format.models import name_problem

C_TYPE = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "float8_e4m3fn": "__nv_fp8_e4m3",
    "float8_e5m2": "__nv_fp8_e5m2",
    "float4_e2m1": "uint8_t",  # two e2m1 values per byte, as torch's float4_e2m1fn_x2
    "int64": "int64_t",
    "int32": "int32_t",
    "int16": "int16_t",
    "int8": "int8_t",
    "bool": "bool",
}
SCALAR_TYPE = {
    "float32": "at::kFloat",
    "float16": "at::kHalf",
    "bfloat16": "at::kBFloat16",
    "float8_e4m3fn": "at::kFloat8_e4m3fn",
    "float8_e5m2": "at::kFloat8_e5m2",
    "float4_e2m1": "at::kFloat4_e2m1fn_x2",
    "int64": "at::kLong",
    "int32": "at::kInt",
    "int16": "at::kShort",
    "int8": "at::kChar",
    "bool": "at::kBool",
}
# Python scalars cross the binding as double, int64_t or bool; kernels take the declared type.
HOST_SCALAR = {"float32": "double", "float16": "double", "bfloat16": "double", "bool": "bool"}
_CPP_KEYWORDS = frozenset(
    "alignas alignof and asm auto bool break case catch char class const constexpr continue "
    "default delete do double else enum explicit export extern false float for friend goto if "
    "inline int long mutable namespace new noexcept not nullptr operator or private protected "
    "public register return short signed sizeof static struct switch template this throw true "
    "try typedef typename union unsigned using virtual void volatile while check options stream "
    "guard status".split()
)


class CudaGenError(GenerateError):
    """A definition the CUDA target cannot express; the message names it and the reason."""


def cpp_ident(name: str) -> str:
    """A C++ identifier for a tensor or axis name (keywords and locals get a trailing '_')."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    if ident[0].isdigit():
        ident = "_" + ident
    return cppliteral.identifier(ident + "_" if ident in _CPP_KEYWORDS else ident)


def const_name(axis: str) -> str:
    return cpp_ident(axis).upper()


@dataclass(frozen=True)
class Def:
    """What every file of one definition is written from."""

    defn: ir.Definition
    ns: str
    consts: dict[str, int]
    var_axes: tuple[str, ...]
    tensors: tuple[ir.DefTensor, ...]  # inputs then outputs, scalars included
    dispatch: ir.DefTensor

    @property
    def name(self) -> str:
        return self.defn.name


def definition_view(defn: ir.Definition) -> Def:
    # The name is a file name here (`#include "<name>.cuh"`, which no escape can make safe)
    # and a folder: the compiler has checked it; this is the guard of the target itself.
    problem = name_problem(defn.name)
    if problem is not None:
        raise CudaGenError(f"definition name {defn.name!r} {problem}")
    consts = {a.name: a.value for a in defn.axes if a.kind == "const" and a.value is not None}
    var_axes = tuple(a.name for a in defn.axes if a.kind == "var")
    tensors = defn.inputs + defn.outputs
    required = [t for t in tensors if t.shape is not None and not t.optional]
    if not required:
        raise CudaGenError(f"{defn.name}: the CUDA target needs at least one required tensor")
    return Def(defn, f"fibgen_{cpp_ident(defn.name)}", consts, var_axes, tensors, required[0])


def is_input(d: Def, t: ir.DefTensor) -> bool:
    return t in d.defn.inputs


def axis_param(d: Def, axis: str) -> str:
    # A var axis and a tensor of one name would clash as parameters: the axis gives way.
    ident = cpp_ident(axis)
    return ident + "_size" if ident in {cpp_ident(t.name) for t in d.tensors} else ident
