"""The launcher of a definition (``<name>.cu``): checks every tensor, then launches by dtype."""

from __future__ import annotations

import ast
import re

from fibgen.codegen.cuda import cppliteral
from fibgen.codegen.cuda.view import (
    C_TYPE,
    HOST_SCALAR,
    SCALAR_TYPE,
    CudaGenError,
    Def,
    cpp_ident,
    is_input,
)
from fibgen.codegen.templates import render
from fibgen.compiler import ir
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python


def host_param(d: Def, t: ir.DefTensor) -> str:
    if t.shape is None:
        return f"{HOST_SCALAR.get(t.dtype, 'int64_t')} {cpp_ident(t.name)}"
    kind = "std::optional<at::Tensor>" if t.optional else "at::Tensor"
    return f"const {kind}& {cpp_ident(t.name)}"


def _check_line(d: Def, t: ir.DefTensor) -> str:
    dims = ", ".join(
        f"{{{cppliteral.string(a)}, {d.consts[a] if a in d.consts else 'fibgen::kVar'}}}"
        for a in t.shape or ()
    )
    name = cppliteral.string(t.name)
    return f"check.tensor({name}, {cpp_ident(t.name)}, {SCALAR_TYPE[t.dtype]}, {{{dims}}});"


def _axis_value(d: Def, axis: str) -> str:
    return str(d.consts[axis]) if axis in d.consts else f"check.axis({cppliteral.string(axis)})"


_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}


def _cpp_expr(d: Def, node: ast.expr) -> str | None:
    """C++ for a constraint over axes alone (sizes are non-negative, so // is /); else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        # Wider than int64 would not compile as a C++ literal: leave it to Python.
        return str(node.value) if -(2**63) < node.value < 2**63 else None
    if isinstance(node, ast.Name) and (node.id in d.consts or node.id in d.var_axes):
        return _axis_value(d, node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _cpp_expr(d, node.left), _cpp_expr(d, node.right)
        if left is None or right is None:
            return None
        return f"({left} {_BIN[type(node.op)]} {right})"
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        left, right = _cpp_expr(d, node.left), _cpp_expr(d, node.comparators[0])
        if left is None or right is None:
            return None
        return f"{left} {_CMP[type(node.ops[0])]} {right}"
    return None


def _constraint_lines(d: Def) -> list[str]:
    lines = []
    for text in d.defn.constraints:
        try:
            tree = parse_python(text, "eval").body
        except PythonSyntaxError:
            tree = None
        try:
            cond = _cpp_expr(d, tree) if isinstance(tree, ast.Compare) else None
        except RecursionError:  # a constraint too deep to translate is checked by Python only
            cond = None
        if cond is None:
            lines.append(
                f"// Not checked here (it reads tensor values): {cppliteral.comment(text)}"
            )
        else:
            message = cppliteral.string(f"{d.name}: constraint `{text}` does not hold")
            lines.append(f"TORCH_CHECK_VALUE({cond}, {message});")
    return lines


def _pointer(d: Def, t: ir.DefTensor) -> str:
    ctype = C_TYPE[t.dtype]
    const = "const " if is_input(d, t) else ""
    name = cpp_ident(t.name)
    if t.optional:
        return f"{name}.has_value() ? static_cast<{const}{ctype}*>({name}->data_ptr()) : nullptr"
    return f"static_cast<{const}{ctype}*>({name}.data_ptr())"


def _launch_args(d: Def) -> list[str]:
    args = []
    for t in d.tensors:
        if t.shape is None:
            args.append(f"static_cast<{C_TYPE[t.dtype]}>({cpp_ident(t.name)})")
        else:
            args.append(_pointer(d, t))
    args += [_axis_value(d, a) for a in d.var_axes]
    return args + ["stream"]


def _requires_lines(d: Def, family: ir.Family) -> list[str]:
    lines = []
    for req in family.requires:
        match = re.fullmatch(r"sm_?(\d+)a?", req)
        if match is None:
            raise CudaGenError(f"{d.name}: cannot read requirement {req!r} (write e.g. sm90)")
        device = f"{cpp_ident(d.dispatch.name)}.device()"
        name = cppliteral.string(d.name)
        lines.append(f"fibgen::require_compute_capability({name}, {device}, {int(match[1])});")
    return lines


def _allocation(d: Def, t: ir.DefTensor) -> str:
    sizes = ", ".join(_axis_value(d, a) for a in t.shape or ())
    return (
        f"at::Tensor {cpp_ident(t.name)} = at::empty(std::vector<int64_t>{{{sizes}}}, "
        f"options.dtype({SCALAR_TYPE[t.dtype]}));"
    )


def launcher_source(d: Def, family: ir.Family) -> str:
    inputs, outputs = d.defn.inputs, d.defn.outputs
    input_params = [host_param(d, t) for t in inputs]
    dps_params = input_params + [host_param(d, t) for t in outputs]
    names_in = [cpp_ident(t.name) for t in inputs]
    names_all = names_in + [cpp_ident(t.name) for t in outputs]
    first_input = next((t for t in inputs if t.shape is not None and not t.optional), None)
    options = (
        f"{cpp_ident(first_input.name)}.options()"
        if first_input is not None
        else "at::TensorOptions().device(at::kCUDA)"
    )
    return render(
        "cuda_launcher.cu.j2",
        name=cppliteral.comment(d.name),
        header=d.name,  # a file name: checked by _view (Note [safe names])
        name_literal=cppliteral.string(d.name),
        checks_only_message=cppliteral.string(
            f"{d.name}: the checks passed; a FIBGEN_CHECKS_ONLY build launches nothing"
        ),
        no_kernel_message=cppliteral.string(f"{d.name}: no kernel for dtype "),
        ns=d.ns,
        check_inputs_params=",\n    ".join(["fibgen::Checker& check"] + input_params),
        input_checks=[_check_line(d, t) for t in inputs if t.shape is not None]
        + [
            f"check.scalar_axis({cppliteral.string(a.name)}, {cpp_ident(a.name)});"
            for a in d.defn.axes
            if a.scalar
        ],
        dps_params_checker=",\n    ".join(["fibgen::Checker& check"] + dps_params),
        output_checks=[_check_line(d, t) for t in outputs if t.shape is not None],
        constraint_checks=_constraint_lines(d),
        device=f"{cpp_ident(d.dispatch.name)}.device()",
        requires=_requires_lines(d, family),
        dispatch=cpp_ident(d.dispatch.name),
        cases=[
            {
                "scalar": SCALAR_TYPE[d.dispatch.dtype],
                "ctype": C_TYPE[d.dispatch.dtype],
                "args": ",\n          ".join(_launch_args(d)),
            }
        ],
        dps_params=",\n    ".join(dps_params),
        check_inputs_args=", ".join(["check"] + names_in),
        dps_args_checker=", ".join(["check"] + names_all),
        returns=return_type(outputs),
        input_params=",\n    ".join(input_params),
        options=options,
        allocations=[_allocation(d, t) for t in outputs],
        returned=_returned(outputs),
    )


def return_type(outputs: tuple[ir.DefTensor, ...]) -> str:
    if len(outputs) == 1:
        return "at::Tensor"
    return f"std::tuple<{', '.join(['at::Tensor'] * len(outputs))}>"


def _returned(outputs: tuple[ir.DefTensor, ...]) -> str:
    names = [cpp_ident(t.name) for t in outputs]
    return names[0] if len(names) == 1 else f"std::make_tuple({', '.join(names)})"
