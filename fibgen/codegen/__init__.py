"""Code generation: every artefact of a compiled module, as a list of GeneratedFile."""

from __future__ import annotations

from fibgen.codegen.files import GeneratedFile
from fibgen.compiler import ir

DEFAULT_PACKAGE = "fibgen_kernels"


def generate(module: ir.Module, package: str = DEFAULT_PACKAGE) -> list[GeneratedFile]:
    """Run every emitter over the module."""
    from fibgen.codegen.definition_json import emit_definition_json

    files = list(emit_definition_json(module))
    for emit in _optional_emitters():
        files.extend(emit(module, package))
    return files


def _optional_emitters() -> list:
    # Emitters are registered here as they are added; each takes (module, package).
    emitters = []
    try:
        from fibgen.codegen.python_dispatch import emit_python_dispatch
    except ImportError:
        pass
    else:
        emitters.append(emit_python_dispatch)
    return emitters
