"""The reference target: one standalone module per definition with the definition's `run`.

The module imports nothing from fibgen. The reference text is kept as written (it is not
reformatted: it is the definition's contract); definitions without a reference get a stub
with the exact signature that documents every tensor and raises NotImplementedError.
"""

from __future__ import annotations

from fibgen.codegen.files import GeneratedFile, with_python_header
from fibgen.codegen.python.pyliteral import docstring_text
from fibgen.codegen.python.stub import reference_text
from fibgen.compiler import ir


def reference_path(defn: ir.Definition) -> str:
    """Where the reference module of a definition is written, relative to the output."""
    return f"reference/{defn.op_type}/{defn.name}.py"


def emit_reference_modules(module: ir.Module, package: str) -> list[GeneratedFile]:
    """One `reference/<op_type>/<name>.py` per definition."""
    files = []
    for defn in sorted(module.definitions, key=lambda d: d.name):
        doc = f"Reference implementation of {docstring_text(defn.name)}."
        body = f'"""{doc}"""\n\n' + reference_text(defn)
        if not body.endswith("\n"):
            body += "\n"
        files.append(
            GeneratedFile(
                reference_path(defn), with_python_header(body, defn.source_file), defn.source_file
            )
        )
    return files
