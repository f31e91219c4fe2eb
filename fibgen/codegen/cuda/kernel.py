"""The kernel header of a definition (``<name>.cuh``): a naive kernel, else a skeleton.

Note [naive kernels]: a kernel body is generated only for families in ``_ROW_NORMS``, whose
math was written from their references and is held to them by their generated tests; every
other definition gets a marked skeleton that the launcher reports as such when called.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from fibgen.codegen.cuda import cppliteral
from fibgen.codegen.cuda.view import C_TYPE, Def, axis_param, const_name, cpp_ident, is_input
from fibgen.codegen.templates import render
from fibgen.compiler import ir
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python


@dataclass(frozen=True)
class RowNorm:
    """A row-wise RMS normalization: ``(x [+ residual]) * inv_rms * (offset + weight)``."""

    residual: bool
    weight_offset: float


# Note [naive kernels]: the families whose references these reproduce.
_ROW_NORMS = {
    "rmsnorm": RowNorm(residual=False, weight_offset=0.0),
    "fused_add_rmsnorm": RowNorm(residual=True, weight_offset=0.0),
    "gemma_rmsnorm": RowNorm(residual=False, weight_offset=1.0),
}


def _kernel_type(d: Def, t: ir.DefTensor) -> str:
    return "T" if t.dtype == d.dispatch.dtype else C_TYPE[t.dtype]


def _kernel_params(d: Def) -> list[str]:
    params = []
    for t in d.tensors:
        if t.shape is None:
            params.append(f"{C_TYPE[t.dtype]} {cpp_ident(t.name)}")
        else:
            const = "const " if is_input(d, t) else ""
            params.append(f"{const}{_kernel_type(d, t)}* __restrict__ {cpp_ident(t.name)}")
    params += [f"int64_t {axis_param(d, a)}" for a in d.var_axes]
    return params


def _contract(d: Def) -> list[str]:
    lines = []
    for t in d.tensors:
        role = "in " if is_input(d, t) else "out"
        shape = "scalar" if t.shape is None else f"[{', '.join(t.shape)}]"
        extra = " (optional: nullptr when absent)" if t.optional else ""
        lines.append(f"{role} {t.name}: {t.dtype}{shape}{extra}")
    lines += [f"constraint: {c}" for c in d.defn.constraints]
    return [cppliteral.comment(line) for line in lines]


def _eps(reference: str | None) -> float | None:
    """The module-level ``EPS = <number>`` of a reference, which the naive kernels use."""
    if reference is None:
        return None
    try:
        tree = parse_python(reference)
    except PythonSyntaxError:
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["EPS"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, (int, float))
        ):
            try:
                eps = float(node.value.value)
            except OverflowError:
                return None
            return eps if math.isfinite(eps) else None
    return None


def _row_norm_body(d: Def, family: ir.Family) -> str | None:
    """The naive body of a row normalization, or None when the definition is not one."""
    recipe = _ROW_NORMS.get(family.name)
    eps = _eps(d.defn.reference)
    if recipe is None or eps is None:
        return None
    inputs, outputs = d.defn.inputs, d.defn.outputs
    want = 3 if recipe.residual else 2
    if len(inputs) != want or len(outputs) != 1:
        return None
    rows, width = inputs[0].shape or ("", "")
    row_shape, weight = (rows, width), inputs[-1]
    dtypes = {t.dtype for t in inputs + outputs}
    if (
        any(t.shape != row_shape for t in inputs[:-1] + outputs)
        or weight.shape != (width,)
        or width not in d.consts
        or rows not in d.var_axes
        or len(dtypes) != 1
        or dtypes.pop() not in ("float32", "float16", "bfloat16")
        or any(t.optional for t in inputs + outputs)
    ):
        return None
    x = cpp_ident(inputs[0].name)
    value = f"fibgen::to_float({x}[offset + i])"
    if recipe.residual:
        value += f" + fibgen::to_float({cpp_ident(inputs[1].name)}[offset + i])"
    scale = f"fibgen::to_float({cpp_ident(weight.name)}[i])"
    if recipe.weight_offset:
        scale = f"({recipe.weight_offset!r}f + {scale})"
    params = _kernel_params(d)
    return render(
        "cuda_body_rmsnorm.j2",
        family=cppliteral.comment(family.name),
        eps=f"{eps!r}f",
        width=const_name(width),
        rows=axis_param(d, rows),
        value=value,
        scale=scale,
        output=cpp_ident(outputs[0].name),
        kernel_params=",\n    ".join(params),
        launch_params=",\n    ".join(params + ["cudaStream_t stream"]),
        kernel_args=", ".join(p.rsplit(" ", 1)[1] for p in params),
    )


def kernel_header(d: Def, family: ir.Family) -> str:
    body = _row_norm_body(d, family)
    summary = "naive kernel"
    if body is None:
        summary = "kernel skeleton"
        params = _kernel_params(d)
        body = render(
            "cuda_body_skeleton.j2",
            family=cppliteral.comment(family.name),
            contract=_contract(d),
            kernel_params=",\n    ".join(params),
            launch_params=",\n    ".join(params + ["cudaStream_t stream"]),
        )
    constants = [
        f"constexpr int64_t {const_name(a)} = {v};  // const axis {cppliteral.comment(a)}"
        for a, v in d.consts.items()
    ]
    return render(
        "cuda_kernel.cuh.j2",
        name=cppliteral.comment(d.name),
        summary=summary,
        ns=d.ns,
        constants=constants,
        body=body,
    )
