"""CUDA target: ``cuda/<name>/`` per definition, and the sources of a cuda solution scaffold.

Per definition: ``<name>.cuh`` (framework-agnostic kernel and host launch over plain pointers
and sizes), ``<name>.cu`` (the launcher: checks every tensor against the definition, then
dispatches on dtype and launches on the current stream), ``binding.cpp`` (exports ``run`` and
``run_dps`` through torch's C++ extension API) and ``__init__.py`` (builds on first use and
exposes the definition's signature). What every definition shares lives once in
``cuda/include/``: the torch-side checks (``fibgen_launch.h``) and device helpers
(``fibgen_kernel.h``), so each definition's folder holds only what is its own.

The kernel header is written in ``cuda_kernel.py`` (Note [naive kernels]), the launcher in
``cuda_launcher.py``, ``binding.cpp`` and ``__init__.py`` in ``cuda_binding.py``, from the view
of each definition that ``cuda_view.py`` makes.
"""

from __future__ import annotations

from typing import Final

from fibgen.codegen.cuda.binding import binding_source, python_module
from fibgen.codegen.cuda.kernel import kernel_header
from fibgen.codegen.cuda.launcher import launcher_source
from fibgen.codegen.cuda.view import CudaGenError, definition_view
from fibgen.codegen.files import GeneratedFile, with_c_header, with_python_header
from fibgen.codegen.python.pyformat import format_python
from fibgen.codegen.templates import render
from fibgen.compiler import ir

# The binding every generated and scaffolded CUDA source is written for (see the README).
BINDING: Final = "torch"
# The file of a cuda scaffold that exports the entry symbol.
ENTRY_FILE = "binding.cpp"


# ---------------------------------------------------------------------------- emitters


def _shared_headers() -> dict[str, tuple[str, str]]:
    # The same for every build: made from fibgen's templates, not from a .fidef.
    templates = {"fibgen_launch.h": "cuda_launch.h.j2", "fibgen_kernel.h": "cuda_kernel.h.j2"}
    return {path: (template, render(template)) for path, template in templates.items()}


def emit_cuda(module: ir.Module) -> list[GeneratedFile]:
    """``cuda/<name>/`` per definition, and the headers they share in ``cuda/include/``."""
    families = {f.name: f for f in module.families()}
    files = [
        GeneratedFile(f"cuda/include/{path}", with_c_header(text, f"template {template}"), "")
        for path, (template, text) in _shared_headers().items()
    ]
    definitions = sorted(module.definitions, key=lambda x: x.name)
    views = [definition_view(defn) for defn in definitions]
    modules = format_python([python_module(d) for d in views], written_in_black_style=True)
    for d, py in zip(views, modules):
        family = families[d.defn.family]
        source = d.defn.source_file
        folder = f"cuda/{d.name}"
        texts = {
            f"{d.name}.cuh": kernel_header(d, family),
            f"{d.name}.cu": launcher_source(d, family),
            "binding.cpp": binding_source(d, [("run", False), ("run_dps", True)]),
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
    d = definition_view(definition)
    sources = {path: text for path, (_, text) in _shared_headers().items()}
    sources[f"{d.name}.cuh"] = kernel_header(d, family)
    sources[f"{d.name}.cu"] = launcher_source(d, family)
    sources[entry_file or ENTRY_FILE] = binding_source(d, [(symbol, dps)])
    return sources
