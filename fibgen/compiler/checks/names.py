"""What a family, dispatch group or definition may be called, given what its name becomes.

Note [generated names]
A name that the file-name rule of the format lets by (Note [safe names]) may still break the
code generated from it, far from the `.fidef` that chose it:

- a family or dispatch group becomes a module of the dispatcher package and a function in
  it: `family import` would generate `def import(...)`; `family __init__` would replace the
  package's own `__init__.py`; `family register_api` would shadow the runtime function its
  module calls at import. So its name is a Python identifier that is no keyword, does not
  start with `_` (the module's private names), and is none of the names a generated module
  or the package's `__init__.py` defines (MODULE_NAMES; `tests/test_compiler.py` holds the
  generated modules to that list).
- a definition becomes an op `torch.ops.<package>.<name>`, whose schema parser takes
  identifiers only and refuses Python's keywords and `NoneType`: `rmsnorm-h4096` and
  `rms.norm` build, then fail at import. It also becomes the folder `cuda/<name>/`, beside
  the shared `cuda/include/`, so `include` is taken.

The compiler checks these at the source position; the format's rule still decides which
names a dataset may hold, since its JSON never becomes a dispatcher.
"""

from __future__ import annotations

import keyword
import re

from fibgen.compiler.rules import RULE_HELPERS

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The names a generated dispatcher module or the package's __init__.py defines or imports.
MODULE_NAMES = frozenset(
    {
        "torch",
        "math",
        "ApiDefault",
        "INPLACE",
        "ORIGINAL",
        "RETURNS",
        "SERVING",
        "register_api",
        "register_package",
        "APIS",
        "DEFINITIONS",
        *RULE_HELPERS,
    }
)

# Words torch's op schema parser refuses as an op name, besides Python's keywords.
_TORCH_WORDS = frozenset({"NoneType"})

# Folders of generated/cuda/ that are not a definition's.
_CUDA_FOLDERS = frozenset({"include"})


def module_name_problem(name: str) -> str | None:
    """Why a family or dispatch group cannot be called ``name`` (Note [generated names])."""
    if not _IDENTIFIER.fullmatch(name):
        return "is not a Python identifier"
    if keyword.iskeyword(name):
        return "is a Python keyword"
    if name.startswith("__") and name.endswith("__"):
        return f"is a special name of Python: `{name}.py` would be the package's own module"
    if name.startswith("_"):
        return "starts with '_', as the private names of a generated module do"
    if name in MODULE_NAMES:
        return "is a name every generated dispatcher module already uses"
    return None


def definition_name_problem(name: str) -> tuple[str, str] | None:
    """Why a definition cannot be called ``name`` (Note [generated names]), with what to do;
    the format's rule (``name_problem``) is checked first."""
    if not _IDENTIFIER.fullmatch(name):
        bad = next((ch for ch in name if not (ch.isascii() and (ch.isalnum() or ch == "_"))), None)
        if bad is not None:
            return f"contains {bad!r}, which a torch op name cannot hold", _OP_NAME_HELP
        return "starts with a digit, which a torch op name cannot", _OP_NAME_HELP
    if keyword.iskeyword(name) or name in _TORCH_WORDS:
        return "is a word that torch's op schema reserves", _OP_NAME_HELP
    if name in _CUDA_FOLDERS:
        return (
            f"is taken: generated/cuda/{name}/ holds what every CUDA target shares",
            "rename the family, or give it a name template",
        )
    return None


_OP_NAME_HELP = (
    "a definition is registered as the torch op torch.ops.<package>.<name>: its name is "
    "letters, digits and '_', not starting with a digit, and no Python keyword"
)
