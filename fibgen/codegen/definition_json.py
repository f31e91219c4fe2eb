"""The JSON target: one FlashInfer Trace definition file per definition instance."""

from __future__ import annotations

from fibgen.codegen.files import GeneratedFile
from fibgen.codegen.python.stub import reference_text
from fibgen.compiler import ir


def definition_dict(defn: ir.Definition) -> dict:
    """The definition as a JSON-ready dict (validated by the format model on emission)."""

    def tensor(t: ir.DefTensor) -> dict:
        out: dict = {"shape": None if t.shape is None else list(t.shape), "dtype": t.dtype}
        if t.description is not None:
            out["description"] = t.description
        if t.optional:
            out["optional"] = True
        return out

    axes: dict = {}
    for ax in defn.axes:
        entry: dict = {"type": ax.kind}
        if ax.kind == "const":
            entry["value"] = ax.value
        if ax.description is not None:
            entry["description"] = ax.description
        axes[ax.name] = entry
    out: dict = {"name": defn.name}
    if defn.description is not None:
        out["description"] = defn.description
    return out | {
        "op_type": defn.op_type,
        "tags": list(defn.tags),
        "axes": axes,
        "constraints": list(defn.constraints),
        "inputs": {t.name: tensor(t) for t in defn.inputs},
        "outputs": {t.name: tensor(t) for t in defn.outputs},
        "reference": reference_text(defn),
    }


def emit_definition_json(module: ir.Module) -> list[GeneratedFile]:
    """One `definitions/<op_type>/<name>.json` per definition, in canonical form.

    The compiler has checked everything flashinfer-bench's model checks, so the dict is
    dumped as it is, in the format's key order; a test holds every generated file to the
    model (it loads and re-dumps to the same bytes).
    """
    from fibgen.format.jsonio import dump_json_file

    return [
        GeneratedFile(
            path=f"definitions/{defn.op_type}/{defn.name}.json",
            text=dump_json_file(definition_dict(defn)),
            source=defn.source_file,
        )
        for defn in sorted(module.definitions, key=lambda d: d.name)
    ]
