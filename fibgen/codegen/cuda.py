"""CUDA target: ``cuda/<name>/`` per definition, and the sources of a cuda solution scaffold.

Per definition: ``<name>.cuh`` (framework-agnostic kernel and host launch over plain pointers
and sizes), ``<name>.cu`` (the launcher: checks every tensor against the definition, then
dispatches on dtype and launches on the current stream), ``binding.cpp`` (exports ``run`` and
``run_dps`` through torch's C++ extension API) and ``__init__.py`` (builds on first use and
exposes the definition's signature). What every definition shares lives once in
``cuda/include/``: the torch-side checks (``fibgen_launch.h``) and device helpers
(``fibgen_kernel.h``), so each definition's folder holds only what is its own.

Note [naive kernels]: a kernel body is generated only for families in ``_ROW_NORMS``, whose
math was written from their references and is held to them by their generated tests; every
other definition gets a marked skeleton that the launcher reports as such when called.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass


from fibgen.codegen import cppliteral, pyliteral
from fibgen.codegen.files import (
    GenerateError,
    GeneratedFile,
    with_c_header,
    with_python_header,
)
from fibgen.codegen.pyformat import format_python
from fibgen.codegen.templates import render
from fibgen.compiler import ir
from fibgen.compiler.pysyntax import PythonSyntaxError, parse_python
from fibgen.format.models import name_problem

# The binding every generated and scaffolded CUDA source is written for (see the README).
BINDING = "torch"
# The file of a cuda scaffold that exports the entry symbol.
ENTRY_FILE = "binding.cpp"

_C_TYPE = {
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
_SCALAR_TYPE = {
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
_HOST_SCALAR = {"float32": "double", "float16": "double", "bfloat16": "double", "bool": "bool"}
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


def _ident(name: str) -> str:
    """A C++ identifier for a tensor or axis name (keywords and locals get a trailing '_')."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    if ident[0].isdigit():
        ident = "_" + ident
    return cppliteral.identifier(ident + "_" if ident in _CPP_KEYWORDS else ident)


def _const_name(axis: str) -> str:
    return _ident(axis).upper()


@dataclass(frozen=True)
class _Def:
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


def _view(defn: ir.Definition) -> _Def:
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
    return _Def(defn, f"fibgen_{_ident(defn.name)}", consts, var_axes, tensors, required[0])


def _is_input(d: _Def, t: ir.DefTensor) -> bool:
    return t in d.defn.inputs


def _axis_param(d: _Def, axis: str) -> str:
    # A var axis and a tensor of one name would clash as parameters: the axis gives way.
    ident = _ident(axis)
    return ident + "_size" if ident in {_ident(t.name) for t in d.tensors} else ident


# ---------------------------------------------------------------------------- kernel header


def _kernel_type(d: _Def, t: ir.DefTensor) -> str:
    return "T" if t.dtype == d.dispatch.dtype else _C_TYPE[t.dtype]


def _kernel_params(d: _Def) -> list[str]:
    params = []
    for t in d.tensors:
        if t.shape is None:
            params.append(f"{_C_TYPE[t.dtype]} {_ident(t.name)}")
        else:
            const = "const " if _is_input(d, t) else ""
            params.append(f"{const}{_kernel_type(d, t)}* __restrict__ {_ident(t.name)}")
    params += [f"int64_t {_axis_param(d, a)}" for a in d.var_axes]
    return params


def _contract(d: _Def) -> list[str]:
    lines = []
    for t in d.tensors:
        role = "in " if _is_input(d, t) else "out"
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


def _row_norm_body(d: _Def, family: ir.Family) -> str | None:
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
    x = _ident(inputs[0].name)
    value = f"fibgen::to_float({x}[offset + i])"
    if recipe.residual:
        value += f" + fibgen::to_float({_ident(inputs[1].name)}[offset + i])"
    scale = f"fibgen::to_float({_ident(weight.name)}[i])"
    if recipe.weight_offset:
        scale = f"({recipe.weight_offset!r}f + {scale})"
    params = _kernel_params(d)
    return render(
        "cuda_body_rmsnorm.j2",
        family=cppliteral.comment(family.name),
        eps=f"{eps!r}f",
        width=_const_name(width),
        rows=_axis_param(d, rows),
        value=value,
        scale=scale,
        output=_ident(outputs[0].name),
        kernel_params=",\n    ".join(params),
        launch_params=",\n    ".join(params + ["cudaStream_t stream"]),
        kernel_args=", ".join(p.rsplit(" ", 1)[1] for p in params),
    )


def _kernel_header(d: _Def, family: ir.Family) -> str:
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
        f"constexpr int64_t {_const_name(a)} = {v};  // const axis {cppliteral.comment(a)}"
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


# ---------------------------------------------------------------------------- launcher


def _host_param(d: _Def, t: ir.DefTensor) -> str:
    if t.shape is None:
        return f"{_HOST_SCALAR.get(t.dtype, 'int64_t')} {_ident(t.name)}"
    kind = "std::optional<at::Tensor>" if t.optional else "at::Tensor"
    return f"const {kind}& {_ident(t.name)}"


def _check_line(d: _Def, t: ir.DefTensor) -> str:
    dims = ", ".join(
        f"{{{cppliteral.string(a)}, {d.consts[a] if a in d.consts else 'fibgen::kVar'}}}"
        for a in t.shape or ()
    )
    name = cppliteral.string(t.name)
    return f"check.tensor({name}, {_ident(t.name)}, {_SCALAR_TYPE[t.dtype]}, {{{dims}}});"


def _axis_value(d: _Def, axis: str) -> str:
    return str(d.consts[axis]) if axis in d.consts else f"check.axis({cppliteral.string(axis)})"


_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%"}


def _cpp_expr(d: _Def, node: ast.expr) -> str | None:
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


def _constraint_lines(d: _Def) -> list[str]:
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


def _pointer(d: _Def, t: ir.DefTensor) -> str:
    ctype = _C_TYPE[t.dtype]
    const = "const " if _is_input(d, t) else ""
    name = _ident(t.name)
    if t.optional:
        return f"{name}.has_value() ? static_cast<{const}{ctype}*>({name}->data_ptr()) : nullptr"
    return f"static_cast<{const}{ctype}*>({name}.data_ptr())"


def _launch_args(d: _Def) -> list[str]:
    args = []
    for t in d.tensors:
        if t.shape is None:
            args.append(f"static_cast<{_C_TYPE[t.dtype]}>({_ident(t.name)})")
        else:
            args.append(_pointer(d, t))
    args += [_axis_value(d, a) for a in d.var_axes]
    return args + ["stream"]


def _requires_lines(d: _Def, family: ir.Family) -> list[str]:
    lines = []
    for req in family.requires:
        match = re.fullmatch(r"sm_?(\d+)a?", req)
        if match is None:
            raise CudaGenError(f"{d.name}: cannot read requirement {req!r} (write e.g. sm90)")
        device = f"{_ident(d.dispatch.name)}.device()"
        name = cppliteral.string(d.name)
        lines.append(f"fibgen::require_compute_capability({name}, {device}, {int(match[1])});")
    return lines


def _allocation(d: _Def, t: ir.DefTensor) -> str:
    sizes = ", ".join(_axis_value(d, a) for a in t.shape or ())
    return (
        f"at::Tensor {_ident(t.name)} = at::empty(std::vector<int64_t>{{{sizes}}}, "
        f"options.dtype({_SCALAR_TYPE[t.dtype]}));"
    )


def _launcher(d: _Def, family: ir.Family) -> str:
    inputs, outputs = d.defn.inputs, d.defn.outputs
    input_params = [_host_param(d, t) for t in inputs]
    dps_params = input_params + [_host_param(d, t) for t in outputs]
    names_in = [_ident(t.name) for t in inputs]
    names_all = names_in + [_ident(t.name) for t in outputs]
    first_input = next((t for t in inputs if t.shape is not None and not t.optional), None)
    options = (
        f"{_ident(first_input.name)}.options()"
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
        input_checks=[_check_line(d, t) for t in inputs if t.shape is not None],
        dps_params_checker=",\n    ".join(["fibgen::Checker& check"] + dps_params),
        output_checks=[_check_line(d, t) for t in outputs if t.shape is not None],
        constraint_checks=_constraint_lines(d),
        device=f"{_ident(d.dispatch.name)}.device()",
        requires=_requires_lines(d, family),
        dispatch=_ident(d.dispatch.name),
        cases=[
            {
                "scalar": _SCALAR_TYPE[d.dispatch.dtype],
                "ctype": _C_TYPE[d.dispatch.dtype],
                "args": ",\n          ".join(_launch_args(d)),
            }
        ],
        dps_params=",\n    ".join(dps_params),
        check_inputs_args=", ".join(["check"] + names_in),
        dps_args_checker=", ".join(["check"] + names_all),
        returns=_return_type(outputs),
        input_params=",\n    ".join(input_params),
        options=options,
        allocations=[_allocation(d, t) for t in outputs],
        returned=_returned(outputs),
    )


def _return_type(outputs: tuple[ir.DefTensor, ...]) -> str:
    if len(outputs) == 1:
        return "at::Tensor"
    return f"std::tuple<{', '.join(['at::Tensor'] * len(outputs))}>"


def _returned(outputs: tuple[ir.DefTensor, ...]) -> str:
    names = [_ident(t.name) for t in outputs]
    return names[0] if len(names) == 1 else f"std::make_tuple({', '.join(names)})"


# ---------------------------------------------------------------------------- binding


def _py_args(tensors: tuple[ir.DefTensor, ...]) -> str:
    return ", ".join(f"pybind11::arg({cppliteral.string(t.name)})" for t in tensors)


def _binding(d: _Def, exports: list[tuple[str, bool]]) -> str:
    """``exports``: (symbol, destination-passing) pairs, each bound to run or run_dps."""
    inputs, outputs = d.defn.inputs, d.defn.outputs
    input_params = [_host_param(d, t) for t in inputs]
    rows = []
    for symbol, dps in exports:
        doc = (
            f"{d.name}: writes {', '.join(t.name for t in outputs)} into the given buffers"
            if dps
            else f"{d.name}: returns {', '.join(t.name for t in outputs)}"
        )
        rows.append(
            {
                "symbol": cppliteral.string(cppliteral.identifier(symbol)),
                "function": "run_dps" if dps else "run",
                "doc": cppliteral.string(doc),
                "args": _py_args(inputs + outputs if dps else inputs),
            }
        )
    return render(
        "cuda_binding.cpp.j2",
        name=cppliteral.comment(d.name),
        ns=d.ns,
        symbols=cppliteral.comment(" and ".join(symbol for symbol, _ in exports)),
        dps_params=",\n    ".join(input_params + [_host_param(d, t) for t in outputs]),
        returns=_return_type(outputs),
        input_params=",\n    ".join(input_params),
        exports=rows,
    )


def _python_module(d: _Def) -> str:
    names = [pyliteral.identifier(t.name) for t in d.defn.inputs + d.defn.outputs]
    # `run` calls the module's `extension()`: a tensor of that name would hide it.
    helper = "extension"
    while helper in names:
        helper = "_" + helper
    inputs = ", ".join(names[: len(d.defn.inputs)])
    return render(
        "cuda_module.py.j2",
        doc_name=pyliteral.docstring_text(d.name),
        name_literal=pyliteral.string(d.name),
        source_literal=pyliteral.string(f"{d.name}.cu"),
        helper=helper,
        inputs=inputs,
        outputs=pyliteral.docstring_text(", ".join(names[len(d.defn.inputs) :])),
        inputs_outputs=", ".join(names),
    )


# ---------------------------------------------------------------------------- emitters


def _shared_headers() -> dict[str, str]:
    return {
        "fibgen_launch.h": render("cuda_launch.h.j2"),
        "fibgen_kernel.h": render("cuda_kernel.h.j2"),
    }


def emit_cuda(module: ir.Module) -> list[GeneratedFile]:
    """``cuda/<name>/`` per definition, and the headers they share in ``cuda/include/``."""
    families = {f.name: f for f in module.families()}
    files = [
        GeneratedFile(f"cuda/include/{path}", with_c_header(text, ""), "")
        for path, text in _shared_headers().items()
    ]
    definitions = sorted(module.definitions, key=lambda x: x.name)
    views = [_view(defn) for defn in definitions]
    modules = format_python([_python_module(d) for d in views], written_in_black_style=True)
    for d, py in zip(views, modules):
        family = families[d.defn.family]
        source = d.defn.source_file
        folder = f"cuda/{d.name}"
        texts = {
            f"{d.name}.cuh": _kernel_header(d, family),
            f"{d.name}.cu": _launcher(d, family),
            "binding.cpp": _binding(d, [("run", False), ("run_dps", True)]),
        }
        files += [
            GeneratedFile(f"{folder}/{path}", with_c_header(text, source), source)
            for path, text in texts.items()
        ]
        files.append(GeneratedFile(f"{folder}/__init__.py", with_python_header(py, source), source))
    return files


def scaffold_sources(
    definition: ir.Definition, family: ir.Family, *, entry: str, dps: bool
) -> dict[str, str]:
    """Sources of a cuda solution (relative path → text); the entry symbol is in ENTRY_FILE.

    ``entry`` is the exported symbol, or ``"<file>::<symbol>"`` to name the binding file.
    The solution's spec takes ``binding: "torch"`` (BINDING).
    """
    entry_file, _, symbol = entry.rpartition("::")
    if not symbol.isidentifier():
        raise CudaGenError(f"entry symbol {symbol!r} is not a C++ identifier")
    d = _view(definition)
    sources = dict(_shared_headers())
    sources[f"{d.name}.cuh"] = _kernel_header(d, family)
    sources[f"{d.name}.cu"] = _launcher(d, family)
    sources[entry_file or ENTRY_FILE] = _binding(d, [(symbol, dps)])
    return sources
