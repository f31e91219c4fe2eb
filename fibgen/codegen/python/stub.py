"""The stub reference of a definition that has none: the exact signature, documented, raising."""

from __future__ import annotations

from fibgen.codegen.python.pyliteral import docstring_text, identifier, string
from fibgen.compiler import ir


def _tensor_line(t: ir.DefTensor) -> str:
    shape = "scalar" if t.shape is None else f"[{', '.join(t.shape)}]"
    extra = " (optional)" if t.optional else ""
    desc = f": {t.description}" if t.description else ""
    return "        " + docstring_text(f"{t.name}: {t.dtype}{shape}{extra}{desc}")


def stub_reference(defn: ir.Definition) -> str:
    """Python source of a `run` with the definition's signature that raises NotImplementedError.

    Descriptions and constraints are the definition's text: each goes into the docstring
    through `docstring_text`, so none can end the docstring or add a line of code.
    """
    title = docstring_text(f"Reference for {defn.name} (not written yet).")
    lines = [f'    """{title}', "", "    Inputs:"]
    lines += [_tensor_line(t) for t in defn.inputs]
    lines += ["", "    Outputs:"]
    lines += [_tensor_line(t) for t in defn.outputs]
    if defn.constraints:
        lines += ["", "    Constraints:"]
        lines += ["        " + docstring_text(c) for c in defn.constraints]
    lines.append('    """')
    params = ", ".join(identifier(t.name) for t in defn.inputs)
    body = "\n".join(lines)
    return (
        f"def run({params}):\n{body}\n"
        f"    raise NotImplementedError({string(defn.name + ' has no reference yet')})"
    )


def reference_text(defn: ir.Definition) -> str:
    """The definition's reference, or its stub."""
    return defn.reference if defn.reference is not None else stub_reference(defn)
