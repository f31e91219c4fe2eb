"""The stub reference of a definition that has none: the exact signature, documented, raising."""

from __future__ import annotations

from fibgen.compiler import ir


def _tensor_line(t: ir.DefTensor) -> str:
    shape = "scalar" if t.shape is None else f"[{', '.join(t.shape)}]"
    extra = " (optional)" if t.optional else ""
    desc = f": {t.description}" if t.description else ""
    return f"        {t.name}: {t.dtype}{shape}{extra}{desc}"


def stub_reference(defn: ir.Definition) -> str:
    """Python source of a `run` with the definition's signature that raises NotImplementedError."""
    lines = [f'    """Reference for {defn.name} (not written yet).', "", "    Inputs:"]
    lines += [_tensor_line(t) for t in defn.inputs]
    lines += ["", "    Outputs:"]
    lines += [_tensor_line(t) for t in defn.outputs]
    if defn.constraints:
        lines += ["", "    Constraints:"]
        lines += [f"        {c}" for c in defn.constraints]
    lines.append('    """')
    params = ", ".join(t.name for t in defn.inputs)
    body = "\n".join(lines)
    return (
        f"def run({params}):\n{body}\n"
        f"    raise NotImplementedError({defn.name + ' has no reference yet'!r})"
    )


def reference_text(defn: ir.Definition) -> str:
    """The definition's reference, or its stub."""
    return defn.reference if defn.reference is not None else stub_reference(defn)
