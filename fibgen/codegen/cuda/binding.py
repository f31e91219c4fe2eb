"""How a definition's CUDA code is called from Python: ``binding.cpp`` and ``__init__.py``."""

from __future__ import annotations

from fibgen.codegen.cuda import cppliteral
from fibgen.codegen.cuda.launcher import host_param, return_type
from fibgen.codegen.cuda.view import Def
from fibgen.codegen.python import pyliteral
from fibgen.codegen.templates import render
from fibgen.compiler import ir


def _py_args(tensors: tuple[ir.DefTensor, ...]) -> str:
    return ", ".join(f"pybind11::arg({cppliteral.string(t.name)})" for t in tensors)


def binding_source(d: Def, exports: list[tuple[str, bool]]) -> str:
    """``exports``: (symbol, destination-passing) pairs, each bound to run or run_dps."""
    inputs, outputs = d.defn.inputs, d.defn.outputs
    input_params = [host_param(d, t) for t in inputs]
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
        dps_params=",\n    ".join(input_params + [host_param(d, t) for t in outputs]),
        returns=return_type(outputs),
        input_params=",\n    ".join(input_params),
        exports=rows,
    )


def python_module(d: Def) -> str:
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
