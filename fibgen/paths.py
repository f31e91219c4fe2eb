"""Where fibgen's data files live: the checkout, or the installed wheel.

The wheel ships, inside the package as ``fibgen/data/<folder>``: the grammar, the templates,
the built-in catalogue's ``.fidef`` sources (``definitions``) and its built definitions
(``catalogue/definitions/<op_type>/<name>.json`` with their ``.fibgen`` sidecars, the
committed ``generated/definitions`` of the checkout). So ``pip install fibgen`` alone, in a
folder of one's own, scaffolds, makes workloads for and benchmarks the built-in definitions.
"""

from __future__ import annotations

import glob
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent

# Where each data folder is in a checkout; installed, it is fibgen/data/<name>.
_IN_CHECKOUT = {
    "grammars": "grammars",
    "templates": "templates",
    "definitions": "definitions",
    "catalogue": "generated",
}


def _is_checkout() -> bool:
    # An installed fibgen sits in site-packages, where a folder called `definitions` or
    # `generated` could belong to anything; a checkout has fibgen's own pyproject beside it.
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "grammars").is_dir()


def _find(folder: str) -> Path:
    if _is_checkout():
        local = _CHECKOUT / _IN_CHECKOUT[folder]
        if local.is_dir():
            return local
    # Installed from a wheel: the folders are shipped inside the package.
    return _PACKAGE / "data" / folder


@lru_cache(maxsize=None)
def grammars_dir() -> Path:
    """The folder holding fidef.lark."""
    return _find("grammars")


@lru_cache(maxsize=None)
def templates_dir() -> Path:
    """The folder holding the Jinja templates."""
    return _find("templates")


@lru_cache(maxsize=None)
def definitions_dir() -> Path:
    """The built-in catalogue's ``.fidef`` sources (the default of ``--definitions``)."""
    return _find("definitions")


@lru_cache(maxsize=None)
def catalogue_root() -> Path:
    """A dataset root whose ``definitions/`` holds the built-in definitions and sidecars."""
    return _find("catalogue")


def builtin_definition_file(name: str) -> Path | None:
    """The built-in definition JSON called ``name``, or None when the catalogue has none."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    found = sorted((catalogue_root() / "definitions").glob(f"*/{glob.escape(name)}.json"))
    return found[0] if found else None


@lru_cache(maxsize=None)
def builtin_definition_names() -> frozenset[str]:
    """The names of the built-in definitions (listed once per process)."""
    return frozenset(p.stem for p in (catalogue_root() / "definitions").glob("*/*.json"))
