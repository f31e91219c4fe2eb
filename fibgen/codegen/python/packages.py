"""The Python package that `fibgen build` writes the dispatchers into: its default name, and
the names it may not take.

Note [package names]
~~~~~~~~~~~~~~~~~~~~
The built-in catalogue's dispatchers are the package ``fibgen_kernels``: the wheel ships it,
and the runtime imports it on ``enable_apply`` (``DEFAULT_PACKAGES``). A build of a folder of
one's own under the same name would stand in for the catalogue's package wherever its folder
comes first on ``sys.path``, and take every catalogue dispatcher away with it. So only the
catalogue gets ``fibgen_kernels`` by default; another folder gets a name of its own, from the
folder's name (``my_defs/`` → ``my_defs_kernels``: not ``my_defs``, which is the folder of
``.fidef`` files itself, and would be imported as an empty namespace package from where it
lies). ``--package`` names it otherwise. A name that is not a Python identifier, is a
keyword, or would hide a module that generated code or Python needs (``fibgen``, ``torch``,
``json``) is refused.
"""

from __future__ import annotations

import keyword
import re
import sys
from collections.abc import Iterable
from pathlib import Path

CATALOGUE_PACKAGE = "fibgen_kernels"

# What generated code imports besides the standard library: a package of that name would
# shadow it.
_TAKEN = ("fibgen", "torch", "triton", "flashinfer", "numpy", "tvm_ffi")


def package_problem(name: str) -> str | None:
    """Why ``name`` cannot be the package of generated dispatchers, or None."""
    if not name.isidentifier():
        return "is not a Python identifier (letters, digits and '_', not starting with a digit)"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())  # Python 3.10+
    if name in _TAKEN or name in stdlib or name in sys.builtin_module_names:
        return f"would hide the module `{name}` that Python or the generated code imports"
    return None


def default_package(paths: Iterable[str]) -> str:
    """The package name of a build of ``paths`` (Note [package names])."""
    from fibgen.paths import definitions_dir

    resolved = [Path(p).resolve() for p in paths]
    if resolved and all(p == definitions_dir().resolve() for p in resolved):
        return CATALOGUE_PACKAGE
    first = resolved[0] if resolved else Path.cwd()
    stem = first.stem if first.is_file() else first.name
    stem = re.sub(r"\W+", "_", stem).strip("_")
    if not stem or stem[0].isdigit():
        stem = f"fidef_{stem}".rstrip("_")
    return f"{stem}_kernels"
