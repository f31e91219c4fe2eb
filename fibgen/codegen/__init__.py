"""Code generation: every artefact of a compiled module, as a list of GeneratedFile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fibgen.codegen.files import GeneratedFile

if TYPE_CHECKING:  # keeps `import fibgen.codegen.writer` (the no-op build path) light
    from fibgen.compiler import ir

DEFAULT_PACKAGE = "fibgen_kernels"


def generate(module: ir.Module, package: str = DEFAULT_PACKAGE) -> list[GeneratedFile]:
    """Run every emitter over the module; each returns its files, the writer writes them."""
    import warnings

    from fibgen.codegen.cuda.emit import emit_cuda
    from fibgen.codegen.definition_json import emit_definition_json
    from fibgen.codegen.python.bench_extras import emit_bench_extras
    from fibgen.codegen.python.dispatch.emit import emit_python_dispatch
    from fibgen.codegen.python.reference import emit_reference_modules
    from fibgen.codegen.python.tests_target import emit_tests

    with warnings.catch_warnings():
        # Emitters parse expressions the compiler has already parsed: Python's warnings about
        # them ("invalid decimal literal" for `1if x else 2`), without a position, are noise.
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        files = list(emit_definition_json(module))
        files.extend(emit_bench_extras(module))
        files.extend(emit_reference_modules(module, package))
        files.extend(emit_python_dispatch(module, package))
        files.extend(emit_tests(module, package))
        files.extend(emit_cuda(module))
    return files
